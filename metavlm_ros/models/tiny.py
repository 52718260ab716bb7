"""Tiny random-initialised models, built offline for tests and benchmarks: the shapes and tokenizers the
backends' own builders (`build_tiny`) share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import DEFAULT_VOCABULARIES, NUMBER_WORDS
from metavlm_ros.models.questions import DEFAULT_CLASS_PROMPTS, TABLE1_PROMPT
from metavlm_ros.models.registry import backend_class

__all__ = [
    'TINY_IMAGE_SIZE',
    'bert_tokenizer',
    'build_base_model',
    'build_tiny_model',
    'clip_tokenizer',
    'corpus',
    'llama_tokenizer',
    't5_tokenizer',
]

#: Side of the square image the tiny models see; frames of any size are resized to it by the processor.
TINY_IMAGE_SIZE = 32

# Shared transformer shape: small enough that building, saving and loading take well under a second.
HIDDEN = 32
HEADS = 2
INTERMEDIATE = 64
PATCH = 8

# CLIP's normalisation constants, so the tiny processors behave like the real ones.
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def corpus() -> list[str]:
    """Sentences the tiny vocabularies are built from: prompts, Table 1 answers and the count vocabulary."""
    sentences = [TABLE1_PROMPT, *DEFAULT_CLASS_PROMPTS.values()]
    sentences.append(' '.join(NUMBER_WORDS))
    sentences.append(' '.join(str(n) for n in range(21)))
    for cls in CLASSES:
        sentences.append(' '.join(DEFAULT_VOCABULARIES[cls]))
    sentences += [
        'Animals: 2 fish, 1 crab Vegetation: None Objects: 1 pipe Trash: 3 bottles',
        'Animals: None Vegetation: 4 seaweed Objects: None Trash: 1 plastic bag, 2 cans',
        'Animals: one starfish Vegetation: kelp Objects: 2 ropes, an anchor Trash: no',
        'two fish swimming near a plastic bottle on the sea floor',
        'a rov part and a tyre lying on sand with seagrass and a jellyfish',
        'How many animals, plants, objects and pieces of trash are in the picture?',
    ]
    return sentences


def _words(tokenizer) -> list[str]:
    """The corpus's distinct words as the tokenizer's own normaliser and pre-tokeniser split them."""
    backend = tokenizer.backend_tokenizer
    words: set[str] = set()
    for sentence in corpus():
        if backend.normalizer is not None:
            sentence = backend.normalizer.normalize_str(sentence)
        words.update(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(sentence))
    return sorted(words)


def _bpe(
    words: list[str], alphabet: list[str], suffix: str = ''
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE vocabulary and merges that spell every corpus word, built deterministically.

    A trainer breaks ties between equally frequent pairs in an unspecified order; merging each word's
    symbols left to right, words in sorted order, gives the same tokenizer on every run.
    """
    vocab: dict[str, int] = {}
    for symbol in alphabet:
        vocab.setdefault(symbol, len(vocab))
    merges: list[tuple[str, str]] = []
    known: set[tuple[str, str]] = set()
    for word in words:
        symbols = list(word)
        symbols[-1] += suffix
        current = symbols[0]
        for symbol in symbols[1:]:
            vocab.setdefault(symbol, len(vocab))
            if (current, symbol) not in known:
                known.add((current, symbol))
                merges.append((current, symbol))
            current += symbol
            vocab.setdefault(current, len(vocab))
    return vocab, merges


def clip_tokenizer():
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # Every byte may end a word, so each also exists with CLIP's end-of-word suffix.
    symbols = ['<|startoftext|>', '<|endoftext|>', *alphabet, *(c + '</w>' for c in alphabet)]
    vocab, merges = _bpe(_words(CLIPTokenizerFast()), symbols, suffix='</w>')
    return CLIPTokenizerFast(vocab=vocab, merges=merges, model_max_length=77)


def bert_tokenizer():
    from transformers import BertTokenizerFast

    words = _words(BertTokenizerFast())
    chars = sorted({c for w in words for c in w})
    tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', *chars, *('##' + c for c in chars), *words]
    vocab: dict[str, int] = {}
    for token in tokens:
        vocab.setdefault(token, len(vocab))
    # BLIP's text decoder starts generation from a dedicated [DEC] token, as the released models do.
    tokenizer = BertTokenizerFast(vocab=vocab, model_max_length=512)
    tokenizer.add_special_tokens({'bos_token': '[DEC]'})
    return tokenizer


def llama_tokenizer():
    from transformers import LlamaTokenizerFast

    # SentencePiece-style pieces: one per whitespace-separated word, marked by its leading '▁'.
    words = sorted({'\u2581' + word for sentence in corpus() for word in sentence.split()})
    chars = sorted({c for w in words for c in w})
    # Byte fallback tokens let any text round-trip, as in the released Vicuna/LLaMA vocabularies.
    symbols = ['<unk>', '<s>', '</s>', *(f'<0x{byte:02X}>' for byte in range(256)), *chars]
    vocab, merges = _bpe(words, symbols)
    tokenizer = LlamaTokenizerFast(vocab=vocab, merges=merges, model_max_length=512)
    tokenizer.pad_token = '<unk>'
    return tokenizer


def t5_tokenizer():
    from transformers import T5TokenizerFast

    # Unigram pieces: whole words score above single characters, so a corpus word stays one piece.
    words = sorted({'\u2581' + word for sentence in corpus() for word in sentence.split()})
    chars = sorted({c for w in words for c in w})
    pieces = [('<pad>', 0.0), ('</s>', 0.0), ('<unk>', 0.0)]
    pieces += [(c, -10.0) for c in chars] + [(w, -1.0) for w in words]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def vision_shape(prefix_layers: int = 1) -> dict:
    """The tiny vision tower's config values (ViT: hidden width, layers, heads, image and patch size)."""
    return {
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': prefix_layers,
        'num_attention_heads': HEADS,
        'image_size': TINY_IMAGE_SIZE,
        'patch_size': PATCH,
    }


def text_shape() -> dict:
    """The tiny text transformer's width, depth and heads."""
    return {
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
    }


def blip_text(tokenizer, **values) -> dict:
    """A BLIP text-decoder config over `tokenizer`, generation starting from its [DEC] token."""
    return {
        'vocab_size': len(tokenizer),
        'bos_token_id': tokenizer.bos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
        'sep_token_id': tokenizer.sep_token_id,
        'eos_token_id': tokenizer.sep_token_id,
        **values,
    }


def blip_image_processor():
    """BLIP's image processor at the tiny size (a fixed square resize, CLIP's normalisation)."""
    from transformers import BlipImageProcessor

    return BlipImageProcessor(
        size={'height': TINY_IMAGE_SIZE, 'width': TINY_IMAGE_SIZE}, image_mean=MEAN, image_std=STD
    )


def language_model(name: str, tokenizer) -> dict:
    """A language model's config: decoder-only like Vicuna ('llama'), encoder-decoder like Flan-T5 ('t5')."""
    if name == 't5':
        return {
            'model_type': 't5',
            'vocab_size': len(tokenizer),
            'd_model': HIDDEN,
            'd_kv': HIDDEN // HEADS,
            'd_ff': INTERMEDIATE,
            'num_layers': 1,
            'num_decoder_layers': 1,
            'num_heads': HEADS,
            'eos_token_id': tokenizer.eos_token_id,
            'pad_token_id': tokenizer.pad_token_id,
            'decoder_start_token_id': tokenizer.pad_token_id,
            # Flan-T5 is T5 v1.1: gated GELU and an output head of its own.
            'feed_forward_proj': 'gated-gelu',
            'tie_word_embeddings': False,
        }
    return {
        'model_type': 'llama',
        'vocab_size': len(tokenizer),
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
        'num_key_value_heads': HEADS,
        'max_position_embeddings': 512,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
    }


def build_tiny_model(backend: str, directory: Path | str, seed: int = 0, **variant: Any) -> Path:
    """Build, randomly initialise and save a tiny model of a registered backend.

    The saved directory loads through `create_backend(backend, directory)` exactly like a released
    model: a config, safetensors weights, a tokenizer built from the prompts and the count vocabulary,
    and a processor. Each backend's module builds its own (`build_tiny`).

    Args:
        backend: a registered backend name.
        directory: where to save; created when missing.
        seed: seed of the weight initialisation; the same seed gives the same weights.
        **variant: what the backend's builder takes besides (InstructBLIP: language_model 'llama' or
            't5'; vlm: family).

    Returns:
        The directory, as a Path.

    Raises:
        ModelError: the backend is unknown.
        ParameterError: a variant the builder refuses.
    """
    return _build(backend_class(backend).build_tiny, directory, seed, **variant)


def build_base_model(backend: str, directory: Path | str, seed: int = 0) -> Path:
    """Build and save a random-initialised model of a released base model's shape, for benchmarks.

    Timing does not depend on the weights; each backend's `build_base` says which model's shape it
    builds (CLIP: openai/clip-vit-base-patch32, about 151 M parameters; BLIP:
    Salesforce/blip-image-captioning-base).

    Raises:
        ModelError: a backend without a base-shape builder.
    """
    builder = getattr(backend_class(backend), 'build_base', None)
    if builder is None:
        raise ModelError(f'no base-shape model is built for backend {backend!r}')
    return _build(builder, directory, seed)


def _build(builder: Any, directory: Path | str, seed: int, **variant: Any) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with quiet_seeded(seed):
        builder(directory, **variant)
    return directory


@contextlib.contextmanager
def quiet_seeded(seed: int | None) -> Iterator[None]:
    """Seed torch's global generator for a build (restored after; None: keep the caller's) and silence
    transformers: building random models makes it warn about untrained weights, which is the point."""
    import torch
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
