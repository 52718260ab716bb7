"""Idefics3's image processor (SmolVLM's) in torch, tiles and global view, differentiable in pixels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from metavlm_ros.models.pixel_path import PIL_FILTERS, differentiable_resize

__all__ = ['IDEFICS3_PROCESSORS', 'Idefics3PixelPath']

#: The image processor classes (less 'Pil') whose steps Idefics3PixelPath reproduces (SmolVLM's too).
IDEFICS3_PROCESSORS = ('Idefics3ImageProcessor',)

#: The processor's cap on either side after its first resize (transformers' MAX_IMAGE_SIZE, 4k).
MAX_SIDE = 4096


@dataclass(frozen=True)
class Idefics3PixelPath:
    """Idefics3's PIL processor step for step: the longer side resized to `longest` (the shorter by
    the aspect ratio, made even), then both sides up to multiples of the tile side `tile`, cut into
    tiles row by row with the whole frame resized to one tile after them (the global view), or the
    frame resized to one tile where it is not split; rescale, normalise. Every view is a whole tile,
    so a batch of frames of one size needs no padding and its pixel_attention_mask is all ones.

    Each resize is `differentiable_resize` with the processor's filter (LANCZOS: PIL's kernel rebuilt,
    which torchvision's uint8 LANCZOS, from 0.27 on the CPU, shares), from the previous resize's
    output, as the processor chains them, in PIL's order of passes for the PIL processor and the width
    first for the torchvision one. Both round each pass to whole grey levels and the path does not, so
    it lies within a grey level or two of the processor's pixels (docs/explain.md gives the measured
    figure): it serves gradients, never answers.

    Attributes:
        longest: the longer side after the first resize (size['longest_edge']).
        tile: the vision tower's side, a tile's (max_image_size['longest_edge']).
        split: whether frames larger than a tile are cut into tiles (do_image_splitting).
        resample: PIL filter number (PIL_FILTERS).
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
        width_first: the torchvision processor: its resize takes the width first whatever the sizes.
    """

    longest: int
    tile: int
    split: bool
    resample: int
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    width_first: bool = False

    @classmethod
    def from_processor(cls, processor: Any) -> Idefics3PixelPath | None:
        """The path of an Idefics3 image processor (PIL or torchvision, or a processor holding one), or
        None for any other processor or settings outside what the path reproduces (a torchvision
        before 0.27, whose processor takes bicubic for LANCZOS)."""
        from transformers.utils.import_utils import is_torchvision_greater_or_equal

        ip = getattr(processor, 'image_processor', processor)
        name = type(ip).__name__
        width_first = not name.endswith('Pil')
        if name.removesuffix('Pil') not in IDEFICS3_PROCESSORS:
            return None
        lanczos = int(getattr(ip, 'resample', 0) or 0) == 1
        if width_first and lanczos and not is_torchvision_greater_or_equal('0.27'):
            return None
        if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
            return None
        longest = dict(ip.size or {}).get('longest_edge')
        tile = dict(ip.max_image_size or {}).get('longest_edge')
        resample = getattr(ip, 'resample', None)
        mean, std = list(ip.image_mean), list(ip.image_std)
        if not longest or not tile or resample is None or int(resample) not in PIL_FILTERS:
            return None
        if len(mean) != 3 or len(std) != 3:
            return None
        return cls(
            longest=int(longest),
            tile=int(tile),
            split=bool(ip.do_image_splitting),
            resample=int(resample),
            scale=float(ip.rescale_factor),
            mean=tuple(mean),
            std=tuple(std),
            width_first=width_first,
        )

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the first resize: the longer side to `longest`, the other by the aspect
        ratio made even, both within MAX_SIDE (the processor's two size rules)."""
        aspect = width / height
        if width >= height:
            width, height = self.longest, int(self.longest / aspect)
            height += height % 2
        else:
            height, width = self.longest, int(self.longest * aspect)
            width += width % 2
        height, width = max(height, 1), max(width, 1)
        aspect = width / height
        if width >= height and width > MAX_SIDE:
            width, height = MAX_SIDE, int(MAX_SIDE / aspect)
        elif height > width and height > MAX_SIDE:
            height, width = MAX_SIDE, int(MAX_SIDE * aspect)
        return max(height, 1), max(width, 1)

    def tiled(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the resized frame is brought to before tiling: multiples of the tile side
        (the processor's resize_for_vision_encoder)."""
        aspect, tile = width / height, self.tile
        if width >= height:
            width = math.ceil(width / tile) * tile
            height = math.ceil(int(width / aspect) / tile) * tile
        else:
            height = math.ceil(height / tile) * tile
            width = math.ceil(int(height * aspect) / tile) * tile
        return height, width

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The tiles (rows, columns) a (height, width) frame is cut into; (0, 0): one view, no tiles."""
        if not self.split:
            return 0, 0
        height, width = self.tiled(*self.resized(height, width))
        if height <= self.tile and width <= self.tile:
            return 0, 0
        return height // self.tile, width // self.tile

    def differentiable_pixel_values(self, pixels: Any, dtype: Any) -> Any:
        """pixel_values (N, views, 3, tile, tile) from frames given as a float tensor (N, 3, H, W) of
        0..255 values, all of one size, differentiable in them: each frame's tiles row by row, then its
        global view (or its one view where it is not split)."""
        import torch

        tile = self.tile
        height_first = False if self.width_first else None  # None: PIL's own order
        resize = partial(differentiable_resize, resample=self.resample, height_first=height_first)
        values = resize(pixels.float(), self.resized(*pixels.shape[-2:]))
        rows, columns = self.grid(*pixels.shape[-2:])
        if self.split:
            values = resize(values, self.tiled(*values.shape[-2:]))
        if rows:
            tiles = values[..., : rows * tile, : columns * tile].unflatten(-2, (rows, tile))
            tiles = tiles.unflatten(-1, (columns, tile)).permute(0, 2, 4, 1, 3, 5).flatten(1, 2)
            values = torch.cat([tiles, resize(values, (tile, tile))[:, None]], dim=1)
        else:
            values = resize(values, (tile, tile))[:, None]
        mean = torch.tensor(self.mean, device=values.device).view(1, 1, 3, 1, 1)
        std = torch.tensor(self.std, device=values.device).view(1, 1, 3, 1, 1)
        return ((values * self.scale - mean) / std).to(dtype)
