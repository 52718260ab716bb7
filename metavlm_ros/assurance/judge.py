"""Judging acceptance criteria on evidence: each criterion's evidence gathered, then its verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.envelope_claim import CONDITIONED, describe_condition, record_condition
from metavlm_ros.assurance.evidence import Evidence, FrameBrackets, Run, merged_boundaries, settings_space
from metavlm_ros.assurance.stats import envelope_bounds
from metavlm_ros.assurance.verdict import Verdict
from metavlm_ros.common.errors import InputError
from metavlm_ros.method.envelope import Bracket, boundaries
from metavlm_ros.method.relations import RELATION_BY_ID, RELATIONS

__all__ = ['Condition', 'Tally', 'condition_boundaries', 'envelope_table', 'judge', 'row_label']


def judge(criteria: Criteria, evidence: Evidence) -> list[Verdict]:
    """One verdict per criterion, in the file's order."""
    tally = Tally(criteria, str(evidence.root))
    for run in evidence.runs:
        tally.add(run.directory, run.settings, run.records)
    return tally.verdicts()


class Tally:
    """The criteria's evidence gathered as it comes (a results directory's records, or the tester's
    searches one by one), keeping only what the verdicts need; `verdicts()` judges what it holds.

    Args:
        criteria: The criteria.
        where: What the evidence is, for messages.

    Attributes:
        key: The violation key, once a record says the model's kind.
        frames: Every frame seen.
        brackets: Each (frame, direction)'s boundary bracket at `key`.
    """

    def __init__(self, criteria: Criteria, where: str) -> None:
        self.criteria = criteria
        self.where = where
        self.key: str | None = None
        self.frames: set[str] = set()
        self.brackets = FrameBrackets()
        self._evidence = {c.id: c.evidence() for c in criteria.criteria}

    def add(self, directory: Path, settings: dict, records: list[dict]) -> None:
        """Take a batch of evaluation records of one results directory (whose search settings are
        `settings`): a whole directory, or one search.

        Raises:
            InputError: The records are of another kind of model than earlier ones, or were not judged
                at the criteria's threshold.
        """
        for record in records:
            self._take(directory, settings, record)
        if records and self.key is not None:
            self.brackets.add(records, self.key, settings_space(settings))

    def _take(self, directory: Path, settings: dict, record: dict) -> None:
        self.frames.add(record['image'])
        key = self.criteria.key(record.get('kind') or 'confidence')
        if self.key is None:
            self.key = key
        elif key != self.key:
            raise InputError(
                f'{self.where}: records of count and confidence models together; judge one model'
            )
        if record.get('failed'):
            return
        if key not in (record.get('violation') or {}):
            have = ', '.join(sorted(record.get('violation') or {})) or 'none'
            raise InputError(
                f'{directory}: records judged at thresholds {have}, not at the criteria threshold '
                f'{self.criteria.threshold:g} ({self.criteria.path}); search again with --thresholds '
                'including it'
            )
        violated = bool(record['violation'][key])
        for evidence in self._evidence.values():
            evidence.take(directory, settings, record, violated, key)

    def verdicts(self) -> list[Verdict]:
        """One verdict per criterion, in the file's order, on the evidence taken so far."""
        return [self._evidence[c.id].verdict(self) for c in self.criteria.criteria]


@dataclass(frozen=True, order=True)
class Condition:
    """Where evaluations of a relation measured at conditions (MR12) were made: each extra's range, by id in
    the relation's order; a point where a search held them, the region searched where it varied them."""

    relation: str
    ranges: tuple[tuple[str, float, float], ...]

    @property
    def text(self) -> str:
        """In words, as an envelope claim's `median_boundary_by_condition` names it ('Jerlov II, at the
        surface')."""
        return describe_condition(self.relation, {name: (lo, hi) for name, lo, hi in self.ranges})

    def as_record(self) -> dict[str, list[float]]:
        """The ranges as `within` writes them: {extra id: [low, high]}."""
        return {name: [lo, hi] for name, lo, hi in self.ranges}


def row_label(direction: str, condition: Condition | None) -> str:
    """An envelope table row's label: the direction, and the condition where it has one
    ('water+ (Jerlov II, at the surface)')."""
    return direction if condition is None else f'{direction} ({condition.text})'


def _run_conditions(run: Run, relation: str) -> dict[Condition, list[dict]]:
    """A results directory's evaluations of `relation` alone by condition (`record_condition`, as the
    claims take them): one per condition the search held; a search that varied them (uniform samples of
    a region, NSGA-II) made one region's, each extra it varied over the range it searched."""
    at: dict[tuple[float, ...], list[dict]] = {}
    for record in run.records:
        point = record_condition(record, relation)
        if point is not None:
            # Float noise is no other water (envelope claims match conditions to 1e-9 as well).
            at.setdefault(tuple(round(v, 9) for v in point), []).append(record)
    if len(at) <= 1:
        return {Condition(relation, _ranges(relation, p, p)): records for p, records in at.items()}
    # One evaluation a frame per condition brackets nothing: the region's evaluations bracket together.
    i = RELATIONS.index(RELATION_BY_ID[relation])
    varied = [len({p[k] for p in at}) > 1 for k in range(len(next(iter(at))))]
    first = next(iter(at))
    low = [run.space.extra_low[i][k] if v else first[k] for k, v in enumerate(varied)]
    high = [run.space.extra_high[i][k] if v else first[k] for k, v in enumerate(varied)]
    return {Condition(relation, _ranges(relation, low, high)): [r for found in at.values() for r in found]}


def _ranges(
    relation: str, low: Sequence[float], high: Sequence[float]
) -> tuple[tuple[str, float, float], ...]:
    ids = RELATION_BY_ID[relation].extra_ids
    return tuple((name, float(lo), float(hi)) for name, lo, hi in zip(ids, low, high, strict=True))


def condition_boundaries(
    evidence: Evidence, key: str, cls: str | None = None
) -> dict[tuple[str, str, Condition | None], Bracket]:
    """(frame, direction, condition) -> the bracket all the evidence gives together: `merged_boundaries`'
    (condition None), but a relation measured at conditions (MR12) bracketed per condition (`Condition`):
    2 m of water in Jerlov 9C and 10 m in Jerlov I are no one boundary."""
    found: dict[tuple[str, str, Condition | None], Bracket] = {
        (image, direction, None): bracket
        for (image, direction), bracket in merged_boundaries(evidence, key, cls).items()
        if direction[:-1] not in CONDITIONED
    }
    seen: dict[tuple[str, str, Condition | None], list[Bracket]] = {}
    for run in evidence.runs:
        for relation in sorted(CONDITIONED):
            for condition, records in _run_conditions(run, relation).items():
                for b in boundaries(records, key, run.space, cls):
                    bracket = Bracket(b.clean, b.violating)
                    seen.setdefault((b.image, b.direction, condition), []).append(bracket)
    found.update({where: Bracket.merge(brackets) for where, brackets in seen.items()})
    return found


def envelope_table(
    evidence: Evidence, key: str, confidence: float = 0.95, cls: str | None = None
) -> list[dict]:
    """Per direction the evidence covers (and per condition, for a relation measured at conditions:
    `condition_boundaries`): frames, censored, the median and the 5 % quantile of the boundary over
    frames with their bounds (`envelope_bounds`, the verdict's), the smallest break (the report's table).
    Each row's `row` labels it; `condition` and `within` say the condition in words and as ranges."""
    by_row: dict[tuple[str, Condition | None], list[Bracket]] = {}
    for (_, direction, condition), bracket in condition_boundaries(evidence, key, cls).items():
        by_row.setdefault((direction, condition), []).append(bracket)
    order = list(RELATION_BY_ID)

    def place(row: tuple[str, Condition | None]) -> tuple:
        direction, condition = row
        return (
            order.index(direction[:-1]),
            direction[-1] == '+',
            () if condition is None else condition.ranges,
        )

    table = []
    for (direction, condition), brackets in sorted(by_row.items(), key=lambda item: place(item[0])):
        row = {
            'row': row_label(direction, condition),
            'direction': direction,
            'condition': None if condition is None else condition.text,
            'within': None if condition is None else condition.as_record(),
            'frames': len(brackets),
            'censored': sum(b.censored for b in brackets),
        }
        for name, q in (('median', 0.5), ('q05', 0.05)):
            bounds = envelope_bounds(brackets, q, confidence)
            row[f'{name}_lower'], row[f'{name}_upper'] = bounds.lower, bounds.upper
        row['min_violating'] = min((b.violating for b in brackets if not b.censored), default=None)
        table.append(row)
    return table
