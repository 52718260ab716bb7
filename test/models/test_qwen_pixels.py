"""Qwen2-VL's image processor in torch (models/qwen_pixels.py) against the processor itself, PIL and
torchvision, at the tiny models' settings and the released Qwen2-VL's and Qwen3-VL's."""

import math

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

from metavlm_ros.models.qwen_pixels import QwenPixelPath
from metavlm_ros.models.tiny_shapes import SIGLIP_MEAN, SIGLIP_STD
from test.conftest import make_frame

#: The processors' settings: the tiny models' (models/tiny_qwen.py), Qwen2-VL-2B-Instruct's (the
#: processor's defaults: patch 14, 56 * 56 to 28 * 28 * 1280 pixels) and Qwen3-VL-2B-Instruct's.
SETTINGS = {
    'tiny': {'min_pixels': 16 * 16, 'max_pixels': 48 * 48, 'patch_size': 4},
    'qwen2-vl': {},
    'qwen3-vl': {
        'patch_size': 16,
        'image_mean': SIGLIP_MEAN,
        'image_std': SIGLIP_STD,
        'size': {'shortest_edge': 65536, 'longest_edge': 16777216},
    },
}
#: Frames resized as PIL or torch's uint8 resize does, each pass rounded to a whole grey level: the
#: torch path, unrounded, lies within 1.5 levels of them (measured up to 1.10 on scenes and noise, at
#: sizes up to 1920 x 1080, for both processors and every setting here).
PIL_ROUNDING = 1.5
#: A frame of the very size the processor resizes to is only rescaled and normalised: float32 rounding.
EXACT = 1e-5


def _frames(setting, ip):
    """Scenes and noise, wider and taller, smaller and larger than the pixel budget (the height
    resampled first by PIL where it shrinks far more than the width), and one frame whose sides are
    multiples of patch x merge within the budget (not resized). The released settings' larger
    frames cost time: two of them."""
    factor = ip.patch_size * ip.merge_size
    side = max(32, factor * math.ceil(math.isqrt(ip.size['shortest_edge']) / factor))
    frames = {
        'scene 652x501': make_frame(652, 501, seed=1),
        'noise 333x517': np.random.default_rng(0).integers(0, 256, (517, 333, 3), dtype=np.uint8),
        'not resized': make_frame(side * 3 // 2, side, seed=2),
    }
    if setting == 'tiny':
        frames.update({'scene 40x90': make_frame(40, 90, seed=1), 'scene 100x37': make_frame(100, 37)})
    return frames


@pytest.mark.parametrize('backend', ['pil', 'torchvision'])
@pytest.mark.parametrize('setting', list(SETTINGS))
def test_the_path_gives_the_processor_pixel_values(setting, backend):
    cls = Qwen2VLImageProcessorPil if backend == 'pil' else Qwen2VLImageProcessor
    ip = cls(**SETTINGS[setting])
    path = QwenPixelPath.from_processor(ip)
    assert path is not None and path.width_first == (backend == 'torchvision')
    # Each flattened patch is channel by channel (temporal x patch x patch values each): its std.
    std = torch.tensor(ip.image_std).repeat_interleave(path.temporal * path.patch**2)
    for name, frame in _frames(setting, ip).items():
        theirs = ip(images=[Image.fromarray(frame)], return_tensors='pt')
        pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
        ours = path.differentiable_pixel_values(pixels, torch.float32)
        assert ours.shape == theirs['pixel_values'].shape, name
        assert list(path.grid(*frame.shape[:2])) == theirs['image_grid_thw'][0, 1:].tolist()
        gap = (ours - theirs['pixel_values']).abs()
        if name == 'not resized':
            assert float(gap.max()) < EXACT
        else:
            assert float((gap * std * 255).max()) < PIL_ROUNDING, name


def test_the_frames_of_a_batch_follow_one_another_in_the_processor_order():
    ip = Qwen2VLImageProcessorPil(**SETTINGS['tiny'])
    frames = [make_frame(32, 48, seed=seed) for seed in (3, 4)]
    theirs = ip(images=[Image.fromarray(f) for f in frames], return_tensors='pt')['pixel_values']
    pixels = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
    ours = QwenPixelPath.from_processor(ip).differentiable_pixel_values(pixels, torch.float32)
    assert ours.shape == theirs.shape and float((ours - theirs).abs().max()) < EXACT


def test_a_processor_the_path_does_not_follow_has_none():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    assert QwenPixelPath.from_processor(CLIPImageProcessorPil()) is None
    assert QwenPixelPath.from_processor(object()) is None
    assert QwenPixelPath.from_processor(Qwen2VLImageProcessorPil(do_normalize=False)) is None
    # A filter torch has no kernel of (PIL's nearest) is not approximated by another.
    assert QwenPixelPath.from_processor(Qwen2VLImageProcessorPil(resample=0)) is None
