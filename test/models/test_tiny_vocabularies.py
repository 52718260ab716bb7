"""The tiny families' vocabularies (models/tiny_vocabularies.py): every word an answer needs is one token."""

import pytest

from metavlm_ros.common.errors import ModelError
from metavlm_ros.models.tiny_vocabularies import REQUIRED_WORDS, byte_level_tokenizer, check_vocabulary


def test_a_byte_level_vocabulary_spells_every_required_word_as_one_token():
    from transformers import GPT2Tokenizer

    tokenizer = byte_level_tokenizer(GPT2Tokenizer, ['<image>'], eos_token='<|endoftext|>')
    for word in REQUIRED_WORDS:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
        assert len(tokenizer.encode(' ' + word, add_special_tokens=False)) == 1, word
    check_vocabulary(tokenizer)
    # The same corpus gives the same vocabulary, token for token.
    again = byte_level_tokenizer(GPT2Tokenizer, ['<image>'], eos_token='<|endoftext|>')
    assert again.get_vocab() == tokenizer.get_vocab()


def test_a_vocabulary_that_splits_a_required_word_is_refused_naming_it():
    from tokenizers import pre_tokenizers
    from transformers import GPT2Tokenizer

    letters = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    bare = GPT2Tokenizer(vocab=letters, merges=[])
    with pytest.raises(ModelError, match="tiny tokenizer splits 'yes'"):
        check_vocabulary(bare)
