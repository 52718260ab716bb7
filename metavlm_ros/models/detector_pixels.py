"""The open-vocabulary detectors' image processors in torch, differentiable in a frame's pixels: OWL-ViT's,
OWLv2's and Grounding DINO's PIL processors step for step, for gradient attribution (docs/explain.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metavlm_ros.models.pixel_path import PIL_FILTERS, PixelPath, differentiable_resize

__all__ = ['DETECTOR_PIXEL_PATHS', 'GroundingPixelPath', 'SquarePixelPath', 'detector_pixel_path']

#: A frame batch as a float tensor (N, 3, H, W) of 0..255 values and the model's dtype -> its image inputs.
PixelInputs = Callable[[Any, Any], dict[str, Any]]

#: scipy.ndimage.gaussian_filter's default truncate: the kernel reaches 4 standard deviations.
_TRUNCATE = 4.0


def _steps(ip: Any) -> tuple[float, tuple[float, ...], tuple[float, ...]] | None:
    """Rescale factor, mean and std of a processor that resizes, rescales and normalises; else None."""
    if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
        return None
    mean, std = tuple(ip.image_mean), tuple(ip.image_std)
    if len(mean) != 3 or len(std) != 3:
        return None
    return float(ip.rescale_factor), mean, std


def _normalised(pixels: Any, scale: float, mean: tuple, std: tuple) -> Any:
    import torch

    mean_ = torch.tensor(mean, dtype=pixels.dtype, device=pixels.device).view(1, 3, 1, 1)
    std_ = torch.tensor(std, dtype=pixels.dtype, device=pixels.device).view(1, 3, 1, 1)
    return (pixels * scale - mean_) / std_


def _gaussian(values: Any, axis: int, sigma: float) -> Any:
    """scipy.ndimage.gaussian_filter1d along `axis`, mode 'mirror' (torch's 'reflect'), truncate 4."""
    import torch
    import torch.nn.functional as functional

    radius = int(_TRUNCATE * sigma + 0.5)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 / sigma**2 * offsets**2)
    kernel = (kernel / kernel.sum()).to(values.dtype).to(values.device)
    moved = values.movedim(axis, -1)
    rows = functional.pad(moved.reshape(-1, 1, moved.shape[-1]), (radius, radius), mode='reflect')
    return functional.conv1d(rows, kernel.view(1, 1, -1)).reshape(moved.shape).movedim(-1, axis)


def _linear(values: Any, axis: int, size: int) -> Any:
    """scipy.ndimage.zoom's order-1 resampling along `axis` to `size`, grid_mode=True, mode 'mirror':
    output pixel i reads input position (i + 0.5) * n / size - 0.5, mirrored about the edge pixels."""
    import torch

    n = values.shape[axis]
    at = ((torch.arange(size, dtype=torch.float64) + 0.5) * (n / size) - 0.5).abs()
    at = torch.where(at > n - 1, 2 * (n - 1) - at, at) if n > 1 else torch.zeros_like(at)
    low = at.floor().long().clamp(0, n - 1)
    high = (low + 1).clamp(max=n - 1)
    shape = [1] * values.dim()
    shape[axis] = size
    weight = (at - low).to(values.dtype).to(values.device).view(shape)
    low, high = low.to(values.device), high.to(values.device)
    return values.index_select(axis, low) * (1 - weight) + values.index_select(axis, high) * weight


@dataclass(frozen=True)
class SquarePixelPath:
    """OWLv2's processor: rescale, pad to a square (bottom and right, zeros), scikit-image's resize as
    transformers does it (a Gaussian of sigma (factor - 1) / 2 against aliasing, then linear
    resampling, both mirrored at the edges; clipped to the padded frame's range), normalise. All in
    float64, as scipy computes: the same pixel values within float32 rounding (test/models/backends).

    Attributes:
        size: the model's input (height, width).
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    size: tuple[int, int]
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_processor(cls, ip: Any) -> SquarePixelPath | None:
        size = dict(getattr(ip, 'size', None) or {})
        steps = _steps(ip)
        if steps is None or not getattr(ip, 'do_pad', False):
            return None
        if not (size.get('height') and size.get('width')):
            return None
        return cls((int(size['height']), int(size['width'])), *steps)

    def __call__(self, pixels: Any, dtype: Any) -> dict[str, Any]:
        import torch
        import torch.nn.functional as functional

        values = pixels.double() * self.scale
        height, width = values.shape[-2:]
        side = max(height, width)
        values = functional.pad(values, (0, side - width, 0, side - height))
        low = values.amin(dim=(1, 2, 3), keepdim=True)
        high = values.amax(dim=(1, 2, 3), keepdim=True)
        for axis, target in ((2, self.size[0]), (3, self.size[1])):
            sigma = max(0.0, (side / target - 1) / 2)
            if sigma > 1e-15:  # scipy filters only the axes whose sigma is above this
                values = _gaussian(values, axis, sigma)
        values = _linear(_linear(values, 2, self.size[0]), 3, self.size[1])
        values = torch.minimum(torch.maximum(values, low), high)
        return {'pixel_values': _normalised(values, 1.0, self.mean, self.std).to(dtype)}


@dataclass(frozen=True)
class GroundingPixelPath:
    """Grounding DINO's processor: resize keeping the aspect (the shorter side to `shortest_edge`, the
    longer at most `longest_edge`, transformers' own rule), rescale, normalise; one frame size a batch,
    so nothing is padded and the pixel mask is whole. The resize is `differentiable_resize`: PIL's
    filter in torch, within PIL's 8-bit rounding of it (exact where the frame is not resized).

    Attributes:
        shortest_edge, longest_edge: the resize rule's sides.
        resample: PIL filter number (PIL_FILTERS).
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    shortest_edge: int
    longest_edge: int
    resample: int
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_processor(cls, ip: Any) -> GroundingPixelPath | None:
        size = dict(getattr(ip, 'size', None) or {})
        steps = _steps(ip)
        resample = getattr(ip, 'resample', None)
        if steps is None or resample is None or int(resample) not in PIL_FILTERS:
            return None
        if not (size.get('shortest_edge') and size.get('longest_edge')):
            return None
        return cls(int(size['shortest_edge']), int(size['longest_edge']), int(resample), *steps)

    def __call__(self, pixels: Any, dtype: Any) -> dict[str, Any]:
        import torch
        from transformers.image_transforms import get_size_with_aspect_ratio

        size = get_size_with_aspect_ratio(tuple(pixels.shape[-2:]), self.shortest_edge, self.longest_edge)
        values = differentiable_resize(pixels.float(), size, self.resample)
        values = _normalised(values, self.scale, self.mean, self.std).to(dtype)
        mask = torch.ones((len(values), *size), dtype=torch.long, device=values.device)
        return {'pixel_values': values, 'pixel_mask': mask}


def _owlvit(ip: Any) -> PixelInputs | None:
    # OWL-ViT's steps are CLIP's (resize to its square, centre crop, rescale, normalise).
    path = PixelPath.from_processor(ip, names=('OwlViTImageProcessor',))
    if path is None or path.resample not in PIL_FILTERS:
        return None
    return lambda pixels, dtype: {'pixel_values': path.differentiable_pixel_values(pixels.float(), dtype)}


#: The PIL image processor classes a differentiable path follows, each with what builds it (None: the
#: processor's settings are outside what the path reproduces).
DETECTOR_PIXEL_PATHS: dict[str, Callable[[Any], PixelInputs | None]] = {
    'OwlViTImageProcessorPil': _owlvit,
    'Owlv2ImageProcessorPil': SquarePixelPath.from_processor,
    'GroundingDinoImageProcessorPil': GroundingPixelPath.from_processor,
}


def detector_pixel_path(processor: Any) -> PixelInputs | None:
    """The model's image inputs from a frame batch's pixels, differentiable in them, or None.

    Args:
        processor: the detector's processor, or its image processor.

    Returns:
        (pixels, dtype) -> the model's image inputs (pixel_values, and Grounding DINO's pixel_mask),
        for frames given as a float tensor (N, 3, H, W) of 0..255 values, all of one size. None for a
        processor none of DETECTOR_PIXEL_PATHS follows (the torchvision ones: they resize otherwise).
    """
    ip = getattr(processor, 'image_processor', processor)
    build = DETECTOR_PIXEL_PATHS.get(type(ip).__name__)
    return build(ip) if build is not None else None
