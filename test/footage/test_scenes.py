"""Tests of metavlm_ros.footage.scenes: determinism, ground truth consistency, motion, environments."""

import copy
import hashlib

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.footage.scenes import (
    ENVIRONMENTS,
    MIN_VISIBLE_AREA,
    MIN_VISIBLE_FRACTION,
    SceneGenerator,
    environment_for_seed,
)
from metavlm_ros.footage.truth import KIND_CLASS, KINDS
from metavlm_ros.method.prediction import CLASSES


def digest(rgb: np.ndarray) -> str:
    return hashlib.sha256(rgb.tobytes()).hexdigest()


@pytest.mark.parametrize('environment', ENVIRONMENTS)
def test_same_seed_same_frames(environment):
    a = SceneGenerator(64, 48, 5, seed=7, environment=environment)
    b = SceneGenerator(64, 48, 5, seed=7, environment=environment)
    for i in (0, 3):
        ra, ga = a.frame(i)
        rb, gb = b.frame(i)
        assert digest(ra) == digest(rb)
        assert ga.to_dict() == gb.to_dict()


def test_random_access_matches_sequential():
    gen = SceneGenerator(64, 48, 5, seed=3, environment='shallow', frames=4)
    sequential = [digest(rgb) for rgb, _ in gen]
    assert len(sequential) == 4 == len(gen)
    assert digest(gen.frame(2)[0]) == sequential[2]
    assert len(set(sequential)) == 4  # the scene moves


def test_different_seed_or_environment_differs():
    base = SceneGenerator(64, 48, 5, seed=1, environment='shallow').frame(0)[0]
    assert digest(SceneGenerator(64, 48, 5, seed=2, environment='shallow').frame(0)[0]) != digest(base)
    assert digest(SceneGenerator(64, 48, 5, seed=1, environment='deep').frame(0)[0]) != digest(base)


def test_environment_from_seed_is_deterministic():
    envs = [environment_for_seed(s) for s in range(12)]
    assert set(envs) == set(ENVIRONMENTS)
    assert [environment_for_seed(s) for s in range(12)] == envs
    assert SceneGenerator(32, 32, 5, seed=5).environment == envs[5]


def test_frame_format():
    rgb, gt = SceneGenerator(96, 54, 5, seed=0, environment='pool').frame(0)
    assert rgb.shape == (54, 96, 3) and rgb.dtype == np.uint8 and rgb.flags['C_CONTIGUOUS']
    assert set(gt.counts) == set(CLASSES)
    assert set(gt.kind_counts) == set(KIND_CLASS)


@pytest.mark.parametrize(('width', 'height', 'environment'), [(160, 120, 'shallow'), (1200, 675, 'pool')])
def test_ground_truth_matches_what_was_drawn(width, height, environment):
    gen = SceneGenerator(width, height, 5, seed=11, environment=environment)
    iw, ih = gen.internal_size
    sx, sy = width / iw, height / ih
    checked = 0
    for index in (0, 40, 80):
        rgb, gt, labels = gen.render(index)
        assert rgb.shape == (height, width, 3) and labels.shape == (ih, iw)
        for cls in CLASSES:
            assert gt.counts[cls] == sum(1 for b in gt.boxes if b['class'] == cls)
            assert gt.counts[cls] == sum(gt.kind_counts[k] for k in KINDS[cls])
        ids = [b['id'] for b in gt.boxes]
        assert len(ids) == len(set(ids))
        for b in gt.boxes:
            assert KIND_CLASS[b['kind']] == b['class']
            assert MIN_VISIBLE_FRACTION <= b['visible'] <= 1.0
            ys, xs = np.nonzero(labels == b['id'])
            assert xs.size > 0
            # 'area' is the share of the frame the visible pixels cover, at least the rule's minimum.
            assert b['area'] == xs.size / labels.size and b['area'] >= MIN_VISIBLE_AREA
            # The box is exactly the scaled bounding box of the object's visible pixels.
            expected = [
                int(np.floor(xs.min() * sx)),
                int(np.floor(ys.min() * sy)),
                min(width, int(np.ceil((xs.max() + 1) * sx))),
                min(height, int(np.ceil((ys.max() + 1) * sy))),
            ]
            assert b['box'] == expected
            x0, y0, x1, y1 = b['box']
            assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
            checked += 1
    assert checked >= 3


def test_objects_move_consistently_between_frames():
    gen = SceneGenerator(320, 180, 10, seed=4, environment='shallow')
    prev = {b['id']: b['box'] for b in gen.frame(0)[1].boxes}
    moved = 0
    for index in range(1, 6):
        boxes = {b['id']: b['box'] for b in gen.frame(index)[1].boxes}
        for obj_id in set(prev) & set(boxes):
            (a0, b0, a1, b1), (c0, d0, c1, d1) = prev[obj_id], boxes[obj_id]
            # At 10 fps nothing jumps: centres move a few pixels at most between frames.
            assert abs((a0 + a1) - (c0 + c1)) / 2 <= 12 and abs((b0 + b1) - (d0 + d1)) / 2 <= 12
            moved += (a0, b0, a1, b1) != (c0, d0, c1, d1)
        prev = boxes
    assert moved > 0


def test_every_class_appears_across_scenes():
    seen = {cls: 0 for cls in CLASSES}
    for seed in range(4):
        gen = SceneGenerator(128, 72, 1, seed=seed)
        for index in range(0, 60, 6):
            for cls, n in gen.frame(index)[1].counts.items():
                seen[cls] += n
    assert all(n > 0 for n in seen.values()), seen


def test_environments_look_different():
    means = {
        env: SceneGenerator(96, 54, 5, seed=2, environment=env).frame(0)[0].reshape(-1, 3).mean(0)
        for env in ENVIRONMENTS
    }
    # The deep sea is dark, the pool bright; underwater, red is attenuated most.
    assert means['deep'].sum() < means['shallow'].sum() < means['pool'].sum()
    for env in ('shallow', 'pool'):
        r, g, b = means[env]
        assert r < g and r < b


@pytest.mark.parametrize(
    'kwargs',
    [
        {'width': 8, 'height': 48},
        {'width': 64, 'height': 48, 'fps': 0},
        {'width': 64, 'height': 48, 'environment': 'lake'},
        {'width': 64, 'height': 48, 'frames': -1},
    ],
)
def test_bad_parameters(kwargs):
    with pytest.raises(ParameterError):
        SceneGenerator(**kwargs)


def test_negative_index_rejected():
    with pytest.raises(ParameterError):
        SceneGenerator(32, 32, 5, seed=0).frame(-1)


def test_boxes_lie_within_each_object_rendered_alone():
    gen = SceneGenerator(192, 108, 5, seed=6, environment='pool')
    rgb, gt, labels = gen.render(10)
    everything = gen.objects
    assert gt.boxes
    for b in gt.boxes:
        (obj,) = [o for o in everything if o.index == b['id']]
        alone = copy.copy(gen)
        alone.objects = [obj]
        _, alone_gt, alone_labels = alone.render(10)
        mine = alone_labels == obj.index
        # Occlusion only removes pixels: what the full scene shows of the object, it also shows alone.
        assert np.all(mine[labels == obj.index])
        ys, xs = np.nonzero(mine)
        x0, y0, x1, y1 = b['box']
        assert xs.min() <= x0 and ys.min() <= y0 and xs.max() + 1 >= x1 and ys.max() + 1 >= y1
        # Alone, nothing hides it: it is counted again, with a box at least as large.
        (single,) = alone_gt.boxes
        assert single['id'] == obj.index and single['visible'] >= b['visible']
        assert alone_gt.counts[obj.cls] == 1 and sum(alone_gt.counts.values()) == 1


def test_visibility_rule_for_an_object_leaving_the_frame():
    gen = SceneGenerator(192, 108, 5, seed=6, environment='pool')
    (tyre,) = [o for o in gen.objects if o.kind == 'tyre' and o.index == 3]
    alone = copy.copy(gen)
    moved = copy.copy(tyre)
    alone.objects = [moved]
    full = None
    decisions = []
    # Slide the tyre to the right, out of the frame, and compare what is counted with what is seen.
    for shift in [0.0, *np.linspace(2.6, 3.6, 41)]:
        moved.X = tyre.X + shift
        _, truth, labels = alone.render(0)
        inside = int(np.count_nonzero(labels == moved.index))
        if full is None:
            full = inside
            assert truth.boxes and truth.boxes[0]['visible'] == 1.0
        fraction = inside / full
        counted = bool(truth.boxes)
        assert truth.counts['trash'] == int(counted) == truth.kind_counts['tyre']
        if counted:
            assert abs(truth.boxes[0]['visible'] - fraction) < 0.05
        if fraction >= MIN_VISIBLE_FRACTION + 0.05:
            assert counted, fraction
        elif fraction <= MIN_VISIBLE_FRACTION - 0.05:
            assert not counted, fraction
        decisions.append((fraction, counted))
    # The sweep saw the object counted, drawn but not counted, and gone.
    assert any(c for _, c in decisions)
    assert any(0 < f < MIN_VISIBLE_FRACTION and not c for f, c in decisions)
    assert decisions[-1] == (0.0, False)
