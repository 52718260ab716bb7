"""Tiny random-weight VLMs of today's families (real configs and processors, shrunk), built offline."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.tiny import corpus, quiet_seeded, t5_tokenizer

__all__ = [
    'FAMILIES',
    'REQUIRED_WORDS',
    'VIDEO_FAMILIES',
    'build_base_vlm',
    'build_tiny_siglip',
    'build_tiny_vlm',
]

#: Words every tiny vocabulary holds as single tokens (bare and after a space), so yes/no answers,
#: JSON count answers and class names are representable by one token each.
REQUIRED_WORDS = ('yes', 'no', 'Yes', 'No', *CLASSES, *'0123456789', '{', '}', '"', ':', ',')

# One transformer shape for every tiny family: building, saving and loading take about a second.
_HIDDEN = 32
_HEADS = 2
_INTERMEDIATE = 64
_PATCH = 8
_SIDE = 32  # the vision tower's input side
_SIGLIP_MEAN = [0.5, 0.5, 0.5]
_SIGLIP_STD = [0.5, 0.5, 0.5]
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# -- chat templates ------------------------------------------------------------------------------
# Each follows its family's released template's message layout (markers, where images go, the
# generation prompt); written here so nothing is downloaded. Content is a list of {'type': ...}
# parts as transformers' processors expect; a plain string content is accepted too.

_QWEN2_VL_TEMPLATE = (
    '{% for message in messages %}'
    "{% if loop.first and message['role'] != 'system' %}"
    '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}'
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    '<|vision_start|><|image_pad|><|vision_end|>'
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    '{% endfor %}<|im_end|>\n{% endif %}'
    '{% endfor %}'
    '{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)

# SmolVLM (Idefics3 + SmolLM2): 'User:<image>question<end_of_utterance>\nAssistant:'.
_IDEFICS3_TEMPLATE = (
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
_PALIGEMMA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}<image>{% endif %}{% endfor %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}"
    '{% endif %}{% endfor %}{% endif %}{% endif %}{% endfor %}'
)

# llava-hf/llava-1.5: 'USER: <image>\nquestion ASSISTANT:'.
_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}"
    "{% endif %}{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
    "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# llava-hf/llava-onevision (Qwen2 chat markers): '<|im_start|>user <image>\nquestion<|im_end|>\n'.
_LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
    "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 3: '<bos><start_of_turn>user\n<start_of_image>question<end_of_turn>\n<start_of_turn>model\n';
# a system message is folded into the first user turn, as the released template does.
_GEMMA3_TEMPLATE = (
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
def _sentences() -> list[str]:
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


def _pieces(tokenizer: Any, sentences: list[str]) -> list[str]:
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


def _merges_spelling(words: list[str], alphabet: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
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


def _byte_level_tokenizer(cls: Any, specials: list[str], **kwargs: Any) -> Any:
    """A byte-level BPE tokenizer of class `cls` (GPT-2 / Qwen2 style) spelling the corpus's words."""
    from tokenizers import pre_tokenizers

    words = _pieces(cls(vocab={'<|endoftext|>': 0}, merges=[]), _sentences())
    vocab, merges = _merges_spelling(words, sorted(pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = cls(vocab=vocab, merges=merges, **kwargs)
    tokenizer.add_special_tokens({'additional_special_tokens': specials})
    return tokenizer


def _metaspace_tokenizer(cls: Any, base: list[str], specials: list[str], **kwargs: Any) -> Any:
    """A SentencePiece-style BPE tokenizer of class `cls` (Llama / Gemma) with byte fallback."""
    # SentencePiece does not pre-tokenise; its pieces are words with or without the '▁' that marks a
    # preceding space, and their punctuation-separated parts ('{"animal":' and 'animal', '{', ':').
    words: set[str] = set()
    for sentence in [*_sentences(), ' '.join(REQUIRED_WORDS)]:
        for word in sentence.split():
            for part in {word, *re.findall(r'\w+|[^\w\s]+', word)}:
                words.update((part, '\u2581' + part))
    words = sorted(words)
    chars = sorted({c for w in words for c in w})
    alphabet = [*base, *(f'<0x{byte:02X}>' for byte in range(256)), *chars]
    vocab, merges = _merges_spelling(words, alphabet)
    tokenizer = cls(vocab=vocab, merges=merges, **kwargs)
    tokenizer.add_special_tokens({'additional_special_tokens': specials})
    return tokenizer


def _check_vocabulary(tokenizer: Any) -> None:
    """Every required word must be one token, bare and after a space; a builder bug otherwise."""
    for word in REQUIRED_WORDS:
        for text in (word, ' ' + word):
            ids = tokenizer.encode(text, add_special_tokens=False)
            # Qwen2 and Gemma split digits from everything, a preceding space included, as released.
            if len(ids) != 1 and not (word.isdigit() and text.startswith(' ')):
                raise ModelError(
                    f'tiny tokenizer splits {text!r} into {tokenizer.convert_ids_to_tokens(ids)}'
                )


# -- families ------------------------------------------------------------------------------------
def _text(tokenizer: Any, **extra: Any) -> dict:
    """A one-layer decoder's shape, shared by every family's language model."""
    return {
        'vocab_size': len(tokenizer),
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'num_key_value_heads': 1,  # grouped-query attention, as every one of these families uses
        'max_position_embeddings': 1024,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
        **extra,
    }


def _siglip_vision(**extra: Any) -> dict:
    return {
        'model_type': 'siglip_vision_model',
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
        'image_size': _SIDE,
        'patch_size': _PATCH,
        **extra,
    }


def _video_processor(family: str, **settings: Any) -> Any:
    """The family's video processor (needs torchvision); the processor class refuses to be built
    without one, though only images pass through it here."""
    if family == 'qwen2_vl':
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor as cls
    else:
        from transformers.models.llava_onevision.video_processing_llava_onevision import (
            LlavaOnevisionVideoProcessor as cls,
        )
    return cls(**settings)


def _qwen2_vl() -> tuple[Any, Any, Any]:
    from transformers import Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specials = [
        '<|im_start|>',
        '<|im_end|>',
        '<|vision_start|>',
        '<|vision_end|>',
        '<|image_pad|>',
        '<|video_pad|>',
    ]
    tokenizer = _byte_level_tokenizer(
        Qwen2Tokenizer, specials, eos_token='<|im_end|>', pad_token='<|endoftext|>'
    )
    patch, merge = 4, 2
    # Dynamic resolution: each side rounded to a multiple of patch * merge, the area kept within
    # [min_pixels, max_pixels] (Qwen2-VL's own rule; the released model allows 56*56 to 28*28*1280).
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=16 * 16, max_pixels=48 * 48, patch_size=patch, merge_size=merge, temporal_patch_size=2
    )
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=_video_processor(
            'qwen2_vl', patch_size=patch, merge_size=merge, temporal_patch_size=2
        ),
        chat_template=_QWEN2_VL_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    head_dim = _HIDDEN // _HEADS
    config = Qwen2VLConfig(
        text_config=_text(
            tokenizer,
            # M-RoPE splits each head's rotary half into temporal, height and width sections.
            rope_parameters={'rope_type': 'default', 'rope_theta': 1e6, 'mrope_section': [2, 3, 3]},
            head_dim=head_dim,
        ),
        vision_config={
            'depth': 1,
            'embed_dim': _HIDDEN,
            'hidden_size': _HIDDEN,
            'mlp_ratio': 2,
            'num_heads': _HEADS,
            'patch_size': patch,
            'spatial_merge_size': merge,
            'temporal_patch_size': 2,
        },
        image_token_id=ids('<|image_pad|>'),
        video_token_id=ids('<|video_pad|>'),
        vision_start_token_id=ids('<|vision_start|>'),
        vision_end_token_id=ids('<|vision_end|>'),
    )
    return Qwen2VLForConditionalGeneration(config), processor, tokenizer


def _idefics3_processor(side: int, patch: int, scale: int, tiles: int) -> tuple[Any, Any]:
    """SmolVLM's processor: frames resized so the longer side is at most `tiles` tiles of `side`,
    cut into tiles of the vision tower's side, plus one global view of the whole frame."""
    from transformers import GPT2Tokenizer, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    rows = [f'<row_{r}_col_{c}>' for r in range(1, 7) for c in range(1, 7)]
    specials = [
        '<|im_start|>',
        '<|im_end|>',
        '<end_of_utterance>',
        '<fake_token_around_image>',
        '<image>',
        '<global-img>',
        *rows,
    ]
    tokenizer = _byte_level_tokenizer(
        GPT2Tokenizer,
        specials,
        bos_token='<|im_start|>',
        eos_token='<end_of_utterance>',
        pad_token='<|im_end|>',
    )
    image_processor = Idefics3ImageProcessorPil(
        size={'longest_edge': tiles * side},
        max_image_size={'longest_edge': side},
        do_image_splitting=True,
        image_mean=_SIGLIP_MEAN,
        image_std=_SIGLIP_STD,
    )
    # Pixel shuffle folds scale x scale patches into one token.
    image_seq_len = (side // patch) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=image_seq_len,
        chat_template=_IDEFICS3_TEMPLATE,
    )
    return processor, tokenizer


def _idefics3() -> tuple[Any, Any, Any]:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    scale = 2
    processor, tokenizer = _idefics3_processor(_SIDE, _PATCH, scale, tiles=2)
    config = Idefics3Config(
        text_config={'model_type': 'llama', **_text(tokenizer)},
        vision_config={k: v for k, v in _siglip_vision().items() if k != 'model_type'},
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids('<image>'),
    )
    return Idefics3ForConditionalGeneration(config), processor, tokenizer


def _gemma_tokenizer(specials: list[str], **kwargs: Any) -> Any:
    from transformers import GemmaTokenizer

    return _metaspace_tokenizer(
        GemmaTokenizer, ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>'], specials, **kwargs
    )


def _paligemma() -> tuple[Any, Any, Any]:
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tokenizer = _gemma_tokenizer(['<image>'])
    image_processor = SiglipImageProcessorPil(
        size={'height': _SIDE, 'width': _SIDE}, image_mean=_SIGLIP_MEAN, image_std=_SIGLIP_STD
    )
    # PaliGemmaProcessor reads the number of image tokens from its image processor, as released.
    image_processor.image_seq_length = (_SIDE // _PATCH) ** 2
    processor = PaliGemmaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=_PALIGEMMA_TEMPLATE
    )
    config = PaliGemmaConfig(
        text_config={'model_type': 'gemma', **_text(tokenizer), 'head_dim': _HIDDEN // _HEADS},
        vision_config=_siglip_vision(projection_dim=_HIDDEN),
        projection_dim=_HIDDEN,
        hidden_size=_HIDDEN,
        vocab_size=len(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
    )
    return PaliGemmaForConditionalGeneration(config), processor, tokenizer


def _llava() -> tuple[Any, Any, Any]:
    from transformers import LlamaTokenizer, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = _metaspace_tokenizer(LlamaTokenizer, ['<unk>', '<s>', '</s>'], ['<image>'])
    tokenizer.pad_token = '<unk>'  # as llava-hf's Vicuna tokenizer
    image_processor = CLIPImageProcessorPil(
        size={'shortest_edge': _SIDE},
        crop_size={'height': _SIDE, 'width': _SIDE},
        image_mean=_CLIP_MEAN,
        image_std=_CLIP_STD,
    )
    # LLaVA-1.5 drops CLIP's class token ('default' strategy): the processor counts it (+1) then removes it.
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_PATCH,
        chat_template=_LLAVA_TEMPLATE,
        vision_feature_select_strategy='default',
        num_additional_image_tokens=1,
    )
    vision = {
        'model_type': 'clip_vision_model',
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 2,  # LLaVA reads the second-to-last layer
        'num_attention_heads': _HEADS,
        'image_size': _SIDE,
        'patch_size': _PATCH,
        'projection_dim': _HIDDEN,
    }
    config = LlavaConfig(
        text_config={'model_type': 'llama', **_text(tokenizer)},
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
        image_seq_length=(_SIDE // _PATCH) ** 2,
        vision_feature_select_strategy='default',
        vision_feature_layer=-2,
    )
    return LlavaForConditionalGeneration(config), processor, tokenizer


def _llava_onevision() -> tuple[Any, Any, Any]:
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionProcessor,
        Qwen2Tokenizer,
    )
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    specials = ['<|im_start|>', '<|im_end|>', '<image>', '<video>']
    tokenizer = _byte_level_tokenizer(
        Qwen2Tokenizer, specials, eos_token='<|im_end|>', pad_token='<|endoftext|>'
    )
    # AnyRes: the frame is tiled on the best-fitting grid of these resolutions, plus a base view.
    pinpoints = [[_SIDE, _SIDE], [_SIDE, 2 * _SIDE], [2 * _SIDE, _SIDE], [2 * _SIDE, 2 * _SIDE]]
    image_processor = LlavaOnevisionImageProcessorPil(
        size={'height': _SIDE, 'width': _SIDE},
        image_grid_pinpoints=pinpoints,
        image_mean=_SIGLIP_MEAN,
        image_std=_SIGLIP_STD,
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=_video_processor('llava_onevision', size={'height': _SIDE, 'width': _SIDE}),
        num_image_tokens=(_SIDE // _PATCH) ** 2,
        vision_feature_select_strategy='full',
        vision_aspect_ratio='anyres_max_9',
        chat_template=_LLAVA_ONEVISION_TEMPLATE,
    )
    config = LlavaOnevisionConfig(
        text_config={'model_type': 'qwen2', **_text(tokenizer)},
        vision_config=_siglip_vision(),
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
        video_token_index=tokenizer.convert_tokens_to_ids('<video>'),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy='full',
        vision_feature_layer=-1,
    )
    return LlavaOnevisionForConditionalGeneration(config), processor, tokenizer


def _gemma3() -> tuple[Any, Any, Any]:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    markers = {
        'image_token': '<image_soft_token>',
        'boi_token': '<start_of_image>',
        'eoi_token': '<end_of_image>',
    }
    tokenizer = _gemma_tokenizer(
        ['<start_of_turn>', '<end_of_turn>', *markers.values()], extra_special_tokens=markers
    )
    image_processor = Gemma3ImageProcessorPil(
        size={'height': _SIDE, 'width': _SIDE}, image_mean=_SIGLIP_MEAN, image_std=_SIGLIP_STD
    )
    tokens_per_image = 4  # the 4 x 4 patch grid average-pooled to 2 x 2 soft tokens
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=tokens_per_image,
        chat_template=_GEMMA3_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=_text(
            tokenizer, head_dim=_HIDDEN // _HEADS, query_pre_attn_scalar=_HIDDEN // _HEADS, sliding_window=64
        ),
        vision_config=_siglip_vision(),
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=ids('<start_of_image>'),
        eoi_token_index=ids('<end_of_image>'),
        image_token_index=ids('<image_soft_token>'),
    )
    import torch

    model = Gemma3ForConditionalGeneration(config)
    # transformers initialises Gemma 3's image projection to zeros (it is learnt from there), which
    # would make a random model blind to its image; a random projection lets the frame count.
    torch.nn.init.normal_(
        model.model.multi_modal_projector.mm_input_projection_weight, std=config.initializer_range
    )
    return model, processor, tokenizer


#: Families whose processor holds a video processor: transformers (5.24) cannot build or load their
#: processor without torchvision, even for images and even with no video processor given.
VIDEO_FAMILIES = ('qwen2_vl', 'llava_onevision')

#: The builder of each tiny family: a model, its processor and its tokenizer.
FAMILIES: dict[str, Callable[[], tuple[Any, Any, Any]]] = {
    'qwen2_vl': _qwen2_vl,
    'idefics3': _idefics3,
    'paligemma': _paligemma,
    'llava': _llava,
    'llava_onevision': _llava_onevision,
    'gemma3': _gemma3,
}


def _save(model: Any, processor: Any, directory: Path | str) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    processor.save_pretrained(directory)
    return directory


def build_tiny_vlm(family: str, directory: Path | str, seed: int | None = 0) -> Path:
    """Build, randomly initialise and save a tiny image-text-to-text model of a released family.

    The model is the family's own class from its own config class, shrunk (one decoder layer, width
    32, a one- or two-layer vision tower on 32 x 32 tiles); the processor is the family's processor
    class with its image processor (PIL backend), a tokenizer built here from the project's prompts
    (yes/no, digits, JSON punctuation and class names are single tokens), the family's special tokens
    and a chat template in the family's published layout. The directory loads with
    `AutoProcessor` / `AutoModelForImageTextToText` offline, and `transformers serve` can serve it.

    Args:
        family: one of FAMILIES: 'qwen2_vl', 'idefics3' (SmolVLM), 'paligemma', 'llava',
            'llava_onevision' or 'gemma3'.
        directory: where to save; created when missing.
        seed: seed of the weight initialisation; the same seed gives the same weights (None: the
            caller has seeded torch, as build_tiny_model does).

    Returns:
        The directory, as a Path.

    Raises:
        ParameterError: an unknown family.
    """
    if family not in FAMILIES:
        raise ParameterError(f'unknown tiny VLM family {family!r}; valid families: {", ".join(FAMILIES)}')
    if family in VIDEO_FAMILIES and importlib.util.find_spec('torchvision') is None:
        raise ModelError(
            f'{family} needs torchvision: transformers builds its processor with a video processor, '
            'which requires torchvision even for images'
        )
    with quiet_seeded(seed):
        model, processor, tokenizer = FAMILIES[family]()
        _check_vocabulary(tokenizer)
        return _save(model, processor, directory)


def _siglip(version: int) -> tuple[Any, Any]:
    """SigLIP (fixed 32 x 32 input) or SigLIP 2 (NaFlex: aspect kept, at most 256 patches of 16)."""
    shape = {
        'hidden_size': _HIDDEN,
        'intermediate_size': _INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': _HEADS,
    }
    if version == 1:
        from transformers import SiglipConfig, SiglipModel, SiglipProcessor
        from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

        # SigLIP's own tokenizer is a SentencePiece Unigram model, as T5's; tiny.py builds that kind.
        tokenizer = t5_tokenizer()
        tokenizer.model_max_length = 64  # SigLIP's text tower is trained on 64 tokens, padded to it
        text = {
            **shape,
            'vocab_size': len(tokenizer),
            'max_position_embeddings': 64,
            'pad_token_id': tokenizer.pad_token_id,
            'eos_token_id': tokenizer.eos_token_id,
        }
        config = SiglipConfig(
            text_config=text, vision_config={**shape, 'image_size': _SIDE, 'patch_size': _PATCH}
        )
        image_processor = SiglipImageProcessorPil(
            size={'height': _SIDE, 'width': _SIDE}, image_mean=_SIGLIP_MEAN, image_std=_SIGLIP_STD
        )
        return SiglipModel(config), SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer)
    from transformers import Siglip2Config, Siglip2Model, Siglip2Processor, Siglip2Tokenizer
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    # SigLIP 2's tokenizer is Gemma's with lower-casing: the same SentencePiece-style BPE here.
    tokenizer = _metaspace_tokenizer(
        Siglip2Tokenizer, ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>'], [], model_max_length=64
    )
    text = {
        **shape,
        'vocab_size': len(tokenizer),
        'max_position_embeddings': 64,
        'pad_token_id': tokenizer.pad_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'bos_token_id': tokenizer.bos_token_id,
    }
    # Siglip2Processor passes patch 16 and at most 256 patches to its image processor whatever the
    # image processor says (class defaults, transformers 5.24), so the tiny tower takes those too.
    patch, max_patches = 16, 256
    config = Siglip2Config(
        text_config=text, vision_config={**shape, 'patch_size': patch, 'num_patches': max_patches}
    )
    image_processor = Siglip2ImageProcessorPil(
        patch_size=patch, max_num_patches=max_patches, image_mean=_SIGLIP_MEAN, image_std=_SIGLIP_STD
    )
    return Siglip2Model(config), Siglip2Processor(image_processor=image_processor, tokenizer=tokenizer)


def build_tiny_siglip(directory: Path | str, version: int = 1, seed: int | None = 0) -> Path:
    """Build, randomly initialise and save a tiny SigLIP (SiglipModel) or SigLIP 2 (Siglip2Model).

    Both load with `AutoProcessor` / `AutoModel` offline; their text vocabularies hold the class
    prompts of the contrastive backend (models/vlm.py DEFAULT_CLASS_PROMPTS).

    Args:
        directory: where to save; created when missing.
        version: 1 (SigLIP, fixed square input) or 2 (SigLIP 2, NaFlex variable resolution).
        seed: seed of the weight initialisation.

    Returns:
        The directory, as a Path.

    Raises:
        ParameterError: a version other than 1 or 2.
    """
    if version not in (1, 2):
        raise ParameterError(f'SigLIP version must be 1 or 2, got {version!r}')
    with quiet_seeded(seed):
        model, processor = _siglip(version)
        return _save(model, processor, directory)


def build_base_vlm(directory: Path | str, seed: int | None = 0) -> Path:
    """Build and save a random-initialised model of SmolVLM-256M-Instruct's shape, for benchmarks.

    Idefics3 with, from memory of HuggingFaceTB/SmolVLM-256M-Instruct's config (not checked against
    the file, which is not on this machine): a SigLIP base-patch16-512 vision tower (768 wide, 12
    layers, 12 heads, MLP 3072, 512 x 512 tiles), pixel shuffle with scale factor 4 (64 image tokens
    per tile), and a SmolLM2-135M-shaped decoder (576 wide, 30 layers, 9 heads, 3 key-value heads,
    MLP 1536, vocabulary 49280, RoPE theta 100000, an output head of its own); the processor splits
    frames into 512-pixel tiles after resizing the longer side to at most 2048 (4 tiles a side) as the
    released one does. Timing
    does not depend on the weights; the tokenizer is the tiny models' (its ids fall inside the
    vocabulary size). About 256 M parameters (256.5 M counted here, close to the released count).

    Args:
        directory: where to save; created when missing.
        seed: seed of the weight initialisation.

    Returns:
        The directory, as a Path.
    """
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    with quiet_seeded(seed):
        processor, tokenizer = _idefics3_processor(side=512, patch=16, scale=4, tiles=4)
        text = {
            'model_type': 'llama',
            'vocab_size': 49280,
            'hidden_size': 576,
            'intermediate_size': 1536,
            'num_hidden_layers': 30,
            'num_attention_heads': 9,
            'num_key_value_heads': 3,
            'max_position_embeddings': 8192,
            'rope_parameters': {'rope_type': 'default', 'rope_theta': 1e5},
            'rms_norm_eps': 1e-5,
            'tie_word_embeddings': False,
            'bos_token_id': tokenizer.bos_token_id,
            'eos_token_id': tokenizer.eos_token_id,
            'pad_token_id': tokenizer.pad_token_id,
        }
        vision = {
            'hidden_size': 768,
            'intermediate_size': 3072,
            'num_hidden_layers': 12,
            'num_attention_heads': 12,
            'image_size': 512,
            'patch_size': 16,
        }
        config = Idefics3Config(
            text_config=text,
            vision_config=vision,
            scale_factor=4,
            image_token_id=tokenizer.convert_tokens_to_ids('<image>'),
            tie_word_embeddings=False,
        )
        return _save(Idefics3ForConditionalGeneration(config), processor, directory)
