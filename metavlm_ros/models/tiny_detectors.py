"""Tiny random-weight open-vocabulary detectors (OWL-ViT, OWLv2, Grounding DINO, MM Grounding DINO):
the real configs and processors, shrunk, with tokenizers laid out as the released ones, built offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.tiny import bert_tokenizer, clip_tokenizer, quiet_seeded
from metavlm_ros.models.tiny_families import save_tiny
from metavlm_ros.models.tiny_shapes import (
    CLIP_MEAN,
    CLIP_STD,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    PATCH,
    SIDE,
    VIT_B,
)

__all__ = ['DETECTOR_FAMILIES', 'build_base_owlv2', 'build_tiny_detector']

#: The families a tiny detector is built of (config.json model_type).
DETECTOR_FAMILIES = ('owlvit', 'owlv2', 'grounding-dino', 'mm-grounding-dino')

#: OWL's text tower reads 16 tokens, padded to them (the released configs' max_position_embeddings).
OWL_TEXT_LENGTH = 16
#: The token ids Grounding DINO's text masks split phrases at are bert-base-uncased's, fixed in
#: transformers (modeling_grounding_dino.SPECIAL_TOKENS): [CLS], [SEP], '.', '?'.
BERT_IDS = {'[PAD]': 0, '[UNK]': 100, '[CLS]': 101, '[SEP]': 102, '[MASK]': 103, '.': 1012, '?': 1029}
#: The Grounding DINO image side: Swin's four stages and the extra level (stride 64) need frames of at
#: least 64 px for the last feature map to hold more than one value per group norm channel.
GD_SHORT, GD_LONG = 64, 128


def owl_tokenizer() -> Any:
    """CLIP's byte-level BPE laid out as the released OWL-ViT tokenizer: bytes first ('!' = 0, the
    padding), start and end of text last, so that OWL's query mask (first id > 0) and its pooling
    (the end token holds the largest id) work as on the released models."""
    from transformers import CLIPTokenizerFast

    base = clip_tokenizer()
    model = json.loads(base.backend_tokenizer.to_str())['model']
    specials = ['<|startoftext|>', '<|endoftext|>']
    ordered = sorted(model['vocab'].items(), key=lambda item: item[1])
    tokens = [token for token, _ in ordered if token not in specials] + specials
    merges = [tuple(m.split(' ')) if isinstance(m, str) else tuple(m) for m in model['merges']]
    return CLIPTokenizerFast(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=merges,
        model_max_length=OWL_TEXT_LENGTH,
        pad_token='!',
    )


def grounding_tokenizer() -> Any:
    """BERT's WordPiece with the tiny vocabulary, its special tokens and '.' at bert-base-uncased's ids."""
    from transformers import BertTokenizerFast

    words = [t for t in bert_tokenizer().get_vocab() if t not in BERT_IDS and not t.startswith('[')]
    tokens = [f'[unused{i}]' for i in range(max(BERT_IDS.values()) + 1)]
    for token, index in BERT_IDS.items():
        tokens[index] = token
    tokens += sorted(words)
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, model_max_length=256)


def _shape() -> dict:
    return {
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 1,
        'num_attention_heads': HEADS,
    }


#: The released OWL text tower's shape (the vision tower is a ViT-B/16), for `build_base_owlv2`.
OWL_TEXT_B = {
    'hidden_size': 512,
    'intermediate_size': 2048,
    'num_hidden_layers': 12,
    'num_attention_heads': 8,
}


def _owl(
    family: str, *, text_shape: dict | None = None, vision_shape: dict | None = None, side: int = SIDE,
    patch: int = PATCH, projection: int = HIDDEN,
) -> tuple[Any, Any]:  # fmt: skip
    import torch
    import transformers

    tokenizer = owl_tokenizer()
    text = {
        **(text_shape or _shape()),
        'vocab_size': len(tokenizer),
        'max_position_embeddings': OWL_TEXT_LENGTH,
        'bos_token_id': tokenizer.bos_token_id,
        'eos_token_id': tokenizer.eos_token_id,
        'pad_token_id': tokenizer.pad_token_id,
    }
    vision = {**(vision_shape or _shape()), 'image_size': side, 'patch_size': patch}
    size = {'height': side, 'width': side}
    if family == 'owlvit':
        from transformers.models.owlvit.image_processing_pil_owlvit import OwlViTImageProcessorPil

        # OWL-ViT stretches the frame to its square input (no crop: the released 768 x 768 both).
        images = OwlViTImageProcessorPil(size=size, crop_size=size, image_mean=CLIP_MEAN, image_std=CLIP_STD)
        config_class, model_class, processor_class = (
            transformers.OwlViTConfig,
            transformers.OwlViTForObjectDetection,
            transformers.OwlViTProcessor,
        )
    else:
        from transformers.models.owlv2.image_processing_pil_owlv2 import Owlv2ImageProcessorPil

        # OWLv2 pads the frame to a square (bottom and right) before resizing it to its input.
        images = Owlv2ImageProcessorPil(size=size, image_mean=CLIP_MEAN, image_std=CLIP_STD)
        config_class, model_class, processor_class = (
            transformers.Owlv2Config,
            transformers.Owlv2ForObjectDetection,
            transformers.Owlv2Processor,
        )
    # The class head projects the image patches to the text embedding: the projection is the text width.
    config = config_class(text_config=text, vision_config=vision, projection_dim=projection)
    model = model_class(config)
    # Random weights push every box to a degenerate corner; a box head whose last layer is small
    # answers boxes near their patch's prior (box_bias), as a trained one answers near its patch.
    with torch.no_grad():
        model.box_head.dense2.weight.mul_(0.01)
        model.box_head.dense2.bias.zero_()
    return model, processor_class(image_processor=images, tokenizer=tokenizer)


def _grounding(family: str) -> tuple[Any, Any]:
    import transformers
    from transformers.models.grounding_dino.image_processing_pil_grounding_dino import (
        GroundingDinoImageProcessorPil,
    )

    tokenizer = grounding_tokenizer()
    swin = {
        'model_type': 'swin',
        'embed_dim': 8,
        'depths': [1, 1, 1, 1],
        'num_heads': [1, 1, 1, 1],
        'window_size': 2,
        'patch_size': 4,
        'image_size': GD_LONG,
        'out_indices': [2, 3, 4],
    }
    bert = {
        'model_type': 'bert',
        **_shape(),
        'vocab_size': len(tokenizer),
        'max_position_embeddings': 256,
        'pad_token_id': tokenizer.pad_token_id,
    }
    config_class, model_class = (
        (transformers.GroundingDinoConfig, transformers.GroundingDinoForObjectDetection)
        if family == 'grounding-dino'
        else (transformers.MMGroundingDinoConfig, transformers.MMGroundingDinoForObjectDetection)
    )
    config = config_class(
        backbone_config=swin,
        text_config=bert,
        d_model=HIDDEN,
        encoder_layers=1,
        decoder_layers=2,  # the box heads of layers 1.. are tied to layer 0's: at least two layers
        encoder_ffn_dim=INTERMEDIATE,
        decoder_ffn_dim=INTERMEDIATE,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_n_points=2,
        decoder_n_points=2,
        num_queries=16,
        max_text_len=256,
    )
    images = GroundingDinoImageProcessorPil(size={'shortest_edge': GD_SHORT, 'longest_edge': GD_LONG})
    processor = transformers.GroundingDinoProcessor(image_processor=images, tokenizer=tokenizer)
    return model_class(config), processor


def build_tiny_detector(directory: Path | str, family: str = 'owlv2', seed: int | None = 0) -> Path:
    """Build, randomly initialise and save a tiny detector of a family (DETECTOR_FAMILIES).

    Args:
        directory: where to save; created when missing.
        family: a config.json model_type of DETECTOR_FAMILIES.
        seed: seed of the weight initialisation (None: the caller's generator).

    Returns:
        The directory, as a Path.

    Raises:
        ParameterError: an unknown family.
    """
    if family not in DETECTOR_FAMILIES:
        raise ParameterError(f'detector family must be one of {", ".join(DETECTOR_FAMILIES)}, got {family!r}')
    with quiet_seeded(seed):
        model, processor = _owl(family) if family.startswith('owl') else _grounding(family)
        return save_tiny(model, processor, directory)


def build_base_owlv2(directory: Path | str, seed: int | None = 0) -> Path:
    """Build and save a random-initialised OWLv2 of the released base model's shape, for benchmarks.

    From memory of google/owlv2-base-patch16-ensemble's config (not checked against the file, which is
    not on this machine): a ViT-B/16 vision tower (768 wide, 12 layers, 12 heads, MLP 3072) on a
    960 x 960 padded square (3,600 patches, each a box and a class embedding), a text tower 512 wide
    (12 layers, 8 heads, MLP 2048) reading 16 tokens, projection 512. Timing does not depend on the
    weights; the tokenizer is the tiny OWL one (its ids fall inside the vocabulary).
    """
    with quiet_seeded(seed):
        model, processor = _owl(
            'owlv2', text_shape=OWL_TEXT_B, vision_shape=VIT_B, side=960, patch=16, projection=512
        )
        return save_tiny(model, processor, directory)
