"""Tiny random-weight SigLIP and SigLIP 2 models (real configs and processors, shrunk), built offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.tiny import quiet_seeded, t5_tokenizer
from metavlm_ros.models.tiny_families import save_tiny
from metavlm_ros.models.tiny_shapes import HEADS, HIDDEN, INTERMEDIATE, PATCH, SIDE, SIGLIP_MEAN, SIGLIP_STD
from metavlm_ros.models.tiny_vocabularies import metaspace_tokenizer

__all__ = ['build_tiny_siglip']


def _siglip(version: int) -> tuple[Any, Any]:
    """SigLIP (fixed 32 x 32 input) or SigLIP 2 (NaFlex: aspect kept, at most 256 patches of 16)."""
    shape = {
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
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
            text_config=text, vision_config={**shape, 'image_size': SIDE, 'patch_size': PATCH}
        )
        image_processor = SiglipImageProcessorPil(
            size={'height': SIDE, 'width': SIDE}, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD
        )
        return SiglipModel(config), SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer)
    from transformers import Siglip2Config, Siglip2Model, Siglip2Processor, Siglip2Tokenizer
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    # SigLIP 2's tokenizer is Gemma's with lower-casing: the same SentencePiece-style BPE here.
    tokenizer = metaspace_tokenizer(
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
        patch_size=patch, max_num_patches=max_patches, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD
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
        return save_tiny(model, processor, directory)
