"""Run a selection of tests again and again, each time in a fresh pytest session, and count failures.

    .venv/bin/python tools/flake_hunt.py --runs 10 [--load] [--out DIR] -- test/ros test/viewer

Each run is a new `python -m pytest -q` process, as `.ci/run` starts one, with a JUnit XML report of
its own under --out. With --load, as many busy processes as there are cores run beside every
other run (the first run without), so that the tests meet the slow machine CI may be. Prints, for
every test that failed or errored at least once, how often, and a last line `N passed, N failed`
over all runs. Exit status: 0 when no test ever failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _busy(stop) -> None:  # pragma: no cover - a load generator
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _outcomes(report: Path) -> dict[str, str]:
    """test id -> passed | failed | skipped, from one JUnit XML report."""
    found = {}
    for case in ET.parse(report).iter('testcase'):
        name = f'{case.get("classname")}::{case.get("name")}'
        if case.find('failure') is not None or case.find('error') is not None:
            found[name] = 'failed'
        elif case.find('skipped') is not None:
            found[name] = 'skipped'
        else:
            found[name] = 'passed'
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=10)
    parser.add_argument('--load', action='store_true', help='busy processes on every core on every other run')
    parser.add_argument('--out', type=Path, default=Path('flake-hunt'))
    parser.add_argument('tests', nargs='*', help='pytest arguments (after --)')
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for run in range(1, args.runs + 1):
        loaded = args.load and run % 2 == 0
        stop = multiprocessing.Event()
        workers = [multiprocessing.Process(target=_busy, args=(stop,)) for _ in range(os.cpu_count() or 1)]
        if loaded:
            for worker in workers:
                worker.start()
        report = args.out / f'run{run:02d}.xml'
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, '-m', 'pytest', '-q', f'--junitxml={report}', *args.tests],
                cwd=ROOT, capture_output=True, text=True,
            )  # fmt: skip
        finally:
            stop.set()
            for worker in workers:
                if worker.is_alive():
                    worker.join()
        (args.out / f'run{run:02d}.log').write_text(done.stdout + done.stderr)
        outcomes = _outcomes(report) if report.is_file() else {}
        for name, outcome in outcomes.items():
            counts[name][outcome] += 1
        failed = sorted(n for n, o in outcomes.items() if o == 'failed')
        print(
            f'run {run}{" (loaded)" if loaded else ""}: exit {done.returncode}, {len(outcomes)} tests, '
            f'{len(failed)} failed, {time.monotonic() - started:.0f} s'
            + (f': {", ".join(failed)}' if failed else ''),
            flush=True,
        )
    flaky = {name: c for name, c in counts.items() if c['failed']}
    for name, c in sorted(flaky.items()):
        print(f'{name}: failed {c["failed"]} of {sum(c.values())}')
    passed = sum(c['passed'] for c in counts.values())
    failed = sum(c['failed'] for c in counts.values())
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
