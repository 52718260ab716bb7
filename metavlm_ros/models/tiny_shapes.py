"""The tiny VLM families' shared shape: widths, tower side, normalisations, decoder and SigLIP configs."""

from __future__ import annotations

from typing import Any

__all__ = [
    'CLIP_MEAN',
    'CLIP_STD',
    'HEADS',
    'HIDDEN',
    'INTERMEDIATE',
    'PATCH',
    'SIDE',
    'SIGLIP_MEAN',
    'SIGLIP_STD',
    'VIT_B',
    'decoder_shape',
    'family_video_processor',
    'siglip_shape',
]

#: A ViT-B vision tower's shape (768 wide, 12 layers, 12 heads, MLP 3072): the benchmarks' base models.
VIT_B = {'hidden_size': 768, 'intermediate_size': 3072, 'num_hidden_layers': 12, 'num_attention_heads': 12}

# One transformer shape for every tiny family: building, saving and loading take about a second.
HIDDEN = 32
HEADS = 2
INTERMEDIATE = 64
PATCH = 8
SIDE = 32  # the vision tower's input side
SIGLIP_MEAN = [0.5, 0.5, 0.5]
SIGLIP_STD = [0.5, 0.5, 0.5]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def decoder_shape(tokenizer: Any, **extra: Any) -> dict:
    """A one-layer decoder's shape, shared by every family's language model."""
    return {
        'vocab_size': len(tokenizer),
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
        'num_key_value_heads': 1,  # grouped-query attention, as every one of these families uses
        'max_position_embeddings': 1024,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
        **extra,
    }


def siglip_shape(**extra: Any) -> dict:
    """A one-layer SigLIP vision tower's shape on SIDE x SIDE tiles of PATCH-pixel patches."""
    return {
        'model_type': 'siglip_vision_model',
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
        'image_size': SIDE,
        'patch_size': PATCH,
        **extra,
    }


def family_video_processor(family: str, **settings: Any) -> Any:
    """The family's video processor (needs torchvision); the processor class refuses to be built
    without one, though only images pass through it here."""
    if family in ('qwen2_vl', 'qwen2_5_vl'):
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor as cls
    elif family == 'qwen3_vl':
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as cls
    else:
        from transformers.models.llava_onevision.video_processing_llava_onevision import (
            LlavaOnevisionVideoProcessor as cls,
        )
    return cls(**settings)
