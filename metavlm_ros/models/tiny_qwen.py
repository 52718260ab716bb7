"""Tiny random-weight Qwen2-VL, Qwen2.5-VL and Qwen3-VL (real configs and processors, shrunk)."""

from __future__ import annotations

from typing import Any

from metavlm_ros.models.tiny_shapes import (
    CLIP_MEAN,
    CLIP_STD,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    SIGLIP_MEAN,
    SIGLIP_STD,
    decoder_shape,
    family_video_processor,
)
from metavlm_ros.models.tiny_vocabularies import QWEN2_VL_TEMPLATE, QWEN3_VL_TEMPLATE, byte_level_tokenizer

__all__ = ['qwen2_5_vl', 'qwen2_vl', 'qwen3_vl']


def _qwen_processor(family: str, processor_cls: Any, patch: int, mean: list, std: list, template: str):
    """The processor of a Qwen vision-language family: dynamic resolution, each side rounded to a
    multiple of patch * 2 (patches merged 2 x 2 into one token), the area kept within [min_pixels,
    max_pixels] (the released models allow 56*56 to 28*28*1280; here 16*16 to 48*48)."""
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specials = [
        '<|im_start|>',
        '<|im_end|>',
        '<|vision_start|>',
        '<|vision_end|>',
        '<|image_pad|>',
        '<|video_pad|>',
    ]
    tokenizer = byte_level_tokenizer(
        Qwen2Tokenizer, specials, eos_token='<|im_end|>', pad_token='<|endoftext|>'
    )
    shape = {'patch_size': patch, 'merge_size': 2, 'temporal_patch_size': 2}
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=16 * 16, max_pixels=48 * 48, image_mean=mean, image_std=std, **shape
    )
    processor = processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=family_video_processor(family, **shape),
        chat_template=template,
    )
    return processor, tokenizer


def _qwen_tokens(tokenizer: Any) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return {
        'image_token_id': ids('<|image_pad|>'),
        'video_token_id': ids('<|video_pad|>'),
        'vision_start_token_id': ids('<|vision_start|>'),
        'vision_end_token_id': ids('<|vision_end|>'),
    }


def _qwen_vision(patch: int, **extra: Any) -> dict:
    """A Qwen vision tower's shape: patches of `patch` pixels, two frames a temporal patch, 2 x 2 merged."""
    return {
        'hidden_size': HIDDEN,
        'num_heads': HEADS,
        'patch_size': patch,
        'spatial_merge_size': 2,
        'temporal_patch_size': 2,
        **extra,
    }


def _qwen_text(tokenizer: Any, **rope: Any) -> dict:
    # M-RoPE splits each head's rotary half into temporal, height and width sections.
    rope_parameters = {'rope_type': 'default', 'rope_theta': 1e6, 'mrope_section': [2, 3, 3], **rope}
    return decoder_shape(tokenizer, rope_parameters=rope_parameters, head_dim=HIDDEN // HEADS)


#: The tiny Qwen towers' patch side: 4-pixel patches, merged 2 x 2 into one 8-pixel token.
_QWEN_PATCH = 4


def _qwen(family: str, prefix: str, *, mean: list, std: list, template: str, vision: dict, **rope: Any):
    """A tiny model of a Qwen family: transformers' `<prefix>Config`, `<prefix>ForConditionalGeneration`
    and `<prefix>Processor`, the shared Qwen tokenizer and dynamic-resolution processor."""
    import transformers

    processor_class = getattr(transformers, f'{prefix}Processor')
    processor, tokenizer = _qwen_processor(family, processor_class, _QWEN_PATCH, mean, std, template)
    config = getattr(transformers, f'{prefix}Config')(
        text_config=_qwen_text(tokenizer, **rope),
        vision_config=_qwen_vision(_QWEN_PATCH, **vision),
        **_qwen_tokens(tokenizer),
    )
    return getattr(transformers, f'{prefix}ForConditionalGeneration')(config), processor, tokenizer


def qwen2_vl() -> tuple[Any, Any, Any]:
    """A tiny Qwen2-VL: its model, processor and tokenizer."""
    vision = {'depth': 1, 'embed_dim': HIDDEN, 'mlp_ratio': 2}
    return _qwen(
        'qwen2_vl', 'Qwen2VL', mean=CLIP_MEAN, std=CLIP_STD, template=QWEN2_VL_TEMPLATE, vision=vision
    )


def qwen2_5_vl() -> tuple[Any, Any, Any]:
    """A tiny Qwen2.5-VL: its model, processor and tokenizer."""
    # Qwen2.5-VL keeps Qwen2-VL's processor and chat template; its vision tower attends within windows
    # (window_size pixels) except in the full-attention blocks, and gates its MLP (SwiGLU).
    vision = {
        'depth': 2,
        'intermediate_size': INTERMEDIATE,
        'out_hidden_size': HIDDEN,
        'window_size': 4 * _QWEN_PATCH * 2,  # windows of 4 x 4 merged tokens, as the released 112 / 28
        'fullatt_block_indexes': [1],
    }
    return _qwen(
        'qwen2_5_vl', 'Qwen2_5_VL', mean=CLIP_MEAN, std=CLIP_STD, template=QWEN2_VL_TEMPLATE, vision=vision
    )


def qwen3_vl() -> tuple[Any, Any, Any]:
    """A tiny Qwen3-VL: its model, processor and tokenizer."""
    # Qwen3-VL: SigLIP-style normalisation, learnt position embeddings interpolated to each frame's
    # grid, features of earlier vision layers added into the first decoder layers (DeepStack), and
    # interleaved M-RoPE sections; no default system turn in its chat template.
    vision = {
        'depth': 2,
        'intermediate_size': INTERMEDIATE,
        'out_hidden_size': HIDDEN,
        'num_position_embeddings': 12 * 12,  # a 12 x 12 grid of learnt positions (48 px / 4)
        'deepstack_visual_indexes': [0],
    }
    return _qwen(
        'qwen3_vl',
        'Qwen3VL',
        mean=SIGLIP_MEAN,
        std=SIGLIP_STD,
        template=QWEN3_VL_TEMPLATE,
        vision=vision,
        mrope_interleaved=True,
    )
