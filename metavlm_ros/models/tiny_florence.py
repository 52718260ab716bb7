"""A tiny random-weight Florence-2 (its real config, processor and token layout, shrunk), built offline."""

from __future__ import annotations

from typing import Any

from metavlm_ros.models.tiny_shapes import HEADS, HIDDEN, INTERMEDIATE
from metavlm_ros.models.tiny_vocabularies import byte_level_tokenizer

__all__ = ['FLORENCE2_SIDE', 'FLORENCE2_TOKENS', 'florence2']

#: The tokens Florence-2 adds to BART's vocabulary, in its tokenizer's order: region markers, the 1000
#: location bins (`<loc_N>`, x and y alike), the task markers, then the image placeholder (the
#: released ids run from 50265, `<image>` at 51289: Florence2Config's default image_token_id).
FLORENCE2_TOKENS = (
    '<od>',
    '</od>',
    '<ocr>',
    '</ocr>',
    *(f'<loc_{n}>' for n in range(1000)),
    '<cap>',
    '</cap>',
    '<ncap>',
    '</ncap>',
    '<dcap>',
    '</dcap>',
    '<grounding>',
    '</grounding>',
    '<seg>',
    '</seg>',
    '<sep>',
    '<region_cap>',
    '</region_cap>',
    '<region_to_desciption>',  # sic, as released
    '</region_to_desciption>',
    '<proposal>',
    '</proposal>',
    '<poly>',
    '</poly>',
    '<and>',
    '<image>',
)

#: The tiny processor's square input: DaViT's four stages divide a side by 32, so 64 px give a 2 x 2
#: grid of image tokens plus the one temporal token (5; the released 768 px give 24 x 24 + 1 = 577).
FLORENCE2_SIDE = 64

# The released processor's parse settings (post_processor_config): every parse task it knows.
_POST_PROCESSOR_CONFIG = {
    'ocr': {'pattern': None, 'area_threshold': 0.0},
    'phrase_grounding': {'banned_grounding_tokens': []},
    'pure_text': {},
    'description_with_bboxes': {},
    'description_with_polygons': {},
    'polygons': {},
    'bboxes': {},
    'description_with_bboxes_or_polygons': {},
}


def florence2() -> tuple[Any, Any, Any]:
    """A tiny Florence-2: a DaViT vision tower of four one-block stages and a one-layer BART, the
    processor squashing every frame to a FLORENCE2_SIDE square (as the released one squashes to 768 x
    768: no crop, so the location bins span the whole frame), a byte-level BART tokenizer holding
    FLORENCE2_TOKENS as special tokens."""
    from transformers import (
        BartTokenizer,
        Florence2Config,
        Florence2ForConditionalGeneration,
        Florence2Processor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = byte_level_tokenizer(
        BartTokenizer, list(FLORENCE2_TOKENS), extra_special_tokens={'image_token': '<image>'}
    )
    image_processor = CLIPImageProcessorPil(
        size={'height': FLORENCE2_SIDE, 'width': FLORENCE2_SIDE},
        do_center_crop=False,
        crop_size={'height': FLORENCE2_SIDE, 'width': FLORENCE2_SIDE},
        image_mean=[0.485, 0.456, 0.406],  # ImageNet's, as released
        image_std=[0.229, 0.224, 0.225],
    )
    image_processor.image_seq_length = (FLORENCE2_SIDE // 32) ** 2 + 1
    processor = Florence2Processor(
        image_processor=image_processor, tokenizer=tokenizer, post_processor_config=_POST_PROCESSOR_CONFIG
    )
    ids = {
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
        'decoder_start_token_id': tokenizer.eos_token_id,  # BART starts decoding at </s>
        'forced_eos_token_id': tokenizer.eos_token_id,
    }
    text = {
        'model_type': 'bart',
        'vocab_size': len(tokenizer),
        'd_model': HIDDEN,
        'encoder_layers': 1,
        'decoder_layers': 1,
        'encoder_attention_heads': HEADS,
        'decoder_attention_heads': HEADS,
        'encoder_ffn_dim': INTERMEDIATE,
        'decoder_ffn_dim': INTERMEDIATE,
        'max_position_embeddings': 1024,  # as released: room for DETECTION_MAX_NEW_TOKENS
        **ids,
    }
    vision = {
        'depths': [1, 1, 1, 1],
        'patch_size': [7, 3, 3, 3],
        'patch_stride': [4, 2, 2, 2],
        'patch_padding': [3, 1, 1, 1],
        'patch_prenorm': [False, True, True, True],
        'embed_dim': [HIDDEN // 4, HIDDEN // 2, HIDDEN // 2, HIDDEN],
        'num_heads': [1, 1, HEADS, HEADS],
        'num_groups': [1, 1, HEADS, HEADS],
        'window_size': 2,
        'projection_dim': HIDDEN,
        'drop_path_rate': 0.0,
    }
    config = Florence2Config(
        text_config=text, vision_config=vision, image_token_id=tokenizer.convert_tokens_to_ids('<image>')
    )
    model = Florence2ForConditionalGeneration(config)
    # A trained Florence-2 writes its answer in words and <loc_N> tokens between <s> and </s> (the
    # released answers start </s><s>), never the image placeholder or padding; a random one would
    # (build_tiny_vlm leaves a builder's suppress_tokens be).
    model.generation_config.forced_bos_token_id = tokenizer.bos_token_id
    model.generation_config.suppress_tokens = [tokenizer.image_token_id, tokenizer.pad_token_id]
    return model, processor, tokenizer
