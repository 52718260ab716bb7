"""LLaVA-OneVision's AnyRes processor in torch (models/anyres_pixels.py) against the PIL processor itself,
at the tiny model's settings and the released ones."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.llava_onevision.image_processing_llava_onevision import (
    LlavaOnevisionImageProcessor,
)
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
    LlavaOnevisionImageProcessorPil,
)

from metavlm_ros.models.anyres_pixels import AnyResPixelPath
from metavlm_ros.models.tiny_shapes import SIDE, SIGLIP_MEAN, SIGLIP_STD
from test.conftest import make_frame

#: The tiny model's settings (models/tiny_families.py: grids of 1 x 1 to 2 x 2 tiles of 32) and the
#: released processor's defaults (tiles of 384, grids up to 6 x 6).
SETTINGS = {
    'tiny': {
        'size': {'height': SIDE, 'width': SIDE},
        'image_grid_pinpoints': [[SIDE, SIDE], [SIDE, 2 * SIDE], [2 * SIDE, SIDE], [2 * SIDE, 2 * SIDE]],
        'image_mean': SIGLIP_MEAN,
        'image_std': SIGLIP_STD,
    },
    'released': {},
}
#: One bicubic resize each view, each pass rounded by PIL: the torch path, unrounded, lies within 1.5
#: grey levels (measured up to 1.08 on scenes and noise, wider and taller, both settings).
PIL_ROUNDING = 1.5


@pytest.mark.parametrize('setting', list(SETTINGS))
def test_the_path_gives_the_processor_pixel_values(setting):
    ip = LlavaOnevisionImageProcessorPil(**SETTINGS[setting])
    path = AnyResPixelPath.from_processor(ip)
    std = torch.tensor(ip.image_std).view(1, 1, 3, 1, 1)
    frames = {
        'scene 64x48': make_frame(64, 48, seed=1),
        'scene 40x90': make_frame(40, 90, seed=1),  # padded left and right inside its 2 x 1 grid
        'noise 333x517': np.random.default_rng(0).integers(0, 256, (517, 333, 3), dtype=np.uint8),
    }
    for name, frame in frames.items():
        theirs = ip(images=[Image.fromarray(frame)], return_tensors='pt')['pixel_values']
        pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
        ours = path.differentiable_pixel_values(pixels, torch.float32)
        grid_height, grid_width = path.best_resolution(*frame.shape[:2])
        assert ours.shape == theirs.shape, name
        assert ours.shape[1] == 1 + (grid_height // path.side) * (grid_width // path.side)
        assert float(((ours - theirs).abs() * std * 255).max()) < PIL_ROUNDING, name


def test_a_processor_the_path_does_not_follow_has_none():
    assert AnyResPixelPath.from_processor(LlavaOnevisionImageProcessor()) is None  # torchvision
    assert AnyResPixelPath.from_processor(object()) is None
    assert AnyResPixelPath.from_processor(LlavaOnevisionImageProcessorPil(do_normalize=False)) is None
    assert AnyResPixelPath.from_processor(LlavaOnevisionImageProcessorPil(resample=0)) is None
