"""Qwen2-VL's image processor (Qwen2.5-VL's, Qwen3-VL's) in torch, differentiable in a frame's pixels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metavlm_ros.models.grounding import QwenResize
from metavlm_ros.models.pixel_path import PIL_FILTERS, differentiable_resize

__all__ = ['QWEN_PROCESSORS', 'QwenPixelPath']

#: The image processor classes (less 'Pil') whose steps QwenPixelPath reproduces: transformers gives
#: Qwen2-VL's to Qwen2.5-VL and Qwen3-VL as well.
QWEN_PROCESSORS = ('Qwen2VLImageProcessor',)


@dataclass(frozen=True)
class QwenPixelPath:
    """Qwen2-VL's processor step for step: `smart_resize` (each side a multiple of patch x merge, the
    area within the pixel budget), rescale, normalise, every frame repeated `temporal` times (an image
    is a still video), and the patches flattened in the processor's order.

    The resize is `differentiable_resize`: PIL's filter in two passes, each clipped but not rounded, in
    PIL's order of passes for the PIL processor and the width first for the torchvision one (torch's
    uint8 resize, which it calls on the CPU, rounds each pass the same way, the width first always).
    Both lie within about a grey level of the processor's pixels (docs/explain.md gives the measured
    figure) and are the processor's to float32 rounding where the frame is not resized: the path
    serves gradients, never answers.

    Attributes:
        resize: the processor's `smart_resize` (its patch x merge factor and pixel budget).
        patch: the side of a patch, in pixels.
        merge: patches merged along each side into one token (merge_size).
        temporal: frames a patch spans (temporal_patch_size).
        resample: PIL filter number (PIL_FILTERS).
        width_first: the torchvision processor: its resize takes the width first whatever the sizes.
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    resize: QwenResize
    patch: int
    merge: int
    temporal: int
    resample: int
    width_first: bool
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_processor(cls, processor: Any) -> QwenPixelPath | None:
        """The path of a Qwen2-VL image processor (PIL or torchvision, or a processor holding one), or
        None for any other processor or settings outside what the path reproduces."""
        ip = getattr(processor, 'image_processor', processor)
        name = type(ip).__name__
        if name.removesuffix('Pil') not in QWEN_PROCESSORS:
            return None
        if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
            return None
        resample = getattr(ip, 'resample', None)
        mean, std = list(ip.image_mean), list(ip.image_std)
        if resample is None or int(resample) not in PIL_FILTERS or len(mean) != 3 or len(std) != 3:
            return None
        return cls(
            resize=QwenResize.of_processor(ip),
            patch=int(ip.patch_size),
            merge=int(ip.merge_size),
            temporal=int(ip.temporal_patch_size),
            resample=int(resample),
            width_first=not name.endswith('Pil'),
            scale=float(ip.rescale_factor),
            mean=tuple(mean),
            std=tuple(std),
        )

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patches (rows, columns) a (height, width) frame becomes: its image_grid_thw less the 1."""
        new_width, new_height = self.resize.size(width, height)
        return new_height // self.patch, new_width // self.patch

    def differentiable_pixel_values(self, pixels: Any, dtype: Any) -> Any:
        """pixel_values (N x rows x columns patches, 3 x temporal x patch x patch) from frames given as
        a float tensor (N, 3, H, W) of 0..255 values, all of one size, differentiable in them: each
        frame's patches in the order the processor lists them (merge windows row by row, the patches of
        a window row by row), each patch channel by channel, its `temporal` copies, rows, columns.
        """
        import torch

        rows, columns = self.grid(*pixels.shape[-2:])
        size = (rows * self.patch, columns * self.patch)
        height_first = False if self.width_first else None  # None: PIL's own order
        values = differentiable_resize(pixels.float(), size, self.resample, height_first=height_first)
        mean = torch.tensor(self.mean, device=values.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=values.device).view(1, 3, 1, 1)
        values = (values * self.scale - mean) / std
        count, merge, patch = len(values), self.merge, self.patch
        values = values.reshape(count, 3, rows // merge, merge, patch, columns // merge, merge, patch)
        # (frame, window row, window column, row in window, column in window, channel, y, x)
        values = values.permute(0, 2, 5, 3, 6, 1, 4, 7).unsqueeze(6)
        values = values.expand(-1, -1, -1, -1, -1, -1, self.temporal, -1, -1)
        return values.reshape(count * rows * columns, 3 * self.temporal * patch * patch).to(dtype)
