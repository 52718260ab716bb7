"""Benchmark: float32 against bfloat16 on this CPU: speed, and how much the model's answers change.

Run from the repository root: ``python bench/dtype.py [--models demo-clip demo-blip base-clip]``.

For each model, the same follow-up frames (random compositions of synthetic underwater scenes at
the default working size, so what a search judges) are judged in float32 and in bfloat16; timing
repetitions interleave the two and print min / median / max ms per frame. Answer changes: for
confidence models, the largest and median change of a class confidence and the share of
evaluations whose Eq. 5 violation flag (f_pred against the source, Th 0.01 / 0.03 / 0.05) flips;
for count models, the share of answers whose text or counts differ. The bench exits 1 if float32
is not deterministic (the same frames judged twice must give the same answers): the changes it
reports are then bfloat16's alone. `--tolerance` is the largest confidence change counted as safe
(default 0.001, a tenth of the smallest threshold); the verdict is printed per model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved  # noqa: E402

from metavlm_ros.common.images import resize_longer_side, working_size_for
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.metrics import violation_flags
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.models.tiny import build_base_model
from metavlm_ros.models.vlm import create_backend


def followups(backend, scenes: int, per_scene: int, seed: int) -> tuple[list, list]:
    """Source frames at the backend's default working size, and random follow-ups of each."""
    rng = np.random.default_rng(seed)
    space = SearchSpace.default()
    sources, frames = [], []
    for i in range(scenes):
        rgb, _ = SceneGenerator(1920, 1080, seed=seed + i, frames=1).frame(0)
        size = working_size_for('auto', 1920, 1080, backend.input_size)
        source = np.ascontiguousarray(resize_longer_side(rgb, size))
        sources.append(source)
        for _ in range(per_scene):
            composition = decode(rng.uniform(*space.bounds()), space)
            frames.append((i, apply_composition(source, composition)))
    return sources, frames


def bench_model(name: str, backend_name: str, model: str, args, checks: Checks) -> None:
    kwargs = {'device': 'cpu', 'batch_size': args.batch}
    if backend_name == 'blip':
        kwargs['max_new_tokens'] = args.max_new_tokens
    full = create_backend(backend_name, model, dtype='float32', **kwargs)
    half = create_backend(backend_name, model, dtype='bfloat16', **kwargs)
    sources, pairs = followups(full, args.scenes, args.per_scene, seed=3)
    frames = [f for _, f in pairs]
    batch = frames[: args.batch]
    full.predict(batch[:2])
    half.predict(batch[:2])
    samples = interleaved(
        {'float32': lambda: full.predict(batch), 'bfloat16': lambda: half.predict(batch)}, args.repeats
    )
    per_frame = {k: [s / len(batch) for s in v] for k, v in samples.items()}
    ratio = np.median(per_frame['float32']) / np.median(per_frame['bfloat16'])
    print(
        f'\n{name}: {full.kind} model, input {full.input_size} px, batch {len(batch)}, '
        f'torch threads {torch.get_num_threads()}, {args.repeats} interleaved repetitions'
    )
    for key, values in per_frame.items():
        print(f'  {key:<9} ms per frame (min / median / max): {fmt(values, 1000.0)}')
    print(f'  bfloat16 speed-up at the median: {ratio:.2f}x')

    answers = {
        key: backend.predict(sources + frames) for key, backend in (('float32', full), ('bfloat16', half))
    }
    again = full.predict(sources + frames)
    checks.check(
        [p.values for p in again] == [p.values for p in answers['float32']],
        f'{name}: float32 gives the same answers when the frames are judged again',
    )
    n = len(sources)
    a, b = answers['float32'], answers['bfloat16']
    if full.kind == 'confidence':
        deltas = np.array(
            [abs(p.values[c] - q.values[c]) for p, q in zip(a, b, strict=True) for c in p.values]
        )
        flips = {}
        for (scene, _), p, q in zip(pairs, a[n:], b[n:], strict=True):
            fa = violation_flags(a[scene], p, (0.01, 0.03, 0.05))
            fb = violation_flags(b[scene], q, (0.01, 0.03, 0.05))
            for key in fa:
                flips.setdefault(key, []).append(fa[key] != fb[key])
        safe = float(deltas.max()) <= args.tolerance
        print(
            f'  confidence change over {len(a)} frames x {len(a[0].values)} classes: largest '
            f'{deltas.max():.5f}, median {np.median(deltas):.5f}; violation flags flipped: '
            + ', '.join(f'Th {k} {100 * np.mean(v):.1f}%' for k, v in flips.items())
        )
    else:
        texts = np.mean([p.text != q.text for p, q in zip(a, b, strict=True)])
        counts = np.mean([p.values != q.values for p, q in zip(a, b, strict=True)])
        safe = counts == 0
        print(f'  answers differing: text {100 * texts:.1f}%, counts {100 * counts:.1f}% of {len(a)} frames')
    print(
        f'  verdict: bfloat16 {"within" if safe else "beyond"} the tolerance '
        f'(confidence {args.tolerance:g}, counts 0)'
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--models', nargs='+', default=['demo-clip', 'demo-blip', 'base-clip'])
    parser.add_argument('--scenes', type=int, default=3)
    parser.add_argument('--per-scene', type=int, default=20)
    parser.add_argument('--batch', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--max-new-tokens', type=int, default=40)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--tolerance', type=float, default=0.001)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as tmp:
        for name in args.models:
            source, backend_name = name.split('-', 1)
            if source == 'demo':
                model = 'demo'
            else:
                model = str(build_base_model(backend_name, Path(tmp) / name, seed=0))
            bench_model(name, backend_name, model, args, checks)
    return checks.exit_code()


if __name__ == '__main__':
    raise SystemExit(main())
