"""Benchmark: MB per hour of a tester-like run at 1080p at defaults, today's layout against earlier ones
side by side: a violations.jsonl member a generation against a member a violation, the tester's
follow-up PNGs at their defaults against 3 + 3, records format 3 against format 2.

Usage: python bench/results_size.py [--repeats 3] [--evaluations 3000] [--searches-per-hour 136]

A tester-like run, in one process without ROS: synthetic 1080p footage (a new frame per search, as
the tester takes the newest camera frame every search), the tester's defaults (the demo CLIP, the
auto working size of its 384 px transport: 768 px, population 30, 3000 evaluations, report
threshold 0.05, its Pareto and violation PNG budgets) and its record fields (model, frame_sha256,
source_stamp, endpoint). Each repetition searches one frame once per variant, in rotated order, each
variant into its own results directory; the published violations are written as the tester writes
them (violations.jsonl, the first ones of a search with a PNG): `now`, the violations of a generation
as one gzip member once the generation's evaluations are on disk (the tester since issue 36's second
step), `before`, each violation a member of its own as it was judged (issue 36's first step). The
variants (VARIANTS): every Pareto PNG (for the render check), format 3 now at the tester's PNG
defaults and at the other budgets weighed (PNG_BUDGETS: Pareto + violation PNGs a search, 3 + 3
the defaults before), format 3 before (3 + 3), and format 2 (a directory an earlier version
started, which the store appends to in its own format: header lines, the usual values left out, a
Pareto or violation line that refers to its evaluation by index; 3 + 3).
Prints bytes per search by file, min / median / max, and MB per hour at `--searches-per-hour` (136:
issue 30's 15-minute `metavlm run` at 1080p 10 Hz did 34 searches) and at the rate measured here (no
ROS, no transport); bytes per record of each record file in each layout, and as each record whole on
its own line, uncompressed; and what OpenCV's PNG settings make of the PNGs written (bytes, ms).
Checks: every layout holds the same records, the budgeted run has every record of the full one,
every Pareto and violation record reads back whole (its evaluation record plus its own fields), and
every Pareto member re-renders byte for byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, rotations  # noqa: E402

from metavlm_ros.common.images import encode_png
from metavlm_ros.common.results import ResultsStore, read_jsonl, record_key, records_file
from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.method import defaults
from metavlm_ros.method.render import render_search
from metavlm_ros.method.search import SearchConfig, evaluation_record, run_search
from metavlm_ros.models.vlm import create_backend

# name: (Pareto PNGs, violation PNGs, records format 2, a violations member a generation)
DEFAULT_PNGS = (defaults.TESTER_PARETO_PNGS, defaults.TESTER_VIOLATION_PNGS)
NOW = 'now ({} + {} PNGs)'.format(*DEFAULT_PNGS)
# The tester's PNG budgets weighed for issue 36 (Pareto + violation PNGs a search), its defaults first.
PNG_BUDGETS = list(dict.fromkeys([DEFAULT_PNGS, (1, 0), (0, 1), (0, 0), (3, 3)]))
VARIANTS = {
    'now, every Pareto PNG': (None, defaults.TESTER_VIOLATION_PNGS, False, True),
    **{'now ({} + {} PNGs)'.format(*pngs): (*pngs, False, True) for pngs in PNG_BUDGETS},
    'format 3 before (3 + 3 PNGs)': (3, 3, False, False),
    'format 2 (3 + 3 PNGs)': (3, 3, True, False),
}
REPORT_KEY, WORKING_SIZE = '0.05', 768


def _search(out: Path, frame, index: int, backend, evaluations: int, variant) -> tuple[int, float]:
    """One tester-like search into `out`; returns (bytes the directory grew by, seconds)."""
    pareto_pngs, violation_pngs, format_2, per_generation = variant
    if format_2 and not out.exists():  # an earlier version's directory: appended to in format 2
        out.mkdir(parents=True)
        (out / 'evaluations.jsonl').touch()
    config = SearchConfig(evaluations=evaluations, working_size=WORKING_SIZE, pareto_pngs=pareto_pngs)
    stamp = 1_700_000_000_000_000_000 + index * 100_000_000
    extra = {
        'source_stamp': stamp,
        'endpoint': 'inprocess',
        'model': backend.model_id,
        'frame_sha256': frame_digest(frame),
    }
    with ResultsStore(out) as store:
        before = store.size_bytes
        pngs = 0

        def violation(ev, result) -> dict | None:
            """The record of a violation the tester publishes (its PNG first, within the cap)."""
            nonlocal pngs
            if ev.cached or not ev.violation.get(REPORT_KEY):
                return None
            path = None
            if pngs < violation_pngs:
                path = store.save_frame(f'camera_{stamp}_violation_e{ev.index:05d}', ev.followup_frame)
                pngs += 1
            relative = None if path is None else str(path.relative_to(out))
            return {**evaluation_record(ev, result, extra), 'frame': relative}

        def on_evaluation(ev, result) -> None:  # before: a member a violation, as judged
            record = violation(ev, result)
            if record is not None:
                store.append_violation(record)

        def on_generation(batch, result) -> None:  # now: a member a generation, its evaluations on disk
            store.append_violations([r for r in (violation(ev, result) for ev in batch) if r is not None])

        hooks = {'on_generation': on_generation} if per_generation else {'on_evaluation': on_evaluation}
        started = time.perf_counter()
        run_search(frame, backend, config, image_id=f'camera@{stamp}', store=store, extra_fields=extra,
                   **hooks)  # fmt: skip
        return store.size_bytes - before, time.perf_counter() - started


def _png_settings(directory: Path, label: str) -> None:
    """What OpenCV's PNG settings make of the source frames and follow-ups written: bytes and ms."""
    import cv2

    frames = [cv2.imread(str(p)) for p in sorted(directory.rglob('*.png'))]
    c, s, f = cv2.IMWRITE_PNG_COMPRESSION, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_FILTER
    settings = {
        'OpenCV default (what encode_png writes)': ('.png', []),
        'compression 3': ('.png', [c, 3]),
        'compression 6': ('.png', [c, 6]),
        'compression 9': ('.png', [c, 9]),
        'compression 9, RLE strategy, all filters': (
            '.png',
            [c, 9, s, cv2.IMWRITE_PNG_STRATEGY_RLE, f, cv2.IMWRITE_PNG_ALL_FILTERS],
        ),  # fmt: skip
        'WebP lossless (for scale; not PNG)': ('.webp', [cv2.IMWRITE_WEBP_QUALITY, 101]),
    }
    base = None
    print(f'PNG settings on the {len(frames)} PNGs (sources and follow-ups) of {label}:')
    for name, (ext, params) in settings.items():
        started = time.perf_counter()
        size = sum(len(cv2.imencode(ext, bgr, params)[1]) for bgr in frames)
        ms = (time.perf_counter() - started) / len(frames) * 1000
        base = base or size
        print(f'    {name}: {size / len(frames) / 1e3:.0f} kB a PNG ({size / base:.3f}), {ms:.0f} ms a PNG')


def _unframed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ('rank', 'frame')}


def _by_file(out: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in out.rglob('*'):
        if path.is_file():
            key = path.parent.name if path.suffix == '.png' else path.name
            sizes[key] = sizes.get(key, 0) + path.stat().st_size
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--evaluations', type=int, default=defaults.EVALUATIONS)
    parser.add_argument('--searches-per-hour', type=float, default=136.0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    backend = create_backend('clip', 'demo', device='cpu')
    scenes = SceneGenerator(1920, 1080, 10.0, seed=7, frames=args.repeats)
    checks = Checks()
    grown: dict[str, list[int]] = {name: [] for name in VARIANTS}
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as root:
        dirs = {name: Path(root) / f'v{i}' for i, name in enumerate(VARIANTS)}
        for repeat, order in enumerate(rotations(list(VARIANTS), args.repeats)):
            frame, _truth = scenes.frame(repeat)
            for name in order:
                size, took = _search(dirs[name], frame, repeat, backend, args.evaluations, VARIANTS[name])
                grown[name].append(size)
                seconds[name].append(took)
        print(f'{args.repeats} searches per variant of {args.evaluations} evaluations, 1920x1080 frames at '
              f'{WORKING_SIZE} px, demo CLIP on CPU (1 torch thread)')  # fmt: skip
        for name, out in dirs.items():
            per_file = {k: v / args.repeats / 1e6 for k, v in sorted(_by_file(out).items())}
            members = statistics.mean(len(s['pareto']) for s in read_jsonl(out / 'summary.jsonl'))
            mb = [b / 1e6 for b in grown[name]]
            rate_here = 3600 / statistics.median(seconds[name])
            print(f'{name}: MB per search min / median / max {min(mb):.2f} / {statistics.median(mb):.2f} / '
                  f'{max(mb):.2f}; front {members:.0f} members on average; seconds per search '
                  f'{statistics.median(seconds[name]):.1f}')  # fmt: skip
            print('    by file (MB per search): ' + ', '.join(f'{k} {v:.2f}' for k, v in per_file.items()))
            hourly = ' / '.join(
                f'{v * args.searches_per_hour:.0f}' for v in (min(mb), statistics.median(mb), max(mb))
            )
            here = statistics.median(mb) * rate_here
            print(f'    MB per hour at {args.searches_per_hour:.0f} searches an hour (extrapolated) '
                  f"{hourly}; at this machine's rate ({rate_here:.0f} an hour): {here:.0f}")  # fmt: skip
        full, budgeted = dirs['now, every Pareto PNG'], dirs[NOW]
        layouts = {
            'now': budgeted,
            'before': dirs['format 3 before (3 + 3 PNGs)'],
            'format 2': dirs['format 2 (3 + 3 PNGs)'],
        }
        for name in ('evaluations.jsonl', 'pareto.jsonl', 'violations.jsonl'):
            records = read_jsonl(budgeted / name)
            n = len(records)
            # Each record whole on its own line, uncompressed: same fields, same bytes.
            whole = sum(len(json.dumps(r, separators=(',', ':'))) + 1 for r in records)
            stored = ', '.join(
                f'{records_file(out / name).stat().st_size / n:.0f} {layout}'
                for layout, out in layouts.items()
            )
            print(f'{name}: {n} records, bytes per record {stored}; {whole / n:.0f} each line whole, '
                  'uncompressed')  # fmt: skip
            for variant, out in dirs.items():
                # The same records in every variant; only the PNG budgets change `frame`.
                checks.check(
                    [_unframed(r) for r in read_jsonl(out / name)] == [_unframed(r) for r in records],
                    f'{name}: {variant} holds the same records',
                )
        evaluations = {record_key(r): r for r in read_jsonl(budgeted / 'evaluations.jsonl')}
        whole = [
            _unframed(r) == evaluations[record_key(r)]
            for out in dirs.values()
            for name in ('pareto.jsonl', 'violations.jsonl')
            for r in read_jsonl(out / name)
        ]
        checks.check(bool(whole) and all(whole), 'every Pareto and violation record reads back whole')
        pareto = {(p['image'], p['index']): p for p in read_jsonl(full / 'pareto.jsonl')}
        same = True
        for summary in read_jsonl(budgeted / 'summary.jsonl'):
            frames = render_search(budgeted, summary, summary['pareto'])
            for index, rgb in frames.items():
                stored = full / pareto[(summary['image'], index)]['frame']
                same &= stored.read_bytes() == encode_png(rgb)
        checks.check(same, 'every Pareto member of the budgeted run renders to the PNG the full run wrote')
        _png_settings(dirs['now (3 + 3 PNGs)'], 'now (3 + 3 PNGs)')
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
