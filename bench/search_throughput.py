"""Benchmark: evaluations per second of metavlm_ros's search against a naive loop, same model and budget.

Run from the repository root: ``python bench/search_throughput.py [--evaluations 150]``.

The naive loop is how a research prototype judges a genotype: it infers the source frame again on
every evaluation, sends one image at a time to the model, and applies the relations one by one with
PIL (bench/transforms.py). The library computes the source prediction once, fuses affine warps,
judges a whole generation in one batched call and serves repeated compositions from a cache. Both
judge the same genotypes (random search, same seed) with the same tiny CLIP on a 1920x1080 frame;
the benchmark checks that they agree on every f_pred before it prints the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transforms import pil_composition, synthetic_frame

from metavlm_ros.core.encoding import N_VAR, SearchSpace, decode
from metavlm_ros.core.objectives import f_pred
from metavlm_ros.core.search import SearchConfig, run_search
from metavlm_ros.core.tiny import build_tiny_model
from metavlm_ros.core.vlm import create_backend


def naive_loop(frame: np.ndarray, backend, config: SearchConfig) -> tuple[list[float], float]:
    """Judge `config.evaluations` random genotypes the prototype way; return f_pred values and seconds."""
    rng = np.random.default_rng(config.seed)
    xl, xu = config.space.bounds()
    xu = np.maximum(xu, xl + 1e-9)
    values = []
    start = time.perf_counter()
    done = 0
    while done < config.evaluations:
        size = min(config.population, config.evaluations - done)
        for x in rng.uniform(xl, xu, size=(size, N_VAR)):
            composition = decode(x, config.space)
            source = backend.predict([frame])[0]
            followup = backend.predict([pil_composition(frame, composition.parameters)])[0]
            values.append(f_pred(source, followup) if composition.order else 0.0)
        done += size
    return values, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Print evaluations/s of both, side by side, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--evaluations', type=int, default=150)
    parser.add_argument('--population', type=int, default=30)
    parser.add_argument('--width', type=int, default=1920)
    parser.add_argument('--height', type=int, default=1080)
    parser.add_argument('--threads', type=int, default=2, help='torch threads (this machine has 2 cores)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    frame = synthetic_frame(args.width, args.height)
    config = SearchConfig(
        algorithm='random',
        population=args.population,
        evaluations=args.evaluations,
        seed=0,
        space=SearchSpace.default(),
    )
    with tempfile.TemporaryDirectory() as tmp:
        backend = create_backend(
            'clip', str(build_tiny_model('clip', Path(tmp) / 'clip', seed=0)), device='cpu'
        )
        backend.predict([frame])  # warm-up: first-call allocations are not part of either figure

        naive_values, naive_s = naive_loop(frame, backend, config)
        result = run_search(frame, backend, config)
        nsga = run_search(
            frame,
            backend,
            SearchConfig(algorithm='nsga2', population=args.population, evaluations=args.evaluations, seed=0),
        )

    ours = [ev.f_pred for ev in result.evaluations]
    # PIL and OpenCV interpolate differently, so the follow-up frames differ by a grey level or so:
    # the tiny model's answers agree closely, not exactly.
    gap = float(np.max(np.abs(np.array(ours) - np.array(naive_values))))
    naive_rate = args.evaluations / naive_s
    ours_rate = args.evaluations / result.seconds
    nsga_rate = args.evaluations / nsga.seconds
    print(
        f'frame {args.width}x{args.height}, tiny CLIP on CPU ({args.threads} threads), '
        f'{args.evaluations} evaluations, population {args.population}'
    )
    print(f'{"pipeline":<42}{"seconds":>10}{"eval/s":>10}{"frames to model":>17}')
    print(
        f'{"naive loop (PIL, source every time, 1/call)":<42}{naive_s:>10.2f}{naive_rate:>10.1f}'
        f'{2 * args.evaluations:>17}'
    )
    print(
        f'{"metavlm_ros search, Rand":<42}{result.seconds:>10.2f}{ours_rate:>10.1f}{result.frames_judged:>17}'
    )
    print(
        f'{"metavlm_ros search, NSGA-II":<42}{nsga.seconds:>10.2f}{nsga_rate:>10.1f}{nsga.frames_judged:>17}'
    )
    print(f'ratio (Rand, same genotypes): {ours_rate / naive_rate:.2f}x   target >= 3')
    print(f'ratio (NSGA-II vs naive):     {nsga_rate / naive_rate:.2f}x')
    print(f'largest f_pred difference between the two pipelines on the same genotypes: {gap:.4f}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
