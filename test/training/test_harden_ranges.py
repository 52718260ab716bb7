"""Hardening for criteria that take MR12's ranges from the footage (`water_ranges: truth`): the training
frames carry their range maps at the searched size, and the follow-ups are made over them, as the
gate's searches make them."""

import shutil

import numpy as np
import pytest

from metavlm_ros.assurance.harden_job import training_frames
from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.range_maps import quantise_ranges
from metavlm_ros.footage.frames import iter_frames
from metavlm_ros.footage.ranges import RangeLookup
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.training.validation import ValidationSet


@pytest.fixture(scope='module')
def scenes(tmp_path_factory):
    out = tmp_path_factory.mktemp('harden-ranges') / 'scenes'
    size = ['--size', '96x64', '--frames', '2', '--seed', '6', '--environment', 'shallow']
    assert main(['scenes', '--out', str(out), '--format', 'png', *size]) == 0
    return out


def test_training_frames_carry_their_maps_at_the_searched_size(scenes, tiny_clip_dir):
    backend = create_backend('clip', str(tiny_clip_dir))
    frames = list(iter_frames(scenes))
    ranged = training_frames(frames, backend, 'truth')
    for frame, training in zip(frames, ranged, strict=True):
        # Harden searches at the search's default working size (the whole frame), the map in millimetres.
        assert training.rgb.shape[:2] == training.ranges.shape == (64, 96)
        assert np.array_equal(training.ranges, quantise_ranges(RangeLookup()(frame)))
        assert np.isinf(training.ranges).any() and np.isfinite(training.ranges).any()
    assert all(t.ranges is None for t in training_frames(frames, backend, 'prior'))


def test_training_frames_without_maps_are_refused_in_one_line(scenes, tiny_clip_dir, tmp_path):
    bare = tmp_path / 'bare'
    shutil.copytree(scenes, bare, ignore=shutil.ignore_patterns('ranges'))
    backend = create_backend('clip', str(tiny_clip_dir))
    with pytest.raises(InputError, match=r'frame_000000.png: no range map') as caught:
        training_frames(list(iter_frames(bare)), backend, 'truth')
    assert '\n' not in str(caught.value)


def test_validation_follow_ups_are_made_over_each_frames_map(scenes):
    frames = [f.rgb for f in iter_frames(scenes)]
    maps = tuple(RangeLookup()(f) for f in iter_frames(scenes))
    change = Composition.from_parameters({'rotation': 2.0, 'water': 1.5, 'water_type': 3.0})
    seen = []

    def predict(batch):
        seen.extend(batch)
        return [Prediction('confidence', {c: 0.5 for c in ('animal', 'trash')}) for _ in batch]

    base = tuple(predict(frames))
    seen.clear()
    validation = ValidationSet(tuple(frames), base, ((change,), (change,)), (None, None), maps)
    validation.figures(predict, ['animal', 'trash'], 0.05)
    followups = seen[len(frames) :]  # the sources first, then each frame's follow-ups
    for frame, ranges, followup in zip(frames, maps, followups, strict=True):
        assert np.array_equal(followup, apply_composition(frame, change, ranges=ranges))
        assert not np.array_equal(followup, apply_composition(frame, change))
