"""The detectors' image processors in torch (models/detector_pixels.py) against the processors themselves."""

import pytest
import torch
from PIL import Image
from transformers.models.grounding_dino.image_processing_pil_grounding_dino import (
    GroundingDinoImageProcessorPil,
)
from transformers.models.owlv2.image_processing_pil_owlv2 import Owlv2ImageProcessorPil
from transformers.models.owlvit.image_processing_pil_owlvit import OwlViTImageProcessorPil

from metavlm_ros.models.detector_pixels import detector_pixel_path
from metavlm_ros.models.tiny_shapes import CLIP_MEAN, CLIP_STD
from test.conftest import make_frame

#: float32 rounding: OWLv2's path computes what scipy computes, in float64; a frame not resized is
#: only rescaled and normalised. In normalised units and in grey levels.
EXACT = 1e-5
EXACT_GREY = 1e-3
#: PIL resizes in two passes, each rounded to a whole grey level (half a level each, the first one's
#: spread by the second pass's kernel): the torch path, unrounded, lies within 1.5 levels (measured up
#: to 0.97 on these frames).
PIL_ROUNDING = 1.5


def _both(ip, frame):
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    ours = detector_pixel_path(ip)(pixels, torch.float32)
    theirs = ip(images=[Image.fromarray(frame)], return_tensors='pt')
    return ours, theirs


def _grey_levels(ip, ours, theirs):
    """The largest difference of two normalised pixel tensors, in grey levels (0..255)."""
    std = torch.tensor(ip.image_std).view(1, 3, 1, 1)
    return float(((ours - theirs).abs() * std * 255).max())


@pytest.mark.parametrize('side', [32, 960], ids=['tiny', 'released'])
def test_owlv2_pads_filters_and_resamples_as_its_processor(side):
    """Smaller and larger frames than the input, wider and taller: padded to a square, then shrunk
    (Gaussian and linear) or grown (linear alone), to float32 rounding."""
    ip = Owlv2ImageProcessorPil(
        size={'height': side, 'width': side}, image_mean=CLIP_MEAN, image_std=CLIP_STD
    )
    frames = ((96, 48), (33, 70), (24, 30)) if side < 100 else ((640, 480), (33, 70))
    for width, height in frames:
        ours, theirs = _both(ip, make_frame(width, height, seed=2))
        assert ours['pixel_values'].shape == theirs['pixel_values'].shape == (1, 3, side, side)
        assert float((ours['pixel_values'] - theirs['pixel_values']).abs().max()) < EXACT


def test_owlvit_and_grounding_dino_resize_as_pil_within_its_rounding():
    owlvit = OwlViTImageProcessorPil(
        size={'height': 32, 'width': 32}, crop_size={'height': 32, 'width': 32}, image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )  # fmt: skip
    grounding = GroundingDinoImageProcessorPil(size={'shortest_edge': 64, 'longest_edge': 128})
    # (frame, the processor's own size for it: nothing is resized, so the pixels are the same)
    for ip, same in ((owlvit, (32, 32)), (grounding, (128, 64))):
        for width, height in ((96, 48), (64, 48), (640, 480), same):
            ours, theirs = _both(ip, make_frame(width, height, seed=3))
            assert ours['pixel_values'].shape == theirs['pixel_values'].shape
            gap = _grey_levels(ip, ours['pixel_values'], theirs['pixel_values'])
            assert gap < (EXACT_GREY if (width, height) == same else PIL_ROUNDING), (type(ip).__name__, width)
            if 'pixel_mask' in theirs:  # one frame: nothing padded
                assert torch.equal(ours['pixel_mask'], theirs['pixel_mask'])


def test_a_processor_no_path_follows_has_none():
    assert detector_pixel_path(object()) is None
    assert detector_pixel_path(Owlv2ImageProcessorPil(do_pad=False)) is None
    assert detector_pixel_path(GroundingDinoImageProcessorPil(do_normalize=False)) is None
    # The torchvision processors resize otherwise (their own antialiasing): occlusion maps them.
    from transformers.models.owlv2.image_processing_owlv2 import Owlv2ImageProcessor

    assert detector_pixel_path(Owlv2ImageProcessor()) is None
    # A filter torch has no kernel of (PIL's nearest) is not approximated by another.
    assert detector_pixel_path(GroundingDinoImageProcessorPil(resample=0)) is None
    assert detector_pixel_path(GroundingDinoImageProcessorPil()) is not None
