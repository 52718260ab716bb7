"""What a criterion kind is declared with: the claim's base, a region of relations, and the file's checker."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from metavlm_ros.assurance.verdict import Verdict
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.relations import RELATION_BY_ID, RELATIONS, Relation

__all__ = ['BASE_KEYS', 'ClaimEvidence', 'Criterion', 'Reader', 'Region', 'SearchNeed']

#: The keys every kind of criterion takes.
BASE_KEYS = frozenset({'id', 'kind', 'claim'})

# Records and criteria files carry float noise: an extra this close to a bound is inside it.
_TOLERANCE = 1e-9


# Extras by the id records and ranges give them ('water_type' -> MR12 water, its extra 0).
_EXTRA_BY_ID: dict[str, tuple[Relation, int]] = {
    extra_id: (relation, k) for relation in RELATIONS for k, extra_id in enumerate(relation.extra_ids)
}
_EXTRA_ORDER = list(_EXTRA_BY_ID)


@dataclass(frozen=True)
class Region:
    """Relations and their parameter intervals: changes made of those relations only, each inside its
    interval (the nominal value, for all but CLAHE, is the relation off).

    `conditions` narrow the relations' extras ('water_type' from II to 5C): an extra not named spans
    what a search gives it (its whole range; a prior, its nominal value: docs/underwater.md).
    """

    bounds: tuple[tuple[str, float, float], ...]
    conditions: tuple[tuple[str, float, float], ...] = ()

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(relation for relation, _, _ in self.bounds)

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Each relation's interval and each named extra's, by id."""
        return {name: (lo, hi) for name, lo, hi in self.bounds + self.conditions}

    def space(self) -> SearchSpace:
        """The search space of this region: its relations enabled, their ranges (and named extras')
        narrowed to it."""
        return SearchSpace.from_options(enabled=list(self.relations), ranges=self.ranges())

    @cached_property
    def _extras(self) -> dict[str, tuple[str, float, float, float]]:
        """Each extra of the region's relations: (its relation, low, high, nominal)."""
        space = self.space()
        return {
            extra_id: (relation.id, space.extra_low[i][k], space.extra_high[i][k], relation.extras[k].nominal)
            for i, relation in enumerate(RELATIONS)
            if space.enabled[i]
            for k, extra_id in enumerate(relation.extra_ids)
        }

    def holds(self, parameters: Mapping[str, float]) -> bool:
        """Whether a composition (its record's `parameters`) lies inside the region: its relations inside
        their intervals, and the extras of those active inside theirs (one a record lacks was nominal)."""
        inside = {relation: (lo, hi) for relation, lo, hi in self.bounds}
        for name, value in parameters.items():
            if name not in RELATION_BY_ID:
                continue  # an extra: checked below, with those the record lacks
            if name not in inside:
                return False
            lo, hi = inside[name]
            if not lo <= value <= hi:
                return False
        for extra_id, (relation, lo, hi, nominal) in self._extras.items():
            if relation in parameters:
                value = parameters.get(extra_id, nominal)
                if not lo - _TOLERANCE <= value <= hi + _TOLERANCE:
                    return False
        return True

    @property
    def waters(self) -> str | None:
        """The region of the relations that say themselves in their own words (MR12: 'Jerlov II to 5C,
        up to 4 m, at the surface'), None when it has none."""
        ranges = self.space_ranges()
        said = [RELATION_BY_ID[r].phrase(ranges) for r in self.relations if RELATION_BY_ID[r].phrase]
        return '; '.join(said) or None

    def space_ranges(self) -> dict[str, tuple[float, float]]:
        """Every range of the region's space by id: its relations' and all their extras'."""
        extras = {extra_id: (lo, hi) for extra_id, (_, lo, hi, _) in self._extras.items()}
        return {**{r: (lo, hi) for r, lo, hi in self.bounds}, **extras}

    def describe(self) -> str:
        """The region in words: each relation's interval, or its own phrase where it has one (MR12),
        then the named extras of the others."""
        ranges = self.space_ranges()
        parts = []
        for r, lo, hi in self.bounds:
            relation = RELATION_BY_ID[r]
            if relation.phrase is not None:
                parts.append(f'{r}: {relation.phrase(ranges)}')
                continue
            parts.append(f'{r} in [{lo:g}, {hi:g}]')
            for extra_id, elo, ehi in self.conditions:
                owner, k = _EXTRA_BY_ID[extra_id]
                if owner.id == r:
                    extra = owner.extras[k]
                    parts.append(f'{extra_id} in [{extra.text(elo)}, {extra.text(ehi)}]')
        return ', '.join(parts)


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
        """A `within`: relation ids and the extras of those relations ('water_type', by name or index),
        each to [low, high]."""
        if not isinstance(value, Mapping) or not value:
            raise self.fail(where, 'must map relation ids to [low, high], e.g. {rotation: [-5, 5]}')
        bounds, conditions = [], []
        for name, interval in value.items():
            here = f'{where}.{name}'
            if name in RELATION_BY_ID:
                spec = RELATION_BY_ID[name]
                self._pair(here, interval)
                lo, hi = (self.number(here, v, spec.low, spec.high, open_low=False) for v in interval)
                if lo > hi:
                    raise self.fail(here, f'low {lo:g} is above high {hi:g}')
                bounds.append((name, lo, hi))
            elif name in _EXTRA_BY_ID:
                conditions.append((name, *self._extra(here, name, interval)))
            else:
                extras = ', '.join(_EXTRA_ORDER)
                raise self.fail(
                    here, f'unknown relation (known: {", ".join(RELATION_BY_ID)}; and their extras: {extras})'
                )
        named = {name for name, _, _ in bounds}
        for name, _, _ in conditions:
            owner = _EXTRA_BY_ID[name][0].id
            if owner not in named:
                raise self.fail(
                    f'{where}.{name}', f'is a condition of {owner}, which the region does not name'
                )
        # In the fixed relation order, so that equal regions compare equal whatever the file's order.
        order = list(RELATION_BY_ID)
        return Region(
            tuple(sorted(bounds, key=lambda b: order.index(b[0]))),
            tuple(sorted(conditions, key=lambda c: _EXTRA_ORDER.index(c[0]))),
        )

    def conditions(self, where: str, value: Any, relation: str) -> tuple[tuple[str, float, float], ...]:
        """An envelope's `within`: the conditions (extras) of its relation only, each to [low, high]."""
        own = RELATION_BY_ID[relation].extra_ids
        if not own:
            raise self.fail(where, f'{relation} has no conditions to name')
        if not isinstance(value, Mapping) or not value:
            raise self.fail(where, f'must map conditions of {relation} ({", ".join(own)}) to [low, high]')
        found = []
        for name, interval in value.items():
            if name not in own:
                raise self.fail(f'{where}.{name}', f'not a condition of {relation} (its: {", ".join(own)})')
            found.append((name, *self._extra(f'{where}.{name}', name, interval)))
        return tuple(sorted(found, key=lambda c: own.index(c[0])))

    def _pair(self, here: str, interval: Any) -> None:
        if not isinstance(interval, (list, tuple)) or len(interval) != 2:
            raise self.fail(here, f'must be [low, high], got {interval!r}')

    def _extra(self, here: str, name: str, interval: Any) -> tuple[float, float]:
        """An extra's interval, each end a number or, where the extra names its values, a name."""
        relation, k = _EXTRA_BY_ID[name]
        extra = relation.extras[k]
        allowed = f'[{extra.text(extra.low)}, {extra.text(extra.high)}]'

        def read(v: Any) -> float:
            try:
                number = extra.read(v)
            except ParameterError as exc:
                raise self.fail(here, str(exc)) from None
            if not extra.low <= number <= extra.high:
                raise self.fail(here, f'must lie in {allowed}, got {v!r}')
            return number

        self._pair(here, interval)
        lo, hi = (read(v) for v in interval)
        if lo > hi:
            raise self.fail(here, f'low {extra.text(lo)} is above high {extra.text(hi)}')
        return lo, hi


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

    def waters(self) -> str | None:
        """The waters the claim is about in words ('Jerlov II to 5C, up to 4 m, at the surface'), where
        it is about MR12 (docs/underwater.md); None otherwise."""
        return None

    def verdict(self, status: str, reason: str, figures: dict, counterexample: dict | None = None) -> Verdict:
        """This criterion judged: `status` for `reason`, on `figures`; a claim about waters says which,
        in the reason and as the figure `waters`."""
        waters = self.waters()
        if waters is not None:
            reason, figures = f'{reason}; in {waters}', {**figures, 'waters': waters}
        return Verdict(self.id, self.kind, status, self.claim, reason, figures, counterexample)
