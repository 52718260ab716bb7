"""The failure-mode catalogue: a shallow tree per answer change, its high-rate leaves read as rules."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metavlm_ros.assurance.kinds import render_command
from metavlm_ros.explain.changes import Change, answer_changes
from metavlm_ros.explain.features import Feature, FeatureTable

__all__ = [
    'DEFAULT_THRESHOLD',
    'Catalogue',
    'CatalogueSettings',
    'Condition',
    'FailureMode',
    'build_catalogue',
]


#: The confidence threshold when none is set: the paper's largest (Eq. 5), the tester's default.
DEFAULT_THRESHOLD = 0.05


@dataclass(frozen=True)
class CatalogueSettings:
    """How the catalogue is learnt and which modes it keeps (docs/explain.md says why each value).

    Attributes:
        threshold: The confidence threshold of an answer change (Eq. 5's Th; None: DEFAULT_THRESHOLD,
            or for `catalogue_of` the largest the records were judged at); counts and detections
            ignore it.
        max_modes: Modes kept, best first.
        depth: The trees' depth: at most this many conditions a rule.
        min_violations: The fewest violations a mode (and a leaf) holds.
        min_lift: How many times more frequent inside the rule than outside a mode's change must be.
        keep_share: A condition is dropped from a rule when the rule without it keeps at least this
            share of its violation rate inside (a shorter, wider rule that says the same).
        overlap: A mode is left out when more than this share of its violations lie inside a
            better mode of the same answer change (the same failure seen through another leaf).
        seed: The trees' random_state (ties between equally good splits).
    """

    threshold: float | None = None
    max_modes: int = 8
    depth: int = 3
    min_violations: int = 5
    min_lift: float = 3.0
    keep_share: float = 0.95
    overlap: float = 0.5
    seed: int = 0


@dataclass(frozen=True)
class Condition:
    """One side of one split: `feature` above (or at most) `threshold`, in the feature's own terms."""

    feature: Feature
    above: bool
    threshold: float

    def holds(self, column: np.ndarray) -> np.ndarray:
        """Which rows meet it (a missing value, NaN, meets no condition)."""
        with np.errstate(invalid='ignore'):
            return column > self.threshold if self.above else column <= self.threshold

    @property
    def value(self) -> float:
        """The threshold as the parameter's value (nominal + deviation) for a relation, else itself."""
        return self.feature.nominal + self.threshold if self.feature.kind == 'relation' else self.threshold

    @property
    def sign(self) -> str:
        """'+' or '-' when the condition holds only on that side of nominal (a relation's direction)."""
        if self.feature.kind != 'relation':
            return ''
        if self.above and self.threshold >= 0:
            return '+'
        if not self.above and self.threshold < 0:
            return '-'
        return ''

    def describe(self) -> str:
        f = self.feature
        unit = f' {f.unit}' if f.unit else ''
        if f.kind == 'order':
            return (
                f'order >= {math.floor(self.threshold) + 1}'
                if self.above
                else f'order <= {math.floor(self.threshold)}'
            )
        if f.kind == 'active':
            return f.label if self.above else f.label.replace(' on', ' off')
        text = f'{f.label} {"above" if self.above else "at most"} {self.value:.4g}{unit}'
        # A relation that is off sits at its nominal value: say when the condition takes it in.
        holds_off = (0.0 > self.threshold) if self.above else (0.0 <= self.threshold)
        return text + (' (or off)' if f.kind == 'relation' and holds_off else '')

    def as_record(self) -> dict:
        return {
            **self.feature.as_record(),
            'direction': 'above' if self.above else 'at_most',
            'threshold': self.threshold,
            'value': self.value,
            'sign': self.sign,
            'text': self.describe(),
        }


@dataclass(frozen=True)
class FailureMode:
    """A rule and the answer change it brings, with its rates inside and outside and its support."""

    change: Change
    conditions: tuple[Condition, ...]
    violations_inside: int
    evaluations_inside: int
    violations_outside: int
    evaluations_outside: int
    frames: int
    searches: int
    example: dict | None

    @property
    def rate_inside(self) -> float:
        return self.violations_inside / self.evaluations_inside

    @property
    def rate_outside(self) -> float:
        return self.violations_outside / self.evaluations_outside if self.evaluations_outside else 0.0

    @property
    def lift(self) -> float:
        return self.rate_inside / self.rate_outside if self.rate_outside else math.inf

    @property
    def score(self) -> float:
        """The ranking: the violations the rule explains, weighed by how much likelier it makes them."""
        return self.violations_inside * (self.rate_inside - self.rate_outside)

    @property
    def rule(self) -> str:
        return ' and '.join(c.describe() for c in self.conditions) + f': {self.change.label}'

    def inside(self, table: FeatureTable) -> np.ndarray:
        """Which of `table`'s evaluations lie inside the rule (whatever their answer)."""
        mask = np.ones(len(table.records), dtype=bool)
        for c in self.conditions:
            mask &= c.holds(table.column(c.feature.name))
        return mask

    def as_record(self, rank: int) -> dict:
        return {
            'rank': rank,
            'rule': self.rule,
            **self.change.as_record(),
            'label': self.change.label,
            'conditions': [c.as_record() for c in self.conditions],
            'relations': sorted({c.feature.relation for c in self.conditions if c.feature.relation}),
            'violations_inside': self.violations_inside,
            'evaluations_inside': self.evaluations_inside,
            'rate_inside': self.rate_inside,
            'violations_outside': self.violations_outside,
            'evaluations_outside': self.evaluations_outside,
            'rate_outside': self.rate_outside,
            'lift': None if math.isinf(self.lift) else self.lift,
            'frames': self.frames,
            'searches': self.searches,
            'example': self.example,
        }


@dataclass
class Catalogue:
    """The modes kept, best first, and what the catalogue was learnt from."""

    modes: list[FailureMode]
    settings: CatalogueSettings
    evaluations: int
    violations: dict[str, int]
    notes: list[str] = field(default_factory=list)


def _changes(table: FeatureTable, threshold: float) -> dict[Change, np.ndarray]:
    found: dict[Change, list[int]] = {}
    for row, (_, record) in enumerate(table.records):
        for change in answer_changes(record, threshold):
            found.setdefault(change, []).append(row)
    targets = {}
    for change in sorted(found):
        target = np.zeros(len(table.records), dtype=bool)
        target[found[change]] = True
        targets[change] = target
    return targets


def _leaf_paths(tree, features: Sequence[Feature]) -> list[list[Condition]]:
    """Every leaf of a fitted tree as the conditions on its path from the root."""
    t = tree.tree_
    paths: list[list[Condition]] = []

    def walk(node: int, path: list[Condition]) -> None:
        if t.children_left[node] == t.children_right[node]:
            paths.append(path)
            return
        feature, threshold = features[t.feature[node]], float(t.threshold[node])
        walk(t.children_left[node], [*path, Condition(feature, False, threshold)])
        walk(t.children_right[node], [*path, Condition(feature, True, threshold)])

    walk(0, [])
    return paths


def _tightest(conditions: Sequence[Condition]) -> tuple[Condition, ...]:
    """One condition per feature and side: the tightest the path holds."""
    kept: dict[tuple[str, bool], Condition] = {}
    for c in conditions:
        old = kept.get((c.feature.name, c.above))
        if old is None or (c.threshold > old.threshold if c.above else c.threshold < old.threshold):
            kept[(c.feature.name, c.above)] = c
    return tuple(sorted(kept.values(), key=lambda c: (c.feature.name, not c.above)))


class _Rules:
    """Evaluates rules over the table for one answer change."""

    def __init__(self, table: FeatureTable, target: np.ndarray) -> None:
        self.table, self.target = table, target
        self._columns = {f.name: table.values[:, k] for k, f in enumerate(table.features)}

    def inside(self, conditions: Sequence[Condition]) -> np.ndarray:
        mask = np.ones(len(self.target), dtype=bool)
        for c in conditions:
            mask &= c.holds(self._columns[c.feature.name])
        return mask

    def rate(self, conditions: Sequence[Condition]) -> float:
        mask = self.inside(conditions)
        return float(self.target[mask].mean()) if mask.any() else 0.0

    def simplified(self, conditions: tuple[Condition, ...], keep_share: float) -> tuple[Condition, ...]:
        """Drop, one at a time, the condition whose removal loses least, while the rate stays."""
        while len(conditions) > 1:
            rate = self.rate(conditions)
            options = [(self.rate(conditions[:k] + conditions[k + 1 :]), k) for k in range(len(conditions))]
            best_rate, k = max(options, key=lambda o: (o[0], -o[1]))
            if best_rate < keep_share * rate:
                break
            conditions = conditions[:k] + conditions[k + 1 :]
        return conditions

    def mode(self, change: Change, conditions: tuple[Condition, ...]) -> FailureMode:
        inside = self.inside(conditions)
        hit = inside & self.target
        rows = np.flatnonzero(hit)
        example = None
        if len(rows):
            # The smallest change inside the rule that brings the answer change: the one to look at.
            def order(row: int) -> tuple:
                record = self.table.records[row][1]
                return (record['f_trans'], str(self.table.records[row][0]), record['image'], record['index'])

            directory, record = self.table.records[min(rows, key=order)]
            example = _example(directory, record)
        images = {self.table.records[row][1].get('image') for row in rows}
        return FailureMode(
            change=change,
            conditions=conditions,
            violations_inside=int(hit.sum()),
            evaluations_inside=int(inside.sum()),
            violations_outside=int((self.target & ~inside).sum()),
            evaluations_outside=int((~inside).sum()),
            frames=len(images),
            searches=len(set(self.table.searches[rows].tolist())),
            example=example,
        )


def _example(directory: Path, record: dict) -> dict:
    return {
        'directory': str(directory),
        **{k: record.get(k) for k in ('image', 'index', 'algorithm', 'seed', 'composition', 'parameters')},
        **{k: record.get(k) for k in ('f_trans', 'f_pred', 'source', 'followup')},
        'render': render_command(directory, record),
    }


def build_catalogue(table: FeatureTable, settings: CatalogueSettings | None = None) -> Catalogue:
    """Learn the failure modes of the evaluations in `table` (docs/explain.md).

    For each kind of answer change with at least `min_violations` violations, a decision tree of
    depth `depth` (class-balanced, seeded) separates the evaluations with that change from every
    other; each leaf is read as the conditions on its path, kept to the tightest per feature and
    shortened while the rate inside holds; a rule that holds `min_violations` and is `min_lift` times
    likelier inside than outside is a mode. Modes rank by `FailureMode.score`.
    """
    from sklearn.tree import DecisionTreeClassifier

    settings = settings or CatalogueSettings()
    if settings.threshold is None:
        settings = dataclasses.replace(settings, threshold=DEFAULT_THRESHOLD)
    targets = _changes(table, settings.threshold)
    found: dict[tuple, tuple[FailureMode, frozenset[int]]] = {}
    for change, target in targets.items():
        if target.sum() < settings.min_violations or target.all():
            continue
        tree = DecisionTreeClassifier(
            max_depth=settings.depth,
            min_samples_leaf=settings.min_violations,
            class_weight='balanced',
            random_state=settings.seed,
        ).fit(table.values, target)
        rules = _Rules(table, target)
        for path in _leaf_paths(tree, table.features):
            if not path:
                continue
            conditions = rules.simplified(_tightest(path), settings.keep_share)
            key = (change, conditions)
            if key in found:
                continue
            mode = rules.mode(change, conditions)
            if mode.violations_inside >= settings.min_violations and mode.lift >= settings.min_lift:
                found[key] = (mode, frozenset(np.flatnonzero(rules.inside(conditions) & target).tolist()))
    kept: list[tuple[FailureMode, frozenset[int]]] = []
    for mode, hits in sorted(found.values(), key=lambda m: (-m[0].score, m[0].rule)):
        # Leaves of one tree, and rules shortened alike, often describe the same violations from
        # slightly different sides: a mode whose violations a better one of its change mostly
        # explains already says nothing new.
        if not any(m.change == mode.change and len(hits & h) > settings.overlap * len(hits) for m, h in kept):
            kept.append((mode, hits))
    return Catalogue(
        modes=[mode for mode, _ in kept[: settings.max_modes]],
        settings=settings,
        evaluations=len(table.records),
        violations={change.label: int(target.sum()) for change, target in targets.items()},
        notes=list(table.notes),
    )
