"""What a criterion kind is declared with: the claim's base, a region of relations, and the file's checker."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from metavlm_ros.assurance.verdict import Verdict
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = ['ClaimEvidence', 'Criterion', 'Reader', 'Region', 'SearchNeed']


@dataclass(frozen=True)
class Region:
    """Relations and their parameter intervals: changes made of those relations only, each inside its
    interval (the nominal value, for all but CLAHE, is the relation off)."""

    bounds: tuple[tuple[str, float, float], ...]

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(relation for relation, _, _ in self.bounds)

    def space(self) -> SearchSpace:
        """The search space of this region: its relations enabled, their ranges narrowed to it."""
        return SearchSpace.from_options(
            enabled=list(self.relations), ranges={r: (lo, hi) for r, lo, hi in self.bounds}
        )

    def holds(self, parameters: Mapping[str, float]) -> bool:
        """Whether a composition (its record's `parameters`) lies inside the region."""
        inside = {relation: (lo, hi) for relation, lo, hi in self.bounds}
        for name, value in parameters.items():
            if name not in RELATION_BY_ID:
                continue  # an extra (motion_blur_angle): its relation's bounds decide
            if name not in inside:
                return False
            lo, hi = inside[name]
            if not lo <= value <= hi:
                return False
        return True

    def describe(self) -> str:
        return ', '.join(f'{r} in [{lo:g}, {hi:g}]' for r, lo, hi in self.bounds)


class Reader:
    """Checks one criteria file's values, naming the key of the first bad one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, why: str) -> ParameterError:
        return ParameterError(f'{self.path}: {where}: {why}')

    def required(self, where: str, item: Mapping, key: str) -> Any:
        if key not in item or item[key] is None:
            raise self.fail(f'{where}.{key}', 'missing')
        return item[key]

    def number(self, where: str, value: Any, low: float, high: float, *, open_low: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(where, f'must be a number, got {value!r}')
        below = value <= low if open_low else value < low
        if below or value > high:
            side = '(' if open_low else '['
            raise self.fail(where, f'must lie in {side}{low:g}, {high:g}], got {value!r}')
        return float(value)

    def confidence(self, where: str, item: Mapping, default: float) -> float:
        """A criterion's own `confidence`, or the file's."""
        if 'confidence' not in item:
            return default
        value = self.number(f'{where}.confidence', item['confidence'], 0, 1)
        if value >= 1:
            raise self.fail(f'{where}.confidence', 'must lie in (0, 1)')
        return value

    def region(self, where: str, value: Any) -> Region:
        if not isinstance(value, Mapping) or not value:
            raise self.fail(where, 'must map relation ids to [low, high], e.g. {rotation: [-5, 5]}')
        bounds = []
        for relation, interval in value.items():
            here = f'{where}.{relation}'
            if relation not in RELATION_BY_ID:
                raise self.fail(here, f'unknown relation (known: {", ".join(RELATION_BY_ID)})')
            if not isinstance(interval, (list, tuple)) or len(interval) != 2:
                raise self.fail(here, f'must be [low, high], got {interval!r}')
            spec = RELATION_BY_ID[relation]
            lo, hi = (self.number(here, v, spec.low, spec.high, open_low=False) for v in interval)
            if lo > hi:
                raise self.fail(here, f'low {lo:g} is above high {hi:g}')
            bounds.append((relation, lo, hi))
        # In the fixed relation order, so that equal regions compare equal whatever the file's order.
        order = list(RELATION_BY_ID)
        return Region(tuple(sorted(bounds, key=lambda b: order.index(b[0]))))


@dataclass(frozen=True)
class SearchNeed:
    """A search a kind of claim needs: its directory under the evidence folder, algorithm, space and
    budget a frame, and the criteria it serves."""

    name: str
    algorithm: str
    space: SearchSpace
    budget: int
    why: str


class ClaimEvidence:
    """A claim's evidence, gathered record by record (`take`), judged on what it holds (`verdict`).

    `tally` is the gathering `Tally` (assurance/judge.py): every frame seen and the frames' brackets.
    """

    def take(self, directory: Path, settings: dict, record: dict, violated: bool, key: str) -> None:
        """Take one judged evaluation record of a results directory whose search settings are `settings`:
        `violated` at the criteria's violation key `key`."""

    def verdict(self, tally: Any) -> Verdict:
        raise NotImplementedError


@dataclass(frozen=True)
class Criterion:
    """One claim of a criteria file. A kind of claim is a subclass that declares, once, its `kind`, the
    `keys` a file may give it, how they are read, its claim in words, the searches it needs and its
    evidence (assurance/kinds.py)."""

    id: str
    claim: str
    kind: ClassVar[str]
    keys: ClassVar[frozenset[str]]

    @classmethod
    def read(cls, reader: Reader, where: str, item: Mapping, cid: str, confidence: float) -> Criterion:
        """The criterion the file's `item` states (claim '' when it gives none); the reader's errors
        name `where`."""
        raise NotImplementedError

    def default_claim(self) -> str:
        """The claim in words, when the file gives none."""
        raise NotImplementedError

    @classmethod
    def searches(
        cls, criteria: Sequence[Criterion], *, evaluations: int, envelope_rounds: int
    ) -> list[SearchNeed]:
        """The searches the criteria of this kind need (`evaluations`: the NSGA-II budget a frame)."""
        raise NotImplementedError

    def evidence(self) -> ClaimEvidence:
        """An empty gathering of this criterion's evidence."""
        raise NotImplementedError

    def verdict(self, status: str, reason: str, figures: dict, counterexample: dict | None = None) -> Verdict:
        """This criterion judged: `status` for `reason`, on `figures`."""
        return Verdict(self.id, self.kind, status, self.claim, reason, figures, counterexample)
