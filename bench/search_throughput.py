"""Benchmark: evaluations per second of metavlm_ros's search against the authors' loop, same genotypes.

Run from the repository root:

    python bench/search_throughput.py                       # tiny and real-size CLIP, 3 repetitions
    python bench/search_throughput.py --models base --repeats 5 --evaluations 120

Models: `tiny` (the test suite's 32-pixel CLIP) and `base`, a random-initialised CLIP of the released
ViT-B/32 shape (151 M parameters, built offline: timing does not depend on weights). On one
1920x1080 frame, every repetition runs these variants, in an order rotated by one each time:

- authors' loop: per genotype, the source frame is inferred again, the follow-up is built with PIL
  one relation at a time (bench/transforms.py) at full resolution, and one image goes to the model
  through the Hugging Face processor per call;
- search, full size, processor: metavlm_ros's search (source once, fused OpenCV warps, one batched
  call per generation, cache) at full resolution, frames through the Hugging Face processor;
- search, full size, PixelPath: the same with the batched pixel path (core.vlm.PixelPath);
- search, defaults: working size auto (2x the model's input side) and PixelPath: what users get;
- NSGA-II, defaults.

The Rand variants and the authors' loop judge the same genotypes (the loop is handed those the
search drew). Time inside the model (the forward pass, `_predict_batch`) is measured in every run,
so the time outside it is reported too. The bench exits 1 when a check fails: the same genotypes;
each variant identical across repetitions; the search at the defaults equal (1e-4) to a plain loop
with the same relations, batch 1 and the processor on the working-size frame; and, where the pixels
differ by implementation (PIL against OpenCV, PixelPath against the processor on full-size frames),
f_pred within --tolerance. How far the working size moves f_pred from full size is printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, rotations  # noqa: E402
from transforms import pil_composition, synthetic_frame  # noqa: E402

from metavlm_ros.method.encoding import decode
from metavlm_ros.method.objectives import f_pred
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.method.search import SearchConfig, run_search, searched_frame
from metavlm_ros.models.tiny import build_base_model, build_tiny_model
from metavlm_ros.models.vlm import create_backend


class ModelClock:
    """Accumulates the seconds a backend spends in its forward passes (`_predict_batch`)."""

    def __init__(self, backend) -> None:
        self.seconds = 0.0
        inner = backend._predict_batch

        def timed(pixels):
            start = time.perf_counter()
            try:
                return inner(pixels)
            finally:
                self.seconds += time.perf_counter() - start

        backend._predict_batch = timed

    def lap(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def authors_loop(frame, backend, space, genotypes, pil: bool = True) -> list[float]:
    """The prototype's loop over the given genotypes: source again every time, batch 1, PIL relations
    (or, with pil False, metavlm_ros's own: then it differs from the search only in its machinery)."""
    values = []
    for x in genotypes:
        composition = decode(x, space)
        source = backend.predict([frame])[0]
        if pil:
            followup_frame = pil_composition(frame, composition.parameters)
        else:
            followup_frame = apply_composition(frame, composition)
        followup = backend.predict([followup_frame])[0]
        values.append(f_pred(source, followup) if composition.order else 0.0)
    return values


def bench_model(name: str, directory: Path, frame: np.ndarray, args, checks: Checks) -> None:
    processor = create_backend('clip', str(directory), device='cpu', preprocess='processor', batch_size=64)
    batched = create_backend('clip', str(directory), device='cpu', batch_size=64)
    clocks = {id(processor): ModelClock(processor), id(batched): ModelClock(batched)}
    for backend in (processor, batched):
        backend.predict([frame] * 2)  # warm-up: first-call allocations are not part of any figure

    def config(algorithm: str, working_size) -> SearchConfig:
        return SearchConfig(
            algorithm=algorithm,
            population=args.population,
            evaluations=args.evaluations,
            seed=0,
            working_size=working_size,
        )

    genotypes = [ev.genotype for ev in run_search(frame, batched, config('random', 'auto')).evaluations]
    space = config('random', None).space

    def searched(backend, cfg):
        def run():
            result = run_search(frame, backend, cfg)
            return [ev.f_pred for ev in result.evaluations], [ev.genotype for ev in result.evaluations]

        return backend, run

    variants = {
        "authors' loop (PIL, source again, batch 1)": (
            processor,
            lambda: (authors_loop(frame, processor, space, genotypes), genotypes),
        ),
        'search, full size, processor': searched(processor, config('random', None)),
        'search, full size, PixelPath': searched(batched, config('random', None)),
        'search, defaults (auto working size)': searched(batched, config('random', 'auto')),
        'NSGA-II, defaults': searched(batched, config('nsga2', 'auto')),
    }
    seconds = {v: [] for v in variants}
    model_s = {v: [] for v in variants}
    outputs = {v: [] for v in variants}
    for order in rotations(list(variants), args.repeats):
        for variant in order:
            backend, run = variants[variant]
            clock = clocks[id(backend)]
            clock.lap()
            start = time.perf_counter()
            values, judged = run()
            seconds[variant].append(time.perf_counter() - start)
            model_s[variant].append(clock.lap())
            outputs[variant].append((values, judged))

    n = args.evaluations
    print(
        f'\n{name} CLIP ({sum(p.numel() for p in batched.model.parameters()) / 1e6:.0f} M parameters, '
        f'input {batched.input_size} px), frame {frame.shape[1]}x{frame.shape[0]}, {n} evaluations, '
        f'population {args.population}, {args.repeats} interleaved repetitions, torch threads '
        f'{torch.get_num_threads()}'
    )
    print(f'  {"variant":<46}{"eval/s min / median / max":>28}{"outside model, % of model":>30}')
    rates = {}
    for variant in variants:
        rate = [n / s for s in seconds[variant]]
        outside = [100.0 * (s - m) / m for s, m in zip(seconds[variant], model_s[variant], strict=True)]
        rates[variant] = sorted(rate)[len(rate) // 2]
        print(f'  {variant:<46}{fmt(rate):>28}{fmt(outside):>30}')
    authors = rates["authors' loop (PIL, source again, batch 1)"]
    for variant in list(variants)[1:]:
        print(f"  median ratio, {variant} / authors' loop: {rates[variant] / authors:.2f}x")
    print(
        '  median ratio, defaults / full size with the processor: '
        f'{rates["search, defaults (auto working size)"] / rates["search, full size, processor"]:.2f}x'
    )

    first = {v: outputs[v][0] for v in variants}
    for variant in variants:
        checks.check(
            all(values == first[variant][0] for values, _ in outputs[variant]),
            f'{name}: {variant}: the same f_pred in every repetition',
        )
    rand = [v for v in variants if not v.startswith('NSGA')]
    checks.check(
        all(
            len(first[v][1]) == len(genotypes)
            and all(np.array_equal(a, b) for a, b in zip(first[v][1], genotypes, strict=True))
            for v in rand
        ),
        f"{name}: the authors' loop and the three Rand searches judged the same {len(genotypes)} genotypes",
    )
    # The search's machinery (source once, batches, cache, PixelPath) must not change a single answer:
    # a plain loop with the same relations, batch 1 and the processor gives the same f_pred.
    small = searched_frame(frame, config('random', 'auto'), batched)
    plain = np.array(authors_loop(small, processor, space, genotypes, pil=False))
    ours = np.array(first['search, defaults (auto working size)'][0])
    gap = float(np.max(np.abs(ours - plain)))
    checks.check(
        gap <= 1e-4,
        f'{name}: largest f_pred difference, search at defaults vs a plain loop (same relations, batch 1, '
        f'processor) on the {small.shape[1]}x{small.shape[0]} working-size frame: {gap:.2e} (tolerance 1e-4)',
    )
    # Different pixels, same judgements within a tolerance: PIL against OpenCV relations, and
    # PixelPath's box reduction against the processor on full-size frames.
    reference = np.array(first['search, full size, processor'][0])
    for variant, tolerance in (
        ("authors' loop (PIL, source again, batch 1)", args.tolerance),
        ('search, full size, PixelPath', args.tolerance),
    ):
        gap = float(np.max(np.abs(np.array(first[variant][0]) - reference)))
        checks.check(
            gap <= tolerance,
            f'{name}: largest f_pred difference, {variant} vs search at full size with the processor: '
            f'{gap:.4f} (tolerance {tolerance:g})',
        )
    source_full = processor.predict([frame])[0].values
    source_small = batched.predict([small])[0].values
    print(
        f'  working size {small.shape[1]}x{small.shape[0]} against full size (reported, not a check): '
        f'source confidences differ by at most '
        f'{max(abs(source_full[c] - source_small[c]) for c in source_full):.4f}; '
        f'f_pred by at most {float(np.max(np.abs(ours - reference))):.4f}, '
        f'median {float(np.median(np.abs(ours - reference))):.4f}'
    )


def main(argv: list[str] | None = None) -> int:
    """Print eval/s of every variant side by side, the ratios, and the agreement checks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--models', nargs='+', default=['tiny', 'base'], choices=('tiny', 'base'))
    parser.add_argument('--evaluations', type=int, default=90)
    parser.add_argument('--population', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--width', type=int, default=1920)
    parser.add_argument('--height', type=int, default=1080)
    parser.add_argument('--threads', type=int, default=2, help='torch threads (default 2)')
    parser.add_argument(
        '--tolerance',
        type=float,
        default=0.1,
        help='largest f_pred difference allowed where pixels differ (PIL vs OpenCV; PixelPath vs processor)',
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    frame = synthetic_frame(args.width, args.height)
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as tmp:
        for name in args.models:
            build = build_base_model if name == 'base' else build_tiny_model
            bench_model(name, build('clip', Path(tmp) / name, seed=0), frame, args, checks)
    return checks.exit_code()


if __name__ == '__main__':
    raise SystemExit(main())
