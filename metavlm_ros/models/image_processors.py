"""Which of its family's image processors (PIL or torchvision) a model's frames go through."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.models.model_files import offline_transformers
from metavlm_ros.models.options import Option

__all__ = [
    'IMAGE_PROCESSORS',
    'IMAGE_PROCESSOR_OPTION',
    'crops_frames',
    'image_processor_class',
    'input_side',
    'load_image_processor',
]

#: The image processors transformers has for a family: its PIL one and its torchvision ("fast") one.
#: transformers picks torchvision whenever it is installed; metavlm_ros picks what the option says, so a
#: model answers the same with or without torchvision installed unless asked otherwise.
IMAGE_PROCESSORS = ('pil', 'torchvision')


#: Which of its family's image processors a model's frames go through (identity: it changes answers).
IMAGE_PROCESSOR_OPTION = Option(
    'image_processor',
    str,
    'pil',
    "the family's image processor: 'pil' (transformers' reference one, the same with or without "
    "torchvision) or 'torchvision' (its fast one, which transformers picks when torchvision is "
    'installed); the class used is recorded in the results',
    choices=IMAGE_PROCESSORS,
    identity=True,
)


def _backend_of(image_processor: Any) -> str:
    """'pil' or 'torchvision': the backend an image processor instance computes with."""
    try:
        from transformers.image_processing_backends import PilBackend, TorchvisionBackend
    except ImportError:  # a transformers without backend classes: their names say it
        return 'pil' if type(image_processor).__name__.endswith('Pil') else 'torchvision'
    if isinstance(image_processor, TorchvisionBackend):
        return 'torchvision'
    if isinstance(image_processor, PilBackend):
        return 'pil'
    return 'pil' if type(image_processor).__name__.endswith('Pil') else 'torchvision'


def load_image_processor(model_dir: str, choice: str) -> Any:
    """The model's image processor computing with `choice` ('pil' or 'torchvision'), exactly that one.

    Raises:
        ParameterError: `choice` is not one of IMAGE_PROCESSORS, or 'torchvision' without torchvision.
        ModelError: the model has no image processor, or its family none of that kind (transformers
            would fall back to the other one, which would answer differently than asked).
    """
    if choice not in IMAGE_PROCESSORS:
        raise ParameterError(f'image_processor must be one of {", ".join(IMAGE_PROCESSORS)}, got {choice!r}')
    if choice == 'torchvision' and importlib.util.find_spec('torchvision') is None:
        raise ParameterError("image_processor 'torchvision' needs torchvision, which is not installed")
    transformers = offline_transformers()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the fallback warning is turned into a refusal below
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False, backend=choice
        )
    except (OSError, ImportError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f'cannot load the image processor of {model_dir}: {first}') from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    if _backend_of(processor) != choice:
        raise ModelError(
            f'{model_dir}: its family has no {choice} image processor (transformers offers '
            f'{type(processor).__name__}); set image_processor to {_backend_of(processor)}'
        )
    return processor


def image_processor_class(model_dir: str | None, choice: str) -> str | None:
    """The class name of the image processor `load_image_processor` gives (None: no model directory
    or none loads), for identity records: read from the processor's config, without the weights."""
    if not model_dir or not (Path(model_dir) / 'config.json').is_file():
        return None
    try:
        return type(load_image_processor(model_dir, choice)).__name__
    except (ModelError, ParameterError):
        return None


def input_side(processor: Any) -> int:
    """The longer side, in pixels, the processor brings an image to, from its own size rules.

    Qwen2-VL (dynamic resolution): the side of a square image of at most max_pixels whose side is a
    multiple of patch_size * merge_size. Idefics3 / SmolVLM (image splitting): size['longest_edge'],
    the frame's resized longer side before it is cut into tiles; without splitting, the one square
    tile (max_image_size). LLaVA-OneVision (AnyRes): the
    largest grid pinpoint. Fixed-size processors (PaliGemma, LLaVA, Gemma 3): the crop or resize
    size. 0 when the processor states none of these.
    """
    ip = getattr(processor, 'image_processor', processor)
    max_pixels = getattr(ip, 'max_pixels', None)
    if not max_pixels and getattr(ip, 'merge_size', None):
        # transformers 5 keeps Qwen2-VL's pixel budget as size = {shortest_edge: min_pixels,
        # longest_edge: max_pixels}: areas, not sides.
        max_pixels = dict(getattr(ip, 'size', None) or {}).get('longest_edge')
    if max_pixels:
        factor = int(getattr(ip, 'patch_size', 14) or 14) * int(getattr(ip, 'merge_size', 2) or 2)
        return int(math.isqrt(int(max_pixels)) // factor * factor)
    tile = dict(getattr(ip, 'max_image_size', None) or {}).get('longest_edge')
    if tile and getattr(ip, 'do_image_splitting', None) is False:
        # Idefics3 without splitting squares every frame to one tile: that tile is all it sees.
        return int(tile)
    pinpoints = getattr(ip, 'image_grid_pinpoints', None)
    if pinpoints:
        return int(max(max(p) for p in pinpoints))
    sizes = [dict(getattr(ip, name, None) or {}) for name in ('crop_size', 'size')]
    if not getattr(ip, 'do_center_crop', False):
        sizes = sizes[1:]
    for size in sizes:
        side = size.get('longest_edge') or max(size.get('height') or 0, size.get('width') or 0)
        side = side or size.get('shortest_edge')
        if side:
            return int(side)
    return 0


def crops_frames(processor: Any) -> bool:
    """Whether the processor cuts part of a frame away: a centre crop other than to the very size it
    resized to (LLaVA-1.5's CLIP processor: the shorter side to 336, then the middle 336 x 336), so
    positions in its input are not fractions of the whole frame. Squashing processors (PaliGemma,
    Florence-2: every frame to one square) and tiling ones keep the whole frame."""
    ip = getattr(processor, 'image_processor', processor)
    if not getattr(ip, 'do_center_crop', False):
        return False
    size, crop = dict(getattr(ip, 'size', None) or {}), dict(getattr(ip, 'crop_size', None) or {})
    squashed = bool(getattr(ip, 'do_resize', True)) and 'height' in size and 'width' in size
    return not (squashed and (size['height'], size['width']) == (crop.get('height'), crop.get('width')))
