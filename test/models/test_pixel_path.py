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


@pytest.mark.parametrize(('source', 'size'), SIZES[:4])
def test_the_lanczos_kernel_rebuilt_resizes_as_pil(source, size):
    """PIL's LANCZOS (Idefics3's filter), which torch lacks, rebuilt (lanczos_resize): within PIL's
    rounding of PIL's pixels, shrinking and growing; torch's bicubic lies several levels away."""
    frame = _noise(*source)
    (new_height, new_width), lanczos = size, Image.Resampling.LANCZOS
    theirs = np.asarray(Image.fromarray(frame).resize((new_width, new_height), resample=lanczos))
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    for resample, within in ((lanczos, True), (Image.Resampling.BICUBIC, False)):
        ours = differentiable_resize(pixels, size, resample)[0].permute(1, 2, 0).numpy()
        # Stated tolerance 1.5 grey levels (measured up to 1.11, on noise and scenes).
        assert (np.abs(ours - theirs).max() < 1.5) == within


@pytest.mark.parametrize('backend', ['pil', 'torchvision'])
def test_gemma3_square_resize_gives_the_processor_pixel_values(backend):
    """Gemma 3's processor without pan-and-scan (resize to a square, rescale, normalise) is PixelPath's
    for gradients, PIL's or torchvision's (the width first); with pan-and-scan its crops have none."""
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from metavlm_ros.models.pixel_path import GRADIENT_PROCESSORS, GRADIENT_TORCHVISION_PROCESSORS, PixelPath

    cls = Gemma3ImageProcessorPil if backend == 'pil' else Gemma3ImageProcessor
    ip = cls(size={'height': 32, 'width': 32})
    assert PixelPath.from_processor(ip) is None  # not for answers
    path = PixelPath.from_processor(ip, GRADIENT_PROCESSORS, GRADIENT_TORCHVISION_PROCESSORS)
    assert path is not None and path.width_first == (backend == 'torchvision')
    for frame in (_noise(517, 333), _noise(90, 40, seed=1), _noise(48, 64, seed=2)):
        theirs = ip(images=[Image.fromarray(frame)], return_tensors='pt')['pixel_values']
        pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
        ours = path.differentiable_pixel_values(pixels, torch.float32)
        # Stated tolerance 1.5 grey levels (measured up to 1.0 on these frames, either processor).
        assert ours.shape == theirs.shape and float((ours - theirs).abs().max()) * 0.5 * 255 < 1.5
    panned = cls(size={'height': 32, 'width': 32}, do_pan_and_scan=True)
    assert PixelPath.from_processor(panned, GRADIENT_PROCESSORS, GRADIENT_TORCHVISION_PROCESSORS) is None
