"""What every bench shares: interleaved repetitions, min / median / max, and checks that fail the run."""

from __future__ import annotations

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
