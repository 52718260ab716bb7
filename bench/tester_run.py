"""Benchmark: a tester run as a user runs it onboard, its resident memory and results over time.

Usage: python bench/tester_run.py [--duration 900] [--every 10] [--frames 20] [--params config/metavlm.yaml]

Writes synthetic 1920x1080 footage (`metavlm scenes`, a bag of --frames raw frames), then runs
`metavlm run --params config/metavlm.yaml --source BAG --loop --rate 10 --duration N` (both nodes in
one process at the shipped defaults, results into a temporary directory: issue 30's command) and
samples every --every seconds the resident memory of the process and its children (VmRSS), its
open files, the results directory's MB and its finished searches. Prints the samples, then RSS
after the first search, in the middle, at the end and at most, and MB an hour: over the whole run,
and from the first finished search on (what spends `results_max_mb`). Issue 30 asks for RSS as flat
over a 15-minute run (--duration 900) as before (745 -> 796 MiB, +1 MiB after warm-up) and <= 500
MB an hour; issue 36 for <= 200 MB an hour, RSS as flat. Checks that `metavlm run` exits 0 and
finishes a search, and that every record reads back whole (strictly). Linux only (/proc). Set
ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST to keep it off other graphs. Exits 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks  # noqa: E402

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.results import directory_bytes, iter_jsonl, read_jsonl

RECORD_FILES = ('evaluations.jsonl', 'pareto.jsonl', 'violations.jsonl', 'summary.jsonl')

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _family(pid: int) -> list[int]:
    """A process and its descendants (from /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f'/proc/{current}/task').glob('*'):
            try:
                todo += [int(child) for child in (task / 'children').read_text().split()]
            except OSError:
                continue
    return found


def _status(pid: int, field: str) -> int:
    try:
        with open(f'/proc/{pid}/status') as status:
            return next((int(line.split()[1]) for line in status if line.startswith(field + ':')), 0)
    except OSError:
        return 0


def _open_files(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f'/proc/{pid}/fd'))
        except OSError:
            continue
    return total


def _sample(pid: int, started: float, results: Path) -> tuple[float, float, int, float, int]:
    """(seconds, RSS MiB of the process and its children, open files, results MB, finished searches)."""
    pids = _family(pid)
    rss = sum(_status(p, 'VmRSS') for p in pids) / 1024
    searches = len(read_jsonl(results / 'summary.jsonl'))
    return time.monotonic() - started, rss, _open_files(pids), directory_bytes(results) / 1e6, searches


def _records(results: Path) -> dict[str, int] | None:
    """Records per file, read strictly (every Pareto and violation line's evaluation found); None: damaged."""
    try:
        return {name: sum(1 for _ in iter_jsonl(results / name, strict=True)) for name in RECORD_FILES}
    except ResultsError as exc:
        print(exc)
        return None


def _report(samples: list[tuple], size_mb: float, searches: int, elapsed: float) -> None:
    first = next((s for s in samples if s[4] > 0), samples[-1])
    rss, files = [s[1] for s in samples], [s[2] for s in samples]
    print(f'RSS MiB: first sample {rss[0]:.0f}, after the first search {first[1]:.0f}, middle '
          f'{rss[len(rss) // 2]:.0f}, last {rss[-1]:.0f}, max {max(rss):.0f}; open files {min(files)} to '
          f'{max(files)}')  # fmt: skip
    later = (samples[-1][3] - first[3]) / max(samples[-1][0] - first[0], 1e-9) * 3600
    hourly = size_mb / elapsed * 3600
    print(f'results: {size_mb:.1f} MB, {searches} searches in {elapsed:.0f} s: {hourly:.0f} MB an hour '
          f'over the run, {later:.0f} from the first finished search on')  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--duration', type=float, default=900.0)
    parser.add_argument('--every', type=float, default=10.0)
    parser.add_argument('--frames', type=int, default=20)
    parser.add_argument('--rate', type=float, default=10.0)
    parser.add_argument('--params', default=str(ROOT / 'config' / 'metavlm.yaml'))
    args = parser.parse_args()
    checks = Checks()
    cli = [sys.executable, '-m', 'metavlm_ros.cli']
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    env = {**os.environ, 'PYTHONPATH': path}
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as tmp:
        bag, results, log = Path(tmp) / 'dive.mcap', Path(tmp) / 'results', Path(tmp) / 'run.log'
        scenes = ['scenes', '--out', str(bag), '--frames', str(args.frames), '--size', '1920x1080']
        subprocess.run([*cli, *scenes], check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        run = ['run', '--params', args.params, '--source', str(bag), '--loop', '--rate', str(args.rate),
               '--duration', str(args.duration), '--results-dir', str(results)]  # fmt: skip
        print('$ metavlm ' + ' '.join(run), flush=True)
        started = time.monotonic()
        with open(log, 'w') as output:
            process = subprocess.Popen([*cli, *run], cwd=ROOT, env=env, stdout=output, stderr=output)
            samples = []
            print(f'{"s":>6} {"RSS MiB":>8} {"files":>6} {"results MB":>11} {"searches":>9}')
            while process.poll() is None:
                time.sleep(args.every)
                sample = _sample(process.pid, started, results)
                if process.poll() is None:
                    samples.append(sample)
                    print('{:6.0f} {:8.0f} {:6d} {:11.1f} {:9d}'.format(*sample), flush=True)
        elapsed = time.monotonic() - started
        tail = ' | '.join(log.read_text(errors='replace').splitlines()[-5:])
        checks.check(process.returncode == 0, f'metavlm run exits 0 (got {process.returncode}): {tail}')
        searches = len(read_jsonl(results / 'summary.jsonl'))
        checks.check(searches > 0, f'{searches} searches finished')
        counts = _records(results)
        checks.check(counts is not None, f'every record reads back whole, strictly: {counts}')
        if samples and searches:
            _report(samples, directory_bytes(results) / 1e6, searches, elapsed)
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
