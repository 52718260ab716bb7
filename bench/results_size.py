"""Benchmark: MB per hour of a tester-like run at 1080p at defaults: every Pareto PNG against the budget,
and records format 3 (gzip members of whole records) against format 2 (header lines).

Usage: python bench/results_size.py [--repeats 3] [--evaluations 3000] [--searches-per-hour 136]

A tester-like run, in one process without ROS: synthetic 1080p footage (a new frame per search, as
the tester takes the newest camera frame every search), the tester's defaults (the demo CLIP, the
auto working size of its 384 px transport: 768 px, population 30, 3000 evaluations, report
threshold 0.05, 3 violation PNGs a search) and its record fields (model, frame_sha256, source_stamp,
endpoint). Each repetition searches one frame with `pareto_pngs` all (before) and at its default
(after), in rotated order, each variant into its own results directory; the published violations
are written as the tester does (violations.jsonl, the first 3 PNGs). Prints bytes per search by
file, min / median / max, and MB per hour at `--searches-per-hour` (136: issue 30's 15-minute
`metavlm run` at 1080p 10 Hz did 34 searches) and at the rate measured here (no ROS, no transport).
A third variant writes the budgeted run in records format 2 (a directory an earlier version
started, which the store appends to in its own format: header lines, the usual values left out, a
Pareto or violation line that refers to its evaluation by index). Prints bytes per record of each
record file as stored in format 3 and in format 2, and as each record whole on its own line,
uncompressed, from the same records.
Checks: the budgeted run has every record of the full one, format 2 holds the same records as format
3, every Pareto and violation record reads back whole (its evaluation record plus its own fields),
and every member re-renders byte for byte.
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
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.method.render import render_search
from metavlm_ros.method.search import SearchConfig, evaluation_record, run_search, searched_frame
from metavlm_ros.models.vlm import create_backend

# name: (Pareto PNGs, records format 2)
VARIANTS = {
    'before (all)': (None, False),
    f'after ({defaults.PARETO_PNGS})': (defaults.PARETO_PNGS, False),
    f'format 2, after ({defaults.PARETO_PNGS})': (defaults.PARETO_PNGS, True),
}
VIOLATION_PNGS, REPORT_KEY, WORKING_SIZE = 3, '0.05', 768


def _search(out: Path, frame, index: int, backend, evaluations: int, variant) -> tuple[int, float]:
    """One tester-like search into `out`; returns (bytes the directory grew by, seconds)."""
    pareto_pngs, format_2 = variant
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

        def on_evaluation(ev, result) -> None:
            nonlocal pngs
            if ev.cached or not ev.violation.get(REPORT_KEY):
                return
            path = None
            if pngs < VIOLATION_PNGS:
                path = store.save_frame(
                    f'camera_{stamp}_violation_e{ev.index:05d}', apply_composition(judged, ev.composition)
                )
                pngs += 1
            relative = None if path is None else str(path.relative_to(out))
            store.append_violation({**evaluation_record(ev, result, extra), 'frame': relative})

        judged = searched_frame(frame, config, backend)
        started = time.perf_counter()
        run_search(frame, backend, config, image_id=f'camera@{stamp}', store=store,
                   on_evaluation=on_evaluation, extra_fields=extra)  # fmt: skip
        return store.size_bytes - before, time.perf_counter() - started


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
        full, budgeted, format_2 = dirs.values()
        for name in ('evaluations.jsonl', 'pareto.jsonl', 'violations.jsonl'):
            records = read_jsonl(budgeted / name)
            # Each record whole on its own line, uncompressed: same fields, same bytes.
            whole = sum(len(json.dumps(r, separators=(',', ':'))) + 1 for r in records)
            stored = records_file(budgeted / name).stat().st_size
            stored_2 = records_file(format_2 / name).stat().st_size
            n = len(records)
            print(f'{name}: {n} records, bytes per record {stored / n:.0f} in format 3, {stored_2 / n:.0f} '
                  f'in format 2, {whole / n:.0f} each line whole, uncompressed')  # fmt: skip
            checks.check(read_jsonl(format_2 / name) == records, f'{name}: format 2 holds the same records')
        checks.check(
            read_jsonl(full / 'evaluations.jsonl') == read_jsonl(budgeted / 'evaluations.jsonl'),
            'the budget keeps every evaluation record',
        )
        evaluations = {record_key(r): r for r in read_jsonl(budgeted / 'evaluations.jsonl')}
        whole = [
            {k: v for k, v in r.items() if k not in ('rank', 'frame')} == evaluations[record_key(r)]
            for name in ('pareto.jsonl', 'violations.jsonl')
            for r in read_jsonl(budgeted / name)
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
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
