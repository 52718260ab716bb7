"""Synthetic scenes reproduce the committed frames and ground truth, on any x86-64 CPU.

test/fixtures/scenes/ holds, for every case below, the digests of the ground truth (object labels
image, truth record, object kinds), compared exactly, and the rendered frames themselves
(frames.png: the cases' frames stacked top to bottom), compared pixel by pixel to FRAME_TOLERANCE.
The renderer computes in floats and rounds to 8 bits; numpy's run-time SIMD dispatch (AVX512 or
AVX2 kernels, or none) moves a float in its last bits, which now and then crosses a rounding
boundary: one pixel of one frame by one level, measured with numpy's dispatch off on an AVX512 CPU.
Any change of the footage moves far more than that. `test_scenes_agree_without_simd_dispatch` proves
it by rendering in a subprocess with numpy's and OpenCV's dispatch turned off.

Regenerate (only when a change of the footage is intended):
    .venv/bin/python -m test.footage.test_scenes_golden
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / 'fixtures' / 'scenes'
DIGESTS = FIXTURE / 'digests.json'
FRAMES_PNG = FIXTURE / 'frames.png'
# Every environment, several seeds (so every kind of object is drawn), first and later frames.
CASES = [(seed, environment) for environment in ('pool', 'shallow', 'deep') for seed in range(4)]
FRAMES = (0, 9)
WIDTH, HEIGHT = 160, 90
#: A pixel may differ by one level (a float rounded the other way); at most this share of a frame's
#: pixels may (measured: 1 pixel in 24 frames).
FRAME_TOLERANCE = {'levels': 1, 'pixel_share': 0.001}


def render_cases() -> tuple[dict[str, dict[str, str]], np.ndarray]:
    """The ground truth's digests by case, and the cases' RGB frames stacked top to bottom."""
    from metavlm_ros.footage.scenes import SceneGenerator

    digests, frames = {}, []
    for seed, environment in CASES:
        scene = SceneGenerator(width=WIDTH, height=HEIGHT, fps=2.0, seed=seed, environment=environment)
        for index in FRAMES:
            rgb, truth, labels = scene.render(index)
            frames.append(rgb)
            digests[f'{environment}-{seed}-{index}'] = {
                'labels': hashlib.sha256(labels.tobytes()).hexdigest(),
                'truth': hashlib.sha256(json.dumps(truth.to_dict(), sort_keys=True).encode()).hexdigest(),
                'kinds': ','.join(sorted(k for k, n in truth.kind_counts.items() if n)),
            }
    return digests, np.concatenate(frames, axis=0)


def frame_differences(expected: np.ndarray, actual: np.ndarray) -> list[str]:
    """The frames (case names) whose pixels differ from the fixture's beyond FRAME_TOLERANCE."""
    names = [f'{environment}-{seed}-{index}' for seed, environment in CASES for index in FRAMES]
    found = []
    for i, name in enumerate(names):
        rows = slice(i * HEIGHT, (i + 1) * HEIGHT)
        gap = np.abs(expected[rows].astype(np.int16) - actual[rows].astype(np.int16))
        share = float(np.mean(gap.max(axis=-1) > 0))
        if gap.max() > FRAME_TOLERANCE['levels'] or share > FRAME_TOLERANCE['pixel_share']:
            found.append(f'{name}: up to {gap.max()} levels on {share:.2%} of its pixels')
    return found


def check(digests: dict, frames: np.ndarray) -> None:
    expected = json.loads(DIGESTS.read_text())
    assert digests == expected, [k for k in expected if digests.get(k) != expected[k]]
    stored = cv2.imread(str(FRAMES_PNG), cv2.IMREAD_COLOR)[..., ::-1]
    assert stored.shape == frames.shape, (stored.shape, frames.shape)
    found = frame_differences(stored, frames)
    assert not found, found


def test_scenes_reproduce_the_committed_frames_and_ground_truth():
    check(*render_cases())


def test_the_frame_comparison_finds_a_change_of_the_footage():
    _, frames = render_cases()
    assert frame_differences(frames, frames) == []
    brighter = frames.copy()
    brighter[HEIGHT : 2 * HEIGHT] = np.clip(brighter[HEIGHT : 2 * HEIGHT].astype(int) + 2, 0, 255)
    assert frame_differences(frames, brighter) == ['pool-0-9: up to 2 levels on 100.00% of its pixels']
    speck = frames.copy()
    speck[0:9, 0:16] ^= 1  # a small patch, one level each: more pixels than the tolerance's share
    assert len(frame_differences(frames, speck)) == 1


def test_scenes_agree_without_simd_dispatch(tmp_path):
    """Rendered in a fresh process with numpy's and OpenCV's run-time SIMD dispatch off, as on the
    plainest x86-64 CPU, the scenes still match the fixture."""
    from test.method.test_search_golden import _dispatched

    numpy_found, opencv_found = _dispatched()
    env = {
        **os.environ,
        'NPY_DISABLE_CPU_FEATURES': ' '.join(numpy_found),
        'OPENCV_CPU_DISABLE': ','.join(opencv_found),
    }
    out = tmp_path / 'render.npz'
    done = subprocess.run(
        [sys.executable, '-m', 'test.footage.test_scenes_golden', '--emit', str(out)],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    emitted = np.load(out)
    assert json.loads(str(emitted['dispatched'])) == [[], []], 'numpy or OpenCV still dispatched SIMD kernels'
    check(json.loads(str(emitted['digests'])), emitted['frames'])


if __name__ == '__main__':
    digests, frames = render_cases()
    if sys.argv[1:2] == ['--emit']:
        from test.method.test_search_golden import _dispatched

        np.savez(
            sys.argv[2],
            digests=json.dumps(digests),
            frames=frames,
            dispatched=json.dumps(_dispatched()),
        )
    else:
        FIXTURE.mkdir(parents=True, exist_ok=True)
        DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + '\n')
        assert cv2.imwrite(str(FRAMES_PNG), frames[..., ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 9])
