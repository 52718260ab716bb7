"""Judging acceptance criteria on evidence: each criterion's evidence gathered, then its verdict."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import Evidence, FrameBrackets, merged_boundaries, settings_space
from metavlm_ros.assurance.stats import envelope_bounds
from metavlm_ros.assurance.verdict import Verdict
from metavlm_ros.common.errors import InputError
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = ['Tally', 'envelope_table', 'judge']


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


def envelope_table(
    evidence: Evidence, key: str, confidence: float = 0.95, cls: str | None = None
) -> list[dict]:
    """Per direction the evidence covers: frames, censored, the median and the 5 % quantile of the
    boundary over frames with their bounds (`envelope_bounds`, the verdict's), the smallest break (the
    report's table)."""
    by_direction: dict[str, list] = {}
    for (_, direction), bracket in sorted(merged_boundaries(evidence, key, cls).items()):
        by_direction.setdefault(direction, []).append(bracket)
    table = []
    for direction, brackets in by_direction.items():
        row = {'direction': direction, 'frames': len(brackets), 'censored': sum(b.censored for b in brackets)}
        for name, q in (('median', 0.5), ('q05', 0.05)):
            bounds = envelope_bounds(brackets, q, confidence)
            row[f'{name}_lower'], row[f'{name}_upper'] = bounds.lower, bounds.upper
        row['min_violating'] = min((b.violating for b in brackets if not b.censored), default=None)
        table.append(row)
    order = list(RELATION_BY_ID)
    return sorted(table, key=lambda row: (order.index(row['direction'][:-1]), row['direction'][-1] == '+'))
