"""Benchmark: how often `metavlm compare` calls a change where there is none, and how often it flags a
model made worse on purpose.

Usage: python bench/compare_false_alarms.py [--seeds 8] [--frames 6] [--evaluations 120]

Runs `metavlm verify` with the example criteria (config/criteria/aur_camera.yaml) on `--frames` demo
frames (metavlm scenes, 640x360, seed 3) for the demo CLIP with seeds 0..N-1 and for copies of it made
worse on purpose (noise of 3 times their spread on the patch embedding's weights, noise seeds
0..2) and for demo-clip-v2 (the demo's update: fine-tuned without augmentation), then compares seed 0
of the demo CLIP against every other seed (the same model: every "regressed" or "improved" is a false
alarm) and against each worse model (seed 0). Prints, per
comparison, the items called, and the false-alarm rate: comparisons with any item called, and
items called over items tested.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from metavlm_ros.cli import main
from metavlm_ros.demo.variants import damaged_copy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / 'config' / 'criteria' / 'aur_camera.yaml'
DEMO_CLIP = ROOT / 'metavlm_ros' / 'models' / 'demo-clip'


def _quiet(argv: list[str]) -> int:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, default=8)
    parser.add_argument('--frames', type=int, default=6)
    parser.add_argument('--evaluations', type=int, default=120)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix='compare-bench-'))
    scenes = ['scenes', '--out', str(root / 'frames'), '--format', 'png', '--frames', str(args.frames)]
    assert _quiet([*scenes, '--size', '640x360', '--seed', '3']) == 0
    budget = ['--evaluations', str(args.evaluations), '--population', '20', '--envelope-rounds', '2']

    def verify(name: str, model: str, seed: int) -> Path:
        out = root / name
        base = ['verify', str(root / 'frames'), '--criteria', str(EXAMPLE), '--model', model]
        assert _quiet([*base, '--seed', str(seed), *budget, '--out', str(out)]) in (0, 1, 3)
        return out

    runs = {f'demo-seed{s}': verify(f'demo-seed{s}', 'demo', s) for s in range(args.seeds)}
    for k in range(3):
        runs[f'worse-noise{k}'] = verify(
            f'worse-noise{k}', str(damaged_copy(DEMO_CLIP, root / f'm{k}', seed=k)), 0
        )
    runs['demo-clip-v2'] = verify('demo-clip-v2', str(DEMO_CLIP.with_name('demo-clip-v2')), 0)
    false_comparisons = false_items = items = 0
    for name, out in runs.items():
        if name == 'demo-seed0':
            continue
        code = _quiet(['compare', str(runs['demo-seed0']), str(out), '--out', str(root / f'c-{name}')])
        changes = json.loads((root / f'c-{name}' / 'compare.json').read_text())['changes']
        called = [f'{c["item"]}: {c["verdict"]}' for c in changes if c['verdict'] != 'no significant change']
        print(f'demo-seed0 against {name}: exit {code}; {"; ".join(called) or "nothing called"}')
        if name.startswith('demo-seed'):
            false_comparisons += bool(called)
            false_items += len(called)
            items += len(changes)
    print(
        f'false alarms (the same model, another seed): {false_comparisons} of {args.seeds - 1} comparisons, '
        f'{false_items} of {items} items'
    )
    shutil.rmtree(root)


if __name__ == '__main__':
    main_bench()
