"""Tiny random-weight VLMs of today's families (real configs and processors, shrunk), built offline."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.models.tiny import quiet_seeded
from metavlm_ros.models.tiny_florence import florence2
from metavlm_ros.models.tiny_qwen import qwen2_5_vl, qwen2_vl, qwen3_vl
from metavlm_ros.models.tiny_shapes import (
    CLIP_MEAN,
    CLIP_STD,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    PATCH,
    SIDE,
    SIGLIP_MEAN,
    SIGLIP_STD,
    VIT_B,
    decoder_shape,
    family_video_processor,
    siglip_shape,
)
from metavlm_ros.models.tiny_vocabularies import (
    GEMMA3_TEMPLATE,
    IDEFICS3_TEMPLATE,
    LLAVA_ONEVISION_TEMPLATE,
    LLAVA_TEMPLATE,
    PALIGEMMA_TEMPLATE,
    REQUIRED_WORDS,
    byte_level_tokenizer,
    check_vocabulary,
    metaspace_tokenizer,
)

__all__ = [
    'FAMILIES',
    'REQUIRED_WORDS',
    'TASK_PROMPT_FAMILIES',
    'VIDEO_FAMILIES',
    'build_base_vlm',
    'build_tiny_vlm',
    'save_tiny',
]


# -- families (Qwen: models/tiny_qwen.py; Florence-2: models/tiny_florence.py) -------------------------
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
    tokenizer = byte_level_tokenizer(
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
        image_mean=SIGLIP_MEAN,
        image_std=SIGLIP_STD,
    )
    # Pixel shuffle folds scale x scale patches into one token.
    image_seq_len = (side // patch) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=image_seq_len,
        chat_template=IDEFICS3_TEMPLATE,
    )
    return processor, tokenizer


def _idefics3() -> tuple[Any, Any, Any]:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    scale = 2
    processor, tokenizer = _idefics3_processor(SIDE, PATCH, scale, tiles=2)
    config = Idefics3Config(
        text_config={'model_type': 'llama', **decoder_shape(tokenizer)},
        vision_config={k: v for k, v in siglip_shape().items() if k != 'model_type'},
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids('<image>'),
    )
    return Idefics3ForConditionalGeneration(config), processor, tokenizer


def _gemma_tokenizer(specials: list[str], **kwargs: Any) -> Any:
    from transformers import GemmaTokenizer

    return metaspace_tokenizer(
        GemmaTokenizer, ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>'], specials, **kwargs
    )


def _paligemma() -> tuple[Any, Any, Any]:
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tokenizer = _gemma_tokenizer(['<image>'])
    image_processor = SiglipImageProcessorPil(
        size={'height': SIDE, 'width': SIDE}, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD
    )
    # PaliGemmaProcessor reads the number of image tokens from its image processor, as released.
    image_processor.image_seq_length = (SIDE // PATCH) ** 2
    processor = PaliGemmaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=PALIGEMMA_TEMPLATE
    )
    config = PaliGemmaConfig(
        text_config={'model_type': 'gemma', **decoder_shape(tokenizer), 'head_dim': HIDDEN // HEADS},
        vision_config=siglip_shape(projection_dim=HIDDEN),
        projection_dim=HIDDEN,
        hidden_size=HIDDEN,
        vocab_size=len(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
    )
    return PaliGemmaForConditionalGeneration(config), processor, tokenizer


def _llava() -> tuple[Any, Any, Any]:
    from transformers import LlamaTokenizer, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = metaspace_tokenizer(LlamaTokenizer, ['<unk>', '<s>', '</s>'], ['<image>'])
    tokenizer.pad_token = '<unk>'  # as llava-hf's Vicuna tokenizer
    image_processor = CLIPImageProcessorPil(
        size={'shortest_edge': SIDE},
        crop_size={'height': SIDE, 'width': SIDE},
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    # LLaVA-1.5 drops CLIP's class token ('default' strategy): the processor counts it (+1) then removes it.
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        chat_template=LLAVA_TEMPLATE,
        vision_feature_select_strategy='default',
        num_additional_image_tokens=1,
    )
    vision = {
        'model_type': 'clip_vision_model',
        'hidden_size': HIDDEN,
        'intermediate_size': INTERMEDIATE,
        'num_hidden_layers': 2,  # LLaVA reads the second-to-last layer
        'num_attention_heads': HEADS,
        'image_size': SIDE,
        'patch_size': PATCH,
        'projection_dim': HIDDEN,
    }
    config = LlavaConfig(
        text_config={'model_type': 'llama', **decoder_shape(tokenizer)},
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
        image_seq_length=(SIDE // PATCH) ** 2,
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
    tokenizer = byte_level_tokenizer(
        Qwen2Tokenizer, specials, eos_token='<|im_end|>', pad_token='<|endoftext|>'
    )
    # AnyRes: the frame is tiled on the best-fitting grid of these resolutions, plus a base view.
    pinpoints = [[SIDE, SIDE], [SIDE, 2 * SIDE], [2 * SIDE, SIDE], [2 * SIDE, 2 * SIDE]]
    image_processor = LlavaOnevisionImageProcessorPil(
        size={'height': SIDE, 'width': SIDE},
        image_grid_pinpoints=pinpoints,
        image_mean=SIGLIP_MEAN,
        image_std=SIGLIP_STD,
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=family_video_processor('llava_onevision', size={'height': SIDE, 'width': SIDE}),
        num_image_tokens=(SIDE // PATCH) ** 2,
        vision_feature_select_strategy='full',
        vision_aspect_ratio='anyres_max_9',
        chat_template=LLAVA_ONEVISION_TEMPLATE,
    )
    config = LlavaOnevisionConfig(
        text_config={'model_type': 'qwen2', **decoder_shape(tokenizer)},
        vision_config=siglip_shape(),
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
        size={'height': SIDE, 'width': SIDE}, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD
    )
    tokens_per_image = 4  # the 4 x 4 patch grid average-pooled to 2 x 2 soft tokens
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=tokens_per_image,
        chat_template=GEMMA3_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=decoder_shape(
            tokenizer, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS, sliding_window=64
        ),
        vision_config=siglip_shape(),
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
VIDEO_FAMILIES = ('qwen2_vl', 'qwen2_5_vl', 'qwen3_vl', 'llava_onevision')

#: The builder of each tiny family: a model, its processor and its tokenizer.
FAMILIES: dict[str, Callable[[], tuple[Any, Any, Any]]] = {
    'qwen2_vl': qwen2_vl,
    'qwen2_5_vl': qwen2_5_vl,
    'qwen3_vl': qwen3_vl,
    'idefics3': _idefics3,
    'paligemma': _paligemma,
    'llava': _llava,
    'llava_onevision': _llava_onevision,
    'gemma3': _gemma3,
}

#: The builder of each tiny family asked by task prompt instead of chat turns (kind detection only,
#: models/prompt_formats.py): a model, its processor and its tokenizer.
TASK_PROMPT_FAMILIES: dict[str, Callable[[], tuple[Any, Any, Any]]] = {'florence2': florence2}


def save_tiny(model: Any, processor: Any, directory: Path | str) -> Path:
    """Save a tiny model and its processor where Hugging Face loads them from (safetensors weights)."""
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
    and a chat template in the family's published layout (Florence-2, asked by task prompt: none).
    The directory loads with `AutoProcessor` / `AutoModelForImageTextToText` offline, and
    `transformers serve` can serve a chat family's.

    Args:
        family: one of FAMILIES: 'qwen2_vl', 'qwen2_5_vl', 'qwen3_vl', 'idefics3' (SmolVLM),
            'paligemma', 'llava', 'llava_onevision' or 'gemma3'; or of TASK_PROMPT_FAMILIES:
            'florence2'.
        directory: where to save; created when missing.
        seed: seed of the weight initialisation; the same seed gives the same weights (None: the
            caller has seeded torch, as build_tiny_model does).

    Returns:
        The directory, as a Path.

    Raises:
        ParameterError: an unknown family.
    """
    builders = {**FAMILIES, **TASK_PROMPT_FAMILIES}
    if family not in builders:
        raise ParameterError(f'unknown tiny VLM family {family!r}; valid families: {", ".join(builders)}')
    if family in VIDEO_FAMILIES and importlib.util.find_spec('torchvision') is None:
        raise ModelError(
            f'{family} needs torchvision: transformers builds its processor with a video processor, '
            'which requires torchvision even for images'
        )
    with quiet_seeded(seed):
        model, processor, tokenizer = builders[family]()
        check_vocabulary(tokenizer)
        # A trained chat model ends its answer with its end-of-turn token and never writes chat markers
        # or padding inside it; a random one would, and `transformers serve` parses a Qwen answer at
        # those markers. Its generation config keeps them out of answers (every generate() reads it),
        # unless the family's builder chose (Florence-2 answers in special tokens).
        if not model.generation_config.suppress_tokens:
            model.generation_config.suppress_tokens = [
                i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id
            ]
        return save_tiny(model, processor, directory)


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
        vision = {**VIT_B, 'image_size': 512, 'patch_size': 16}
        config = Idefics3Config(
            text_config=text,
            vision_config=vision,
            scale_factor=4,
            image_token_id=tokenizer.convert_tokens_to_ids('<image>'),
            tie_word_embeddings=False,
        )
        return save_tiny(Idefics3ForConditionalGeneration(config), processor, directory)
