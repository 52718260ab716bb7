"""Synthetic scenes reproduce the committed frames and ground truth byte for byte.

The digests under test/fixtures/scenes/ were written by this module before footage/scenes.py was
split into optics, sprites and the generator; any change of a rendered pixel or of the ground truth
shows up here. Like the seeded searches, the comparison runs on the platform the digests were made
on (test/fixtures/seeded_search/platform.json) and is skipped elsewhere, saying why.

Regenerate (only when a change of the footage is intended):
    .venv/bin/python -m test.footage.test_scenes_golden
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from test.method.test_search_golden import FIXTURE as SEARCH_FIXTURE
from test.method.test_search_golden import fixture_for, platform_fingerprint

FIXTURE = Path(__file__).resolve().parents[1] / 'fixtures' / 'scenes' / 'digests.json'
# Every environment, several seeds (so every kind of object is drawn), first and later frames.
CASES = [(seed, environment) for environment in ('pool', 'shallow', 'deep') for seed in range(4)]
FRAMES = (0, 9)


def scene_digests() -> dict[str, dict[str, str]]:
    from metavlm_ros.footage.scenes import SceneGenerator

    digests = {}
    for seed, environment in CASES:
        scene = SceneGenerator(width=160, height=90, fps=2.0, seed=seed, environment=environment)
        for index in FRAMES:
            rgb, truth, labels = scene.render(index)
            digests[f'{environment}-{seed}-{index}'] = {
                'rgb': hashlib.sha256(rgb.tobytes()).hexdigest(),
                'labels': hashlib.sha256(labels.tobytes()).hexdigest(),
                'truth': hashlib.sha256(json.dumps(truth.to_dict(), sort_keys=True).encode()).hexdigest(),
                'kinds': ','.join(sorted(k for k, n in truth.kind_counts.items() if n)),
            }
    return digests


def test_scenes_reproduce_the_committed_frames_and_ground_truth():
    here = platform_fingerprint()
    folder = fixture_for(here)
    if folder is None:
        recorded = json.loads((SEARCH_FIXTURE / 'platform.json').read_text())
        differing = {k: (recorded.get(k), v) for k, v in here.items() if recorded.get(k) != v}
        pytest.skip(f'digests made on another platform (recorded, here): {differing}')
    # The digests of another platform live beside its search records' name (scenes/AVX2/digests.json).
    path = FIXTURE if folder == SEARCH_FIXTURE else FIXTURE.parent / folder.name / FIXTURE.name
    expected = json.loads(path.read_text())
    assert scene_digests() == expected


if __name__ == '__main__':
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(scene_digests(), indent=1, sort_keys=True) + '\n')
