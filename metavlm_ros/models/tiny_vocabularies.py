"""Tiny vocabularies and chat templates for the tiny VLM families (models/tiny_families.py), built
offline: every word a count, JSON or yes/no answer needs is one token."""

from __future__ import annotations

import re
from typing import Any

from metavlm_ros.common.errors import ModelError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.tiny import corpus

__all__ = [
    'REQUIRED_WORDS',
    'GEMMA3_TEMPLATE',
    'IDEFICS3_TEMPLATE',
    'LLAVA_ONEVISION_TEMPLATE',
    'LLAVA_TEMPLATE',
    'PALIGEMMA_TEMPLATE',
    'QWEN2_VL_TEMPLATE',
    'QWEN3_VL_TEMPLATE',
    'byte_level_tokenizer',
    'check_vocabulary',
    'metaspace_tokenizer',
]

#: Words every tiny vocabulary holds as single tokens (bare and after a space), so yes/no answers,
#: JSON count answers and class names are representable by one token each.
REQUIRED_WORDS = ('yes', 'no', 'Yes', 'No', *CLASSES, *'0123456789', '{', '}', '"', ':', ',')

# -- chat templates ------------------------------------------------------------------------------
# Each follows its family's released template's message layout (markers, where images go, the
# generation prompt); written here so nothing is downloaded. Content is a list of {'type': ...}
# parts as transformers' processors expect; a plain string content is accepted too.

# One chat turn of the Qwen families: the image as vision markers around its pad token, then the text.
_QWEN_TURN = (
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    '<|vision_start|><|image_pad|><|vision_end|>'
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    '{% endfor %}<|im_end|>\n{% endif %}'
)
_QWEN_GENERATION_PROMPT = '{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'

QWEN2_VL_TEMPLATE = (
    '{% for message in messages %}'
    "{% if loop.first and message['role'] != 'system' %}"
    '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}'
    + _QWEN_TURN
    + '{% endfor %}'
    + _QWEN_GENERATION_PROMPT
)

# Qwen3-VL: Qwen2-VL's turns and vision markers, without a default system turn.
QWEN3_VL_TEMPLATE = '{% for message in messages %}' + _QWEN_TURN + '{% endfor %}' + _QWEN_GENERATION_PROMPT

# SmolVLM (Idefics3 + SmolLM2): 'User:<image>question<end_of_utterance>\nAssistant:'.
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# PaliGemma has no chat turns: its prompt is a prefix, the image tokens then the task text. The
# processor itself inserts <bos> after the image tokens and the '\n' that separates prefix from
# answer, so this template renders images first, then the user's text, and nothing else.
PALIGEMMA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}"
    '{% endif %}{% endfor %}{% endif %}{% endif %}{% endfor %}'
)

# llava-hf/llava-1.5: 'USER: <image>\nquestion ASSISTANT:'.
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}"
    "{% endif %}{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
    "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# llava-hf/llava-onevision (Qwen2 chat markers): '<|im_start|>user <image>\nquestion<|im_end|>\n'.
LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
    "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 3: '<bos><start_of_turn>user\n<start_of_image>question<end_of_turn>\n<start_of_turn>model\n';
# a system message is folded into the first user turn, as the released template does.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% if messages[0]['content'] is string %}{% set first = messages[0]['content'] + '\n\n' %}"
    "{% else %}{% set first = messages[0]['content'][0]['text'] + '\n\n' %}{% endif %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first = '' %}{% set loop_messages = messages %}"
    '{% endif %}{% for message in loop_messages %}'
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


# -- tokenizers ----------------------------------------------------------------------------------
def sentences() -> list[str]:
    """The count corpus of tiny.py plus yes/no questions, JSON answers and chat role words."""
    sentences = list(corpus())
    sentences += [
        'yes no Yes No yes. no. Yes. No. Yes, No, yes, no,',
        'Answer yes or no. Answer: yes Answer: no',
        *(
            f'Is there {"an" if c[0] in "aeiou" else "a"} {c} in this image? Answer yes or no.'
            for c in CLASSES
        ),
        '{"animal": 2, "vegetation": 0, "object": 1, "trash": 3}',
        '{ } " : , 0 1 2 3 4 5 6 7 8 9 10',
        'Answer only with JSON: {"animal": <number>, "vegetation": <number>, "object": <number>, '
        '"trash": <number>}',
        'animal vegetation object trash animals objects',
        'You are a helpful assistant. user assistant system model User Assistant USER ASSISTANT',
    ]
    return sentences


def pieces(tokenizer: Any, sentences: list[str]) -> list[str]:
    """Distinct pre-tokens of `sentences` as the tokenizer's own normaliser and pre-tokeniser make them."""
    backend = tokenizer.backend_tokenizer
    pieces: set[str] = set()
    for sentence in [*sentences, *(' ' + w for w in REQUIRED_WORDS), *REQUIRED_WORDS]:
        if backend.normalizer is not None:
            sentence = backend.normalizer.normalize_str(sentence)
        if backend.pre_tokenizer is None:
            pieces.add(sentence)
        else:
            pieces.update(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(sentence))
    return sorted(p for p in pieces if p)


def merges_spelling(words: list[str], alphabet: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE vocabulary and merges under which every word is one token, built deterministically.

    tiny.py's left-to-right merge chains can split a word: 'yes' becomes 'y' + 'es' when a merge
    ('e', 's') from an earlier word outranks ('y', 'e'). Here each word is encoded with the merges so
    far (lowest rank first, leftmost on ties, as the tokenizers library does) and, while it is still
    in pieces, a merge of its first two pieces is appended. An appended merge has the highest rank, so
    it never changes how an earlier word is encoded (that word became one token without it).
    """
    vocab: dict[str, int] = {}
    for symbol in alphabet:
        vocab.setdefault(symbol, len(vocab))
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}
    for word in sorted(words, key=lambda w: (len(w), w)):
        symbols = list(word)
        for symbol in symbols:
            vocab.setdefault(symbol, len(vocab))
        while len(symbols) > 1:
            ranked = [
                (ranks.get(pair, len(ranks)), i)
                for i, pair in enumerate(zip(symbols, symbols[1:], strict=False))
            ]
            rank, i = min(ranked)
            if rank == len(ranks):  # no known merge applies: teach one
                pair = (symbols[0], symbols[1])
                ranks[pair] = len(merges)
                merges.append(pair)
                vocab.setdefault(pair[0] + pair[1], len(vocab))
                i = 0
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return vocab, merges


def byte_level_tokenizer(cls: Any, specials: list[str], **kwargs: Any) -> Any:
    """A byte-level BPE tokenizer of class `cls` (GPT-2 / Qwen2 style) spelling the corpus's words."""
    from tokenizers import pre_tokenizers

    words = pieces(cls(vocab={'<|endoftext|>': 0}, merges=[]), sentences())
    vocab, merges = merges_spelling(words, sorted(pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = cls(vocab=vocab, merges=merges, **kwargs)
    tokenizer.add_special_tokens({'additional_special_tokens': specials})
    return tokenizer


def metaspace_tokenizer(cls: Any, base: list[str], specials: list[str], **kwargs: Any) -> Any:
    """A SentencePiece-style BPE tokenizer of class `cls` (Llama / Gemma) with byte fallback."""
    # SentencePiece does not pre-tokenise; its pieces are words with or without the '▁' that marks a
    # preceding space, and their punctuation-separated parts ('{"animal":' and 'animal', '{', ':').
    words: set[str] = set()
    for sentence in [*sentences(), ' '.join(REQUIRED_WORDS)]:
        for word in sentence.split():
            for part in {word, *re.findall(r'\w+|[^\w\s]+', word)}:
                words.update((part, '\u2581' + part))
    words = sorted(words)
    chars = sorted({c for w in words for c in w})
    alphabet = [*base, *(f'<0x{byte:02X}>' for byte in range(256)), *chars]
    vocab, merges = merges_spelling(words, alphabet)
    tokenizer = cls(vocab=vocab, merges=merges, **kwargs)
    tokenizer.add_special_tokens({'additional_special_tokens': specials})
    return tokenizer


def check_vocabulary(tokenizer: Any) -> None:
    """Every required word must be one token, bare and after a space; a builder bug otherwise."""
    for word in REQUIRED_WORDS:
        for text in (word, ' ' + word):
            ids = tokenizer.encode(text, add_special_tokens=False)
            # Qwen2 and Gemma split digits from everything, a preceding space included, as released.
            if len(ids) != 1 and not (word.isdigit() and text.startswith(' ')):
                raise ModelError(
                    f'tiny tokenizer splits {text!r} into {tokenizer.convert_ids_to_tokens(ids)}'
                )
