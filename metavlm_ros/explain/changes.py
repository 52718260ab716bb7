"""Kinds of answer change, declared once per kind of answer: what a follow-up changed, class by class.

- `confidence`: a class's confidence dropped or rose by at least the threshold (Eq. 5, one side).
- `count`: a class lost (its count fell, no other rose), gained (rose, no other fell) or swapped for
  another (one fell while the other rose: the model named one class as another).
- `detection`: an object of a class lost, new, displaced (matched below the IoU threshold) or
  swapped (reclassed), from the record's `boxes` (docs/results.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ['CHANGES', 'Change', 'answer_changes']


@dataclass(frozen=True, order=True)
class Change:
    """One kind of answer change of one class (`to_class`: what it was swapped for)."""

    change: str
    cls: str
    to_class: str | None = None

    @property
    def label(self) -> str:
        """How a person reads it: 'trash dropped', 'trash swapped for object'."""
        return f'{self.cls} {self.change}' + (f' for {self.to_class}' if self.to_class else '')

    def as_record(self) -> dict:
        return {'change': self.change, 'class': self.cls, 'to_class': self.to_class}


def _confidence(record: dict, threshold: float) -> set[Change]:
    source, followup = record.get('source') or {}, record.get('followup') or {}
    found = set()
    for cls, before in source.items():
        after = followup.get(cls)
        if before is None or after is None:
            continue
        # The same tolerance as Eq. 5's |d| >= Th: a difference of exactly Th counts.
        if after - before <= -threshold + 1e-12:
            found.add(Change('dropped', cls))
        elif after - before >= threshold - 1e-12:
            found.add(Change('rose', cls))
    return found


def _count(record: dict, threshold: float) -> set[Change]:
    source, followup = record.get('source') or {}, record.get('followup') or {}
    fell = [c for c in source if followup.get(c) is not None and followup[c] < source[c]]
    rose = [c for c in source if followup.get(c) is not None and followup[c] > source[c]]
    found = {Change('swapped', a, b) for a in fell for b in rose}
    if not rose:
        found |= {Change('lost', c) for c in fell}
    if not fell:
        found |= {Change('gained', c) for c in rose}
    return found


def _detection(record: dict, threshold: float) -> set[Change]:
    boxes = record.get('boxes') or {}
    expected = boxes.get('expected') or []
    found_objects = record.get('followup_detections') or []
    found = {Change('lost', expected[i]['class']) for i in boxes.get('lost') or []}
    found |= {Change('new', found_objects[j]['class']) for j in boxes.get('new') or []}
    found |= {Change('displaced', expected[pair[0]]['class']) for pair in boxes.get('displaced') or []}
    for i, j in boxes.get('reclassed') or []:
        found.add(Change('swapped', expected[i]['class'], found_objects[j]['class']))
    return found


#: Each kind of answer (a record's `kind`), and how its answer changes are read from a record.
CHANGES: dict[str, Callable[[dict, float], set[Change]]] = {
    'confidence': _confidence,
    'count': _count,
    'detection': _detection,
}


def answer_changes(record: dict, threshold: float) -> set[Change]:
    """The answer changes of one evaluation record (`threshold`: for confidences; others ignore it)."""
    reader = CHANGES.get(record.get('kind') or 'confidence')
    return reader(record, threshold) if reader is not None else set()
