"""LLaVA-OneVision's AnyRes image processor in torch, base view and grid tiles, differentiable in pixels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from metavlm_ros.models.pixel_path import PIL_FILTERS, differentiable_resize

__all__ = ['ANYRES_PROCESSORS', 'AnyResPixelPath']

#: The PIL image processor classes (less 'Pil') whose steps AnyResPixelPath reproduces.
ANYRES_PROCESSORS = ('LlavaOnevisionImageProcessor',)


@dataclass(frozen=True)
class AnyResPixelPath:
    """LLaVA-OneVision's PIL processor step for step (one image a prompt, as the chat backend asks):
    the grid resolution that keeps most of the frame and wastes least (`select_best_resolution`), the
    frame resized into it keeping its aspect and padded with black to it, centred, cut into tiles of
    the vision tower's side row by row, after the whole frame resized to one tile (the base view);
    rescale, normalise.

    The resizes are `differentiable_resize` in PIL's order of passes, not rounded, so the path lies
    within PIL's rounding of the processor's pixels (docs/explain.md gives the measured figure): it
    serves gradients, never answers. The torchvision processor is left to occlusion.

    Attributes:
        side: the tile side and the base view's (size['height'], size['width'] alike).
        pinpoints: the grid resolutions (height, width) the processor chooses among.
        resample: PIL filter number (PIL_FILTERS).
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    side: int
    pinpoints: tuple[tuple[int, int], ...]
    resample: int
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_processor(cls, processor: Any) -> AnyResPixelPath | None:
        """The path of a LLaVA-OneVision PIL image processor (or a processor holding one), or None for
        any other processor or settings outside what the path reproduces (a crop, a non-square view)."""
        ip = getattr(processor, 'image_processor', processor)
        name = type(ip).__name__
        if not name.endswith('Pil') or name.removesuffix('Pil') not in ANYRES_PROCESSORS:
            return None
        if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
            return None
        size = dict(ip.size or {})
        side = int(size.get('height') or 0)
        resample = getattr(ip, 'resample', None)
        mean, std = list(ip.image_mean), list(ip.image_std)
        if not side or int(size.get('width') or 0) != side or getattr(ip, 'do_center_crop', False):
            return None
        if resample is None or int(resample) not in PIL_FILTERS or len(mean) != 3 or len(std) != 3:
            return None
        pinpoints = tuple((int(h), int(w)) for h, w in ip.image_grid_pinpoints)
        if not pinpoints or any(h % side or w % side for h, w in pinpoints):
            return None
        return cls(side, pinpoints, int(resample), float(ip.rescale_factor), tuple(mean), tuple(std))

    def best_resolution(self, height: int, width: int) -> tuple[int, int]:
        """The grid resolution (height, width) a (height, width) frame is tiled at: the processor's
        `select_best_resolution` (most of the frame kept, then least wasted)."""
        best, kept_most, wasted_least = self.pinpoints[0], 0, math.inf
        for grid_height, grid_width in self.pinpoints:
            scale = min(grid_width / width, grid_height / height)
            kept = min(int(width * scale) * int(height * scale), width * height)
            wasted = grid_width * grid_height - kept
            if kept > kept_most or (kept == kept_most and wasted < wasted_least):
                best, kept_most, wasted_least = (grid_height, grid_width), kept, wasted
        return best

    def fitted(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the frame is resized to inside its grid resolution, its aspect kept (the
        processor's `get_patch_output_size`)."""
        grid_height, grid_width = self.best_resolution(height, width)
        if grid_width / width < grid_height / height:
            return min(math.ceil(height * grid_width / width), grid_height), grid_width
        return grid_height, min(math.ceil(width * grid_height / height), grid_width)

    def differentiable_pixel_values(self, pixels: Any, dtype: Any) -> Any:
        """pixel_values (N, 1 + tiles, 3, side, side) from frames given as a float tensor (N, 3, H, W) of
        0..255 values, all of one size, differentiable in them: each frame's base view, then its tiles
        row by row."""
        import torch
        import torch.nn.functional as functional

        side, (height, width) = self.side, pixels.shape[-2:]
        pixels = pixels.float()
        grid_height, grid_width = self.best_resolution(height, width)
        fitted = self.fitted(height, width)
        tiled = differentiable_resize(pixels, fitted, self.resample)
        top, left = (grid_height - fitted[0]) // 2, (grid_width - fitted[1]) // 2
        pad = (left, grid_width - fitted[1] - left, top, grid_height - fitted[0] - top)
        tiled = functional.pad(tiled, pad)  # black, before rescaling, as np.pad pads the uint8 frame
        rows, columns = grid_height // side, grid_width // side
        tiles = tiled.unflatten(-2, (rows, side)).unflatten(-1, (columns, side))
        tiles = tiles.permute(0, 2, 4, 1, 3, 5).flatten(1, 2)
        base = differentiable_resize(pixels, (side, side), self.resample)[:, None]
        values = torch.cat([base, tiles], dim=1)
        mean = torch.tensor(self.mean, device=values.device).view(1, 1, 3, 1, 1)
        std = torch.tensor(self.std, device=values.device).view(1, 1, 3, 1, 1)
        return ((values * self.scale - mean) / std).to(dtype)
