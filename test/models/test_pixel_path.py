"""PIL's two-pass resize in torch (models/pixel_path.py differentiable_resize) against PIL itself."""

import numpy as np
import pytest
import torch
from PIL import Image

from metavlm_ros.models.pixel_path import differentiable_resize, pil_resizes_height_first

#: (height, width) -> (height, width) where the order of PIL's passes decides the pixels: the height
#: shrinking far more than the width, with the width shrinking, kept close or growing (height first
#: in Pillow 13), and the width shrinking more, or the height growing (width first).
SIZES = [
    ((601, 31), (588, 28)),
    ((652, 501), (644, 504)),
    ((120, 120), (20, 80)),
    ((120, 120), (20, 60)),
    ((60, 31), (58, 28)),
    ((100, 300), (40, 120)),
    ((48, 64), (96, 40)),
]


def _noise(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _pil(frame, height, width):
    return np.asarray(Image.fromarray(frame).resize((width, height), resample=Image.Resampling.BICUBIC))


@pytest.mark.parametrize(('source', 'size'), SIZES)
def test_pil_resamples_in_the_order_pil_resizes_height_first_gives(source, size):
    """One resize by PIL is its two passes in that order, to the bit; the other order differs."""
    frame = _noise(*source)
    (height, width), (new_height, new_width) = source, size
    by_width = _pil(_pil(frame, height, new_width), new_height, new_width)
    by_height = _pil(_pil(frame, new_height, width), new_height, new_width)
    first, other = (by_height, by_width) if pil_resizes_height_first(*source, size) else (by_width, by_height)
    assert np.array_equal(_pil(frame, *size), first) and not np.array_equal(first, other)
    # The torch resize follows that order: within PIL's rounding (measured up to 1.1 grey levels; the
    # other order lies up to 20 away on these noise frames).
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    ours = differentiable_resize(pixels, size, Image.Resampling.BICUBIC)[0].permute(1, 2, 0).numpy()
    assert np.abs(ours - _pil(frame, *size)).max() < 1.5
