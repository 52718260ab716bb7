"""Tiny random-initialised CLIP, BLIP and InstructBLIP models, built offline for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import DEFAULT_VOCABULARIES, NUMBER_WORDS
from metavlm_ros.models.vlm import BACKENDS, DEFAULT_CLASS_PROMPTS, TABLE1_PROMPT

__all__ = ['TINY_BUILDERS', 'TINY_IMAGE_SIZE', 'build_base_model', 'build_tiny_model']

#: Side of the square image the tiny models see; frames of any size are resized to it by the processor.
TINY_IMAGE_SIZE = 32

# Shared transformer shape: small enough that building, saving and loading take well under a second.
_HIDDEN = 32
_HEADS = 2
_INTERMEDIATE = 64
_PATCH = 8

# CLIP's normalisation constants, so the tiny processors behave like the real ones.
_MEAN = [0.48145466, 0.4578275, 0.40821073]
_STD = [0.26862954, 0.26130258, 0.27577711]


def _corpus() -> list[str]:
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
    for sentence in _corpus():
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


def _clip_tokenizer():
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # Every byte may end a word, so each also exists with CLIP's end-of-word suffix.
    symbols = ['<|startoftext|>', '<|endoftext|>', *alphabet, *(c + '</w>' for c in alphabet)]
    vocab, merges = _bpe(_words(CLIPTokenizerFast()), symbols, suffix='</w>')
    return CLIPTokenizerFast(vocab=vocab, merges=merges, model_max_length=77)


def _bert_tokenizer():
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


def _llama_tokenizer():
    from transformers import LlamaTokenizerFast

    # SentencePiece-style pieces: one per whitespace-separated word, marked by its leading '▁'.
    words = sorted({'\u2581' + word for sentence in _corpus() for word in sentence.split()})
    chars = sorted({c for w in words for c in w})
    # Byte fallback tokens let any text round-trip, as in the released Vicuna/LLaMA vocabularies.
    symbols = ['<unk>', '<s>', '</s>', *(f'<0x{byte:02X}>' for byte in range(256)), *chars]
    vocab, merges = _bpe(words, symbols)
    tokenizer = LlamaTokenizerFast(vocab=vocab, merges=merges, model_max_length=512)
    tokenizer.pad_token = '<unk>'
    return tokenizer


def _t5_tokenizer():
    from transformers import T5TokenizerFast

    # Unigram pieces: whole words score above single characters, so a corpus word stays one piece.
    words = sorted({'\u2581' + word for sentence in _corpus() for word in sentence.split()})
    chars = sorted({c for w in words for c in w})
    pieces = [('<pad>', 0.0), ('</s>', 0.0), ('<unk>', 0.0)]
    pieces += [(c, -10.0) for c in chars] + [(w, -1.0) for w in words]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def _vision(prefix_layers: int = 1) -> dict:
    return {
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': prefix_layers,
        'num_attention_heads': _HEADS,
        'image_size': TINY_IMAGE_SIZE,
        'patch_size': _PATCH,
    }


def _image_processor(kind: str):
    from transformers import BlipImageProcessor, CLIPImageProcessor

    if kind == 'clip':
        return CLIPImageProcessor(
            size={'shortest_edge': TINY_IMAGE_SIZE},
            crop_size={'height': TINY_IMAGE_SIZE, 'width': TINY_IMAGE_SIZE},
            image_mean=_MEAN,
            image_std=_STD,
        )
    return BlipImageProcessor(
        size={'height': TINY_IMAGE_SIZE, 'width': TINY_IMAGE_SIZE}, image_mean=_MEAN, image_std=_STD
    )


def _build_clip(directory: Path) -> None:
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor

    tokenizer = _clip_tokenizer()
    text = {
        'vocab_size': len(tokenizer),
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'max_position_embeddings': 77,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
    }
    config = CLIPConfig(text_config=text, vision_config=_vision(), projection_dim=16)
    CLIPModel(config).save_pretrained(directory, safe_serialization=True)
    CLIPProcessor(image_processor=_image_processor('clip'), tokenizer=tokenizer).save_pretrained(directory)


def _build_blip(directory: Path) -> None:
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipProcessor

    tokenizer = _bert_tokenizer()
    text = {
        'vocab_size': len(tokenizer),
        'hidden_size': _HIDDEN,
        'encoder_hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'max_position_embeddings': 512,
        'bos_token_id': tokenizer.bos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
        'sep_token_id': tokenizer.sep_token_id,
        'eos_token_id': tokenizer.sep_token_id,
    }
    config = BlipConfig(text_config=text, vision_config=_vision(), projection_dim=16)
    BlipForConditionalGeneration(config).save_pretrained(directory, safe_serialization=True)
    BlipProcessor(image_processor=_image_processor('blip'), tokenizer=tokenizer).save_pretrained(directory)


def _language_model(name: str, tokenizer) -> dict:
    """InstructBLIP's language model: decoder-only like Vicuna, or encoder-decoder like Flan-T5."""
    if name == 't5':
        return {
            'model_type': 't5',
            'vocab_size': len(tokenizer),
            'd_model': _HIDDEN,
            'd_kv': _HIDDEN // _HEADS,
            'd_ff': _INTERMEDIATE,
            'num_layers': 1,
            'num_decoder_layers': 1,
            'num_heads': _HEADS,
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
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'num_key_value_heads': _HEADS,
        'max_position_embeddings': 512,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
    }


def _build_instructblip(directory: Path, language_model: str = 'llama') -> None:
    from transformers import InstructBlipConfig, InstructBlipForConditionalGeneration, InstructBlipProcessor

    num_query_tokens = 4
    processor = InstructBlipProcessor(
        image_processor=_image_processor('blip'),
        tokenizer=_t5_tokenizer() if language_model == 't5' else _llama_tokenizer(),
        qformer_tokenizer=_bert_tokenizer(),
        num_query_tokens=num_query_tokens,
    )
    tokenizer, qformer_tokenizer = processor.tokenizer, processor.qformer_tokenizer
    qformer = {
        'vocab_size': len(qformer_tokenizer),
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'encoder_hidden_size': _HIDDEN,
        'max_position_embeddings': 512,
        'pad_token_id': qformer_tokenizer.pad_token_id,
    }
    text = _language_model(language_model, tokenizer)
    config = InstructBlipConfig(
        vision_config=_vision(),
        qformer_config=qformer,
        text_config=text,
        num_query_tokens=num_query_tokens,
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
    )
    InstructBlipForConditionalGeneration(config).save_pretrained(directory, safe_serialization=True)
    processor.save_pretrained(directory)


#: A tiny builder per registered backend (test/models/test_vlm.py checks that none is missing).
TINY_BUILDERS = {'clip': _build_clip, 'blip': _build_blip, 'instructblip': _build_instructblip}


def build_tiny_model(
    backend: str, directory: Path | str, seed: int = 0, *, language_model: str = 'llama'
) -> Path:
    """Build, randomly initialise and save a tiny model with its tokenizer and processor.

    The saved directory loads through `create_backend(backend, directory)` exactly like a released
    model: a config, safetensors weights, a tokenizer built from the prompts and the count vocabulary,
    and an image processor.

    Args:
        backend: 'clip', 'blip' or 'instructblip'.
        directory: where to save; created when missing.
        seed: seed of the weight initialisation; the same seed gives the same weights.
        language_model: InstructBLIP only: 'llama' (decoder-only, as Vicuna) or 't5' (encoder-decoder,
            as Flan-T5).

    Returns:
        The directory, as a Path.

    Raises:
        ModelError: the backend is unknown.
        ParameterError: an unknown language model.
    """
    if backend not in TINY_BUILDERS:
        raise ModelError(f'unknown backend {backend!r}; valid backends: {", ".join(BACKENDS)}')
    if language_model not in ('llama', 't5'):
        raise ParameterError(f"language_model must be 'llama' or 't5', got {language_model!r}")
    import torch
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    # Building random models makes transformers warn about untrained weights; that is the point here.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if backend == 'instructblip':
                _build_instructblip(directory, language_model)
            else:
                TINY_BUILDERS[backend](directory)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return directory


def build_base_model(backend: str, directory: Path | str, seed: int = 0) -> Path:
    """Build and save a random-initialised model of a released base model's shape, for benchmarks.

    CLIP: openai/clip-vit-base-patch32's shape (ViT-B/32 at 224 x 224, 12-layer text tower,
    49408-token vocabulary: about 151 M parameters). BLIP: Salesforce/blip-image-captioning-base's
    (ViT-B/16 at 384 x 384, 12-layer BERT-base decoder, 30524 tokens). The image processors are
    the released ones' (transformers' defaults for them). Timing does not depend on the weights;
    the tokenizer is the tiny models' (its ids all fall inside the real vocabulary size).

    Args:
        backend: 'clip' or 'blip'.
        directory: where to save; created when missing.
        seed: seed of the weight initialisation.

    Returns:
        The directory, as a Path.

    Raises:
        ModelError: another backend.
    """
    if backend not in ('clip', 'blip'):
        raise ModelError(f'base-shape models exist for clip and blip, not {backend!r}')
    import torch
    from transformers import (
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
    )
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if backend == 'clip':
                tokenizer = _clip_tokenizer()
                text = {
                    'vocab_size': 49408,
                    'bos_token_id': tokenizer.bos_token_id,
                    'eos_token_id': tokenizer.eos_token_id,
                    'pad_token_id': tokenizer.pad_token_id,
                }
                # CLIPConfig's defaults are ViT-B/32's: 768-wide 12-layer vision, patch 32, 224 px.
                CLIPModel(CLIPConfig(text_config=text)).save_pretrained(directory, safe_serialization=True)
                processor = CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer)
            else:
                tokenizer = _bert_tokenizer()
                text = {
                    'vocab_size': 30524,
                    'bos_token_id': tokenizer.bos_token_id,
                    'pad_token_id': tokenizer.pad_token_id,
                    'sep_token_id': tokenizer.sep_token_id,
                    'eos_token_id': tokenizer.sep_token_id,
                }
                # BlipConfig's defaults are BLIP base's: ViT-B/16 at 384 px, BERT-base text decoder.
                model = BlipForConditionalGeneration(BlipConfig(text_config=text))
                model.save_pretrained(directory, safe_serialization=True)
                processor = BlipProcessor(image_processor=BlipImageProcessor(), tokenizer=tokenizer)
            processor.save_pretrained(directory)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return directory
