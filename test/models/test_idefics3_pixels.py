"""Idefics3's image processor in torch (models/idefics3_pixels.py) against the processor itself, PIL and
torchvision, at the tiny model's settings and the released SmolVLM's."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.idefics3.image_processing_idefics3 import Idefics3ImageProcessor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from metavlm_ros.models.idefics3_pixels import Idefics3PixelPath
from metavlm_ros.models.tiny_shapes import SIGLIP_MEAN, SIGLIP_STD
from test.conftest import make_frame

#: The processors' settings: the tiny model's (models/tiny_families.py: 2 x 2 tiles of 32), the same
#: without splitting (one view), and SmolVLM-256M-Instruct's (tiles of 512, the longer side to 2048).
SETTINGS = {
    'tiny': {'size': {'longest_edge': 64}, 'max_image_size': {'longest_edge': 32}},
    'not split': {
        'size': {'longest_edge': 64},
        'max_image_size': {'longest_edge': 32},
        'do_image_splitting': False,
    },
    'smolvlm': {'size': {'longest_edge': 2048}, 'max_image_size': {'longest_edge': 512}},
}
#: The processor resizes two or three times over, each pass rounded to a whole grey level (PIL's, or
#: torchvision's uint8 LANCZOS, the same kernel); the torch path, unrounded, lies within 2.5 levels of
#: it (measured up to 1.75 on these frames, 2.0 on scenes up to 1920 x 1080, for both processors and
#: every setting here; the other order of passes lies up to 9 levels away, bicubic up to 53).
CHAINED_ROUNDING = 2.5


def _frames(setting):
    """Scenes and noise, wider and taller, smaller and larger than the tiles; the released setting's
    2048-pixel views cost time: two frames."""
    frames = {
        'scene 64x48': make_frame(64, 48, seed=1),
        'noise 333x517': np.random.default_rng(0).integers(0, 256, (517, 333, 3), dtype=np.uint8),
    }
    if setting != 'smolvlm':
        frames.update({'scene 40x90': make_frame(40, 90, seed=1), 'scene 100x37': make_frame(100, 37)})
    return frames


@pytest.mark.parametrize('backend', ['pil', 'torchvision'])
@pytest.mark.parametrize('setting', list(SETTINGS))
def test_the_path_gives_the_processor_pixel_values(setting, backend):
    cls = Idefics3ImageProcessorPil if backend == 'pil' else Idefics3ImageProcessor
    ip = cls(image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD, **SETTINGS[setting])
    path = Idefics3PixelPath.from_processor(ip)
    assert path is not None and path.width_first == (backend == 'torchvision') and path.resample == 1
    std = torch.tensor(ip.image_std).view(1, 1, 3, 1, 1)
    for name, frame in _frames(setting).items():
        theirs = ip(images=[[Image.fromarray(frame)]], return_tensors='pt', return_row_col_info=True)
        pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
        ours = path.differentiable_pixel_values(pixels, torch.float32)
        assert ours.shape == theirs['pixel_values'].shape, name
        rows, columns = path.grid(*frame.shape[:2])
        assert (rows, columns) == (theirs['rows'][0][0], theirs['cols'][0][0]), name
        assert ours.shape[1] == (rows * columns + 1 if rows else 1)
        assert bool(theirs['pixel_attention_mask'].all())  # every view a whole tile: no padding
        gap = (ours - theirs['pixel_values']).abs() * std * 255
        assert float(gap.max()) < CHAINED_ROUNDING, name


def test_a_processor_the_path_does_not_follow_has_none():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    assert Idefics3PixelPath.from_processor(CLIPImageProcessorPil()) is None
    assert Idefics3PixelPath.from_processor(object()) is None
    assert Idefics3PixelPath.from_processor(Idefics3ImageProcessorPil(do_normalize=False)) is None
    # A filter the path has no kernel of (PIL's nearest) is not approximated by another.
    assert Idefics3PixelPath.from_processor(Idefics3ImageProcessorPil(resample=0)) is None
