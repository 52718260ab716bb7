"""Benchmark: `metavlm export` throughput (violations/s, MB/s) on a large synthetic tester results directory.

Usage: python bench/foxglove_export.py [--searches 300] [--evaluations 100] [--violations 5]
       [--kept 3] [--size 640x480] [--repeats 3]
Writes a results directory shaped as the tester node's (evaluations.jsonl, violations.jsonl,
summary.jsonl, search.json, each search's stored source frame under sources/, and a follow-up PNG for
the first --kept violations of each search, as the tester's violation_pngs_per_search keeps them)
without a model, then times, interleaved, reading every record strictly (what any reader of the
directory pays) and the whole export to MCAP, which makes the other violations' follow-ups again from
the stored source frames. Checks: the MCAP holds every violation and follow-up, read back with the
mcap library. The live server's cost on evaluations/s: bench/foxglove_live.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from mcap.reader import make_reader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved  # noqa: E402

from metavlm_ros.common.images import encode_png
from metavlm_ros.common.results import iter_jsonl, source_digest
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.viewer.export import export_mcap

CLASSES = ('animal', 'vegetation', 'object', 'trash')


def record(rng: np.random.Generator, search: int, index: int, violating: bool) -> dict:
    """An evaluation record as the tester writes it (docs/results.md), values drawn at random."""
    stamp = 1_767_225_600_000_000_000 + search * 2_000_000_000  # one frame every 2 s
    source = {c: float(rng.uniform(-0.3, 0.3)) for c in CLASSES}
    shift = 0.2 if violating else 0.001
    followup = {c: v + shift for c, v in source.items()}
    return {
        'image': f'camera@{stamp}', 'algorithm': 'nsga2', 'seed': search, 'model': 'demo-clip',
        'backend': 'clip', 'stamp_ns': stamp, 'source_stamp': stamp, 'endpoint': 'inprocess',
        'frame_sha256': f'{search:016x}', 'working_size': 64, 'index': index, 'generation': index // 10,
        'genotype': [float(v) for v in rng.uniform(0, 1, 12)], 'composition': '{2,3}', 'order': 2,
        'parameters': {'scaling': 1.1, 'histogram_equalization': 1.4}, 'f_trans': 0.73,
        'f_pred': 0.8 if violating else 0.004, 'kind': 'confidence', 'source': source, 'followup': followup,
        'source_text': '', 'followup_text': '',
        'violation': {t: violating for t in ('0.01', '0.03', '0.05')},
        'strength': {t: (0.8 if violating else None) for t in ('0.01', '0.03', '0.05')},
        'cached': False, 'failed': False,
    }  # fmt: skip


def make_results(
    directory: Path, searches: int, evaluations: int, violations: int, kept: int, size: tuple
) -> int:
    """Write the synthetic results directory; returns the number of violations."""
    rng = np.random.default_rng(0)
    (directory / 'frames').mkdir(parents=True)
    (directory / 'sources').mkdir()
    (directory / 'search.json').write_text(
        json.dumps({'format': 1, 'identity': {'model': {'backend': 'clip'}}})
    )
    width, height = size
    scenes = SceneGenerator(width, height, 0.5, seed=3, frames=searches)
    count = 0
    with (
        open(directory / 'evaluations.jsonl', 'w') as evals,
        open(directory / 'violations.jsonl', 'w') as viols,
        open(directory / 'summary.jsonl', 'w') as sums,
    ):
        for search in range(searches):
            # A rendered underwater frame per search: a PNG as large as a real follow-up's.
            rgb = scenes.frame(search)[0]
            png = encode_png(rgb)
            source = f'sources/{source_digest(rgb)}.png'
            (directory / source).write_bytes(png)
            for index in range(evaluations):
                rec = record(rng, search, index, index < violations)
                evals.write(json.dumps(rec) + '\n')
                if index < violations:
                    name = f'frames/s{search:05d}_e{index:05d}.png' if index < kept else None
                    if name:
                        (directory / name).write_bytes(png)
                    viols.write(json.dumps({**rec, 'frame': name}) + '\n')
                    count += 1
            summary = {
                k: rec[k] for k in ('image', 'algorithm', 'seed', 'model', 'backend', 'kind', 'stamp_ns')
            }
            stored = {'source_frame': source, 'source_sha256': source_digest(rgb), 'warp': 'fused'}
            sums.write(
                json.dumps({**summary, **stored, 'evaluations': evaluations, 'hypervolume': 0.3}) + '\n'
            )
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--searches', type=int, default=300, help='searches (10 min at one per 2 s: 300)')
    parser.add_argument('--evaluations', type=int, default=100, help='evaluations per search')
    parser.add_argument('--violations', type=int, default=5, help='violations per search')
    parser.add_argument(
        '--kept', type=int, default=3, help="violations per search with a kept PNG (the tester's default: 3)"
    )
    parser.add_argument('--size', default='640x480', help='follow-up PNG size')
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split('x'))
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as root:
        root = Path(root)
        results, out = root / 'results', root / 'run.mcap'
        violations = make_results(results, args.searches, args.evaluations, args.violations, args.kept, size)
        in_bytes = sum(p.stat().st_size for p in results.rglob('*') if p.is_file())

        def read() -> None:
            for name in ('evaluations.jsonl', 'violations.jsonl', 'summary.jsonl'):
                for _ in iter_jsonl(results / name, strict=True):
                    pass

        def export() -> None:
            export_mcap(results, out, overwrite=True)

        samples = interleaved({'read records': read, 'export': export}, args.repeats)
        out_bytes = out.stat().st_size
        print(
            f'{args.searches} searches x {args.evaluations} evaluations, {violations} violations, '
            f'{min(args.kept, args.violations)} a search with a kept {args.size} PNG, the rest rendered; '
            f'results {in_bytes / 2**20:.1f} MiB, MCAP {out_bytes / 2**20:.1f} MiB; '
            f'{args.repeats} interleaved repeats (min / median / max)'
        )
        print(f'  read records strictly: seconds {fmt(samples["read records"], digits=2)}')
        print(f'  export:                seconds {fmt(samples["export"], digits=2)}')
        rates = [violations / s for s in samples['export']]
        print(f'  export: violations/s  {fmt(sorted(rates), digits=0)}')
        print(
            f'  export: MB/s read     {fmt(sorted(in_bytes / 1e6 / s for s in samples["export"]), digits=1)}'
        )
        print(
            f'  export: MB/s written  {fmt(sorted(out_bytes / 1e6 / s for s in samples["export"]), digits=1)}'
        )

        with open(out, 'rb') as handle:
            summary = make_reader(handle).get_summary()
        counts = summary.statistics.channel_message_counts
        topics = {c.id: c.topic for c in summary.channels.values()}
        by_topic = {topics[i]: n for i, n in counts.items()}
        checks.check(by_topic.get('/metavlm/violations') == violations, 'every violation is in the MCAP')
        checks.check(
            by_topic.get('/metavlm/followup/image') == violations, 'every follow-up PNG is in the MCAP'
        )
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
