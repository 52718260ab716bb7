"""The image processor's steps for a whole batch at once, on the model's device (PixelPath)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    'GRADIENT_PROCESSORS',
    'GRADIENT_TORCHVISION_PROCESSORS',
    'PIL_FILTERS',
    'PREPROCESS',
    'PROCESSORS',
    'REDUCING_GAP',
    'PixelPath',
    'differentiable_resize',
    'lanczos_resize',
    'pil_resizes_height_first',
]

#: How frames become pixel values: PixelPath ('batched') or the Hugging Face processor ('processor').
PREPROCESS = ('batched', 'processor')

#: PIL's `reducing_gap` for frames far larger than the model's input: PIL first shrinks them by an
#: integer factor with a box filter, then resamples as the processor does. Frames less than
#: 2 * REDUCING_GAP times the input size are resampled exactly as the processor does
#: (docs/performance.md gives the measured difference for larger ones).
REDUCING_GAP = 2.0

#: PIL's filters (Image.Resampling numbers) the torch resize follows, by name: bilinear and bicubic are
#: torch's antialiased interpolation (the same kernels, bicubic with a = -0.5, normalised at the edges as
#: PIL does); LANCZOS, which torch lacks, is PIL's own separable kernel (`lanczos_resize`).
PIL_FILTERS = {1: 'lanczos', 2: 'bilinear', 3: 'bicubic'}

#: PIL's Lanczos kernel reaches 3 input pixels either side (scaled by the downscale factor).
LANCZOS_SUPPORT = 3.0

#: The PIL image processors (class names less 'Pil') whose steps PixelPath reproduces for answers.
PROCESSORS = ('CLIPImageProcessor', 'BlipImageProcessor', 'SiglipImageProcessor')

#: Those whose steps PixelPath follows for gradients: Gemma 3's too (without pan-and-scan: a resize
#: to a square, rescale, normalise), whose PIL resize (no reducing gap) PixelPath.resize does not
#: follow to the bit on frames far larger than its input.
GRADIENT_PROCESSORS = (*PROCESSORS, 'Gemma3ImageProcessor')

#: The torchvision processors PixelPath follows for gradients (its uint8 resize, the width first).
GRADIENT_TORCHVISION_PROCESSORS = ('Gemma3ImageProcessor',)


@functools.cache
def _pillow_orders_passes() -> bool:
    """Whether the installed Pillow resamples the height first where the height loses far more than the
    width (Pillow 13, python-pillow/Pillow#9549; before it, the width first always): asked of Pillow
    itself on a 16 x 16 frame shrunk to 15 x 4, whose two orders round differently."""
    from PIL import Image

    frame = Image.fromarray((np.arange(256).reshape(16, 16) * 37 % 251).astype(np.uint8))
    both = np.asarray(frame.resize((15, 4), resample=3))
    width_first = np.asarray(frame.resize((15, 16), resample=3).resize((15, 4), resample=3))
    return not np.array_equal(both, width_first)


def pil_resizes_height_first(height: int, width: int, size: tuple[int, int]) -> bool:
    """Whether PIL resamples a (height, width) frame to `size` (height, width) height first.

    PIL rounds each pass to whole grey levels, so the order changes the pixels by over 20 levels on
    sharp frames. Pillow 13 takes the height first where the height shrinks by more than twice as many
    rows as the width loses columns (a width that grows loses none); measured on 572 random sizes,
    every one as Pillow 13.0 does it. Earlier Pillows take the width first always.
    """
    new_height, new_width = size
    if new_height >= height or new_width == width or not _pillow_orders_passes():
        return False
    return height - new_height > 2 * (width - new_width)


def differentiable_resize(
    pixels: Any, size: tuple[int, int], resample: int, *, height_first: bool | None = None
) -> Any:
    """Frames as a float tensor (N, 3, H, W) of 0..255 values resized to `size` (height, width) as PIL
    resizes them, differentiable in them; unchanged at `size`.

    PIL resizes a uint8 frame in two passes (in the order `pil_resizes_height_first` gives, unless
    `height_first` says otherwise: torchvision's uint8 resize takes the width first always), each
    clipped to 0..255 and rounded: here each pass is torch's antialiased interpolation with PIL's
    filter, or PIL's Lanczos kernel rebuilt (PIL_FILTERS; any other filter is taken as bilinear),
    clipped the same, not rounded. The values agree within PIL's rounding (about a grey level), not
    to the bit: the path serves gradients, never answers.
    """
    import torch.nn.functional as functional

    mode = PIL_FILTERS.get(int(resample), 'bilinear')
    height, width = size
    if height_first is None:
        height_first = pil_resizes_height_first(pixels.shape[-2], pixels.shape[-1], size)
    between = (height, pixels.shape[-1]) if height_first else (pixels.shape[-2], width)
    for shape in (between, (height, width)):
        if tuple(shape) == tuple(pixels.shape[-2:]):
            continue
        if mode == 'lanczos':
            pixels = lanczos_resize(pixels, shape)
        else:
            pixels = functional.interpolate(
                pixels, size=shape, mode=mode, antialias=True, align_corners=False
            )
        pixels = pixels.clamp(0, 255)
    return pixels


def _lanczos_weights(inputs: int, outputs: int) -> Any:
    """PIL's Lanczos weights (outputs, inputs) for one axis, as its `precompute_coeffs` takes them: the
    kernel stretched by the downscale factor (antialiasing), each output's window clipped to the frame
    and its weights normalised to sum to one. Float64, not PIL's 22-bit fixed point."""
    import torch

    scale = inputs / outputs
    stretch = max(scale, 1.0)
    support = LANCZOS_SUPPORT * stretch
    centres = (torch.arange(outputs, dtype=torch.float64) + 0.5) * scale
    # PIL's window: from int(centre - support + 0.5), at least 0, to int(centre + support + 0.5), at
    # most the frame (int truncates towards zero: the clamp makes floor the same here).
    first = torch.floor(centres - support + 0.5).clamp(min=0)
    last = torch.floor(centres + support + 0.5).clamp(max=inputs)
    positions = torch.arange(inputs, dtype=torch.float64)
    inside = (positions[None] >= first[:, None]) & (positions[None] < last[:, None])
    x = (positions[None] - centres[:, None] + 0.5) / stretch
    weights = torch.sinc(x) * torch.sinc(x / LANCZOS_SUPPORT)
    weights = torch.where(inside & (x >= -LANCZOS_SUPPORT) & (x < LANCZOS_SUPPORT), weights, 0.0)
    total = weights.sum(dim=1, keepdim=True)
    return weights / torch.where(total == 0, 1.0, total)


def lanczos_resize(pixels: Any, size: tuple[int, int]) -> Any:
    """Frames (N, C, H, W) resampled to `size` (height, width) with PIL's Lanczos kernel, each axis that
    changes in one pass (width, then height), neither clipped nor rounded: `differentiable_resize` orders
    the passes and clips them as PIL does. Differentiable in `pixels` (two matrix products)."""
    height, width = size
    if width != pixels.shape[-1]:
        weights = _lanczos_weights(pixels.shape[-1], width).to(pixels.device, pixels.dtype)
        pixels = pixels @ weights.T
    if height != pixels.shape[-2]:
        weights = _lanczos_weights(pixels.shape[-2], height).to(pixels.device, pixels.dtype)
        pixels = weights @ pixels
    return pixels


@dataclass(frozen=True)
class PixelPath:
    """The image processor's steps (resize, centre crop, rescale, normalise) for a whole batch at once.

    The Hugging Face processor converts every frame to PIL and back several times and normalises it
    in float64 on the CPU; this path resizes each uint8 frame once with PIL (the same filter, so the
    same pixels), crops by slicing, stacks the batch and rescales and normalises it in one tensor
    operation on the model's device. `from_processor` returns None for a processor whose steps it
    does not reproduce; the backend then calls the processor itself.

    Attributes:
        shortest_edge: resize so the shorter side is this long (aspect kept); 0 for a fixed size.
        size: fixed resize size (height, width) when shortest_edge is 0.
        crop: centre-crop size (height, width), or None.
        resample: PIL resampling filter.
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
        width_first: a torchvision processor's path (gradients alone: `resize` is PIL's): its uint8
            resize takes the width first whatever the sizes.
    """

    shortest_edge: int
    size: tuple[int, int]
    crop: tuple[int, int] | None
    resample: int
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    width_first: bool = False

    @classmethod
    def from_processor(
        cls, processor: Any, names: Sequence[str] = PROCESSORS, torchvision: Sequence[str] = ()
    ) -> PixelPath | None:
        """The path of a CLIP-, BLIP- or SigLIP-style image processor (or a processor holding it), or None.

        Args:
            processor: an image processor, or a processor holding one.
            names: the PIL processor classes (less 'Pil') taken; another class whose steps are these
                (OWL-ViT's: resize, crop, rescale, normalise) may be named for gradients alone.
            torchvision: the torchvision processor classes taken, for gradients alone (width_first).
        """
        ip = getattr(processor, 'image_processor', processor)
        # PixelPath resizes with PIL: it reproduces PIL image processors only, torchvision ones for
        # gradients (differentiable_pixel_values) where the caller names them.
        name = type(ip).__name__
        width_first = name in torchvision
        if not width_first and (not name.endswith('Pil') or name.removesuffix('Pil') not in names):
            return None
        size = dict(getattr(ip, 'size', None) or {})
        if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
            return None
        if getattr(ip, 'do_pad', False) or size.get('longest_edge') or getattr(ip, 'resample', None) is None:
            return None
        if getattr(ip, 'do_pan_and_scan', False):  # Gemma 3's crops: views the path does not make
            return None
        mean, std = list(ip.image_mean), list(ip.image_std)
        if len(mean) != 3 or len(std) != 3:
            return None
        shortest = int(size.get('shortest_edge') or 0)
        fixed = (int(size.get('height') or 0), int(size.get('width') or 0))
        if not shortest and not all(fixed):
            return None
        crop = None
        if getattr(ip, 'do_center_crop', False):
            crop_size = dict(ip.crop_size or {})
            crop = (int(crop_size.get('height') or 0), int(crop_size.get('width') or 0))
            # A crop larger than the resized frame would pad: left to the processor.
            if not all(crop) or max(crop) > (shortest or min(fixed)):
                return None
        scale = float(ip.rescale_factor)
        return cls(shortest, fixed, crop, int(ip.resample), scale, tuple(mean), tuple(std), width_first)

    @property
    def input_size(self) -> int:
        """Side of the square the model sees (the crop, else the resize size)."""
        return max(self.crop) if self.crop else (self.shortest_edge or max(self.size))

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize step, by the processor's own rule."""
        if not self.shortest_edge:
            return self.size
        short, long = min(height, width), max(height, width)
        new_long = int(self.shortest_edge * long / short)
        return (self.shortest_edge, new_long) if height <= width else (new_long, self.shortest_edge)

    def resize(self, frame: np.ndarray) -> np.ndarray:
        """One RGB uint8 frame resized and cropped as the processor would, still uint8 (H, W, 3)."""
        from PIL import Image

        height, width = self.resized_shape(*frame.shape[:2])
        if (height, width) != frame.shape[:2]:
            resized = Image.fromarray(frame).resize(
                (width, height), resample=self.resample, reducing_gap=REDUCING_GAP
            )
            frame = np.asarray(resized)
        if self.crop:
            top, left = (height - self.crop[0]) // 2, (width - self.crop[1]) // 2
            frame = frame[top : top + self.crop[0], left : left + self.crop[1]]
        return frame

    def pixel_values(self, frames: Sequence[np.ndarray], device: Any, dtype: Any) -> Any:
        """The batch's pixel_values tensor (N, 3, H, W) on `device` in `dtype`.

        The uint8 batch crosses to the device (a quarter of the float32 bytes) and is normalised there.
        """
        import torch

        batch = torch.from_numpy(np.stack([self.resize(f) for f in frames])).to(device)
        mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        pixels = batch.permute(0, 3, 1, 2).float().mul_(self.scale).sub_(mean).div_(std)
        return pixels.to(dtype).contiguous()

    def differentiable_pixel_values(self, pixels: Any, dtype: Any) -> Any:
        """pixel_values (N, 3, h, w) from frames given as a float tensor (N, 3, H, W) of 0..255 values,
        differentiable in them (gradient attribution, explain/attribution.py).

        The resize is `differentiable_resize`: close to PIL's, not the same to the bit, so it serves
        gradients, never answers.
        """
        import torch

        height, width = self.resized_shape(*pixels.shape[-2:])
        height_first = False if self.width_first else None  # None: PIL's own order
        pixels = differentiable_resize(pixels, (height, width), self.resample, height_first=height_first)
        if self.crop:
            top, left = (height - self.crop[0]) // 2, (width - self.crop[1]) // 2
            pixels = pixels[..., top : top + self.crop[0], left : left + self.crop[1]]
        mean = torch.tensor(self.mean, device=pixels.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=pixels.device).view(1, 3, 1, 1)
        return ((pixels * self.scale - mean) / std).to(dtype)
