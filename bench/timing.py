"""What every bench shares: interleaved repetitions, min / median / max, and checks that fail the run."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence


def rotations(names: Sequence[str], repeats: int) -> list[list[str]]:
    """The order of the variants in each repetition: rotated by one each time, so none always runs first."""
    names = list(names)
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(repeats)]


def interleaved(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each variant per repetition; variants alternate within every repetition.

    Load from other processes then hits all variants alike instead of whichever ran during it.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for order in rotations(list(variants), repeats):
        for name in order:
            start = time.perf_counter()
            variants[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, max)."""
    return min(values), statistics.median(values), max(values)


def fmt(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    """'min / median / max' of values times scale."""
    return ' / '.join(f'{v * scale:.{digits}f}' for v in spread(values))


class Checks:
    """Agreement checks: each is printed; any failure makes the bench exit non-zero."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        print(f'  [{"ok" if ok else "FAIL"}] {what}')
        if not ok:
            self.failed.append(what)
        return ok

    def exit_code(self) -> int:
        if self.failed:
            print(f'{len(self.failed)} check(s) failed: ' + '; '.join(self.failed))
            return 1
        return 0


def per_size_main(
    description: str,
    bench_size: Callable[[int, int, int, Checks], None],
    argv: list[str] | None = None,
    banner: str = '',
    threads_help: str = 'OpenCV threads (default 1)',
) -> int:
    """The command line of a bench measured per frame size: --sizes WxH..., --repeats, --threads.

    Sets OpenCV's threads, prints `banner` and the thread count, calls `bench_size(width, height,
    repeats, checks)` for every size and returns the exit code of the checks.
    """
    import cv2

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--sizes', nargs='+', default=['1920x1080', '448x252'], metavar='WxH')
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--threads', type=int, default=1, help=threads_help)
    args = parser.parse_args(argv)
    cv2.setNumThreads(args.threads)
    print(f'{banner}{"; " if banner else ""}OpenCV threads {cv2.getNumThreads()}')
    checks = Checks()
    for size in args.sizes:
        width, height = (int(v) for v in size.lower().split('x'))
        bench_size(width, height, args.repeats, checks)
    return checks.exit_code()
