"""Shared by the hardening tests: frames as the search sees them for the tiny CLIP, with ground truth."""

import numpy as np
import pytest

from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.training.harden import TrainingFrame
from metavlm_ros.training.validation import FrameTruth
from test.conftest import make_frame


@pytest.fixture(scope='module')
def training_frames():
    """Ten small frames, each with a made-up presence of the four classes (two per frame)."""
    frames = []
    for i in range(10):
        rgb = make_frame(48, 36, seed=i)
        present = tuple(bool(v) for v in np.roll([1, 1, 0, 0], i % 4))
        frames.append(TrainingFrame(f'f{i}', rgb, frame_digest(rgb), FrameTruth(present)))
    return frames
