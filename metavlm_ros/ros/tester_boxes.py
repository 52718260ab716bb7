"""The tester's box figures on /diagnostics: running totals of how its detection searches' boxes changed."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from metavlm_ros.method.records import Evaluation
from metavlm_ros.ros.tester_settings import NODE_NAME

__all__ = ['BOXES_STATUS', 'CHANGES', 'IOU_BINS', 'BoxTally']

#: The name of the status that carries the box figures.
BOXES_STATUS = 'metavlm_tester: boxes'
#: What can happen to an object between source and follow-up (docs/method.md §13), as the records'
#: `boxes` name it. A reclassed object is also one lost and one new: the oracle counts it so.
CHANGES = ('lost', 'new', 'reclassed', 'displaced')
#: Bins of the matched pairs' IoU histogram over [0, 1] (one more for IoU 1 exactly): quantiles within
#: half a bin (0.0005) in 8 KiB, however long the dive.
IOU_BINS = 1000


class BoxTally:
    """Running box figures of the judged detection evaluations: objects expected and matched, each
    change counted by object and by class, the share of evaluations that had one, and the IoU of the
    matched pairs as a fixed histogram (its median and 10th percentile): memory stays bounded.

    Figures are at one IoU threshold: a search at another starts them afresh. Thread-safe: the search
    worker adds, the diagnostics timer reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clear(None)

    def _clear(self, iou_threshold: float | None) -> None:
        self.iou_threshold = iou_threshold
        self.evaluations = 0  # judged detection evaluations: not failed, not the identity
        self.violating = 0  # those with a box violation (lost, new, reclassed or displaced objects)
        self.expected = 0  # objects expected in the follow-ups (the required expected boxes)
        self.matched = 0  # pairs matched, displaced ones included
        self.objects: dict[str, Counter[str]] = {change: Counter() for change in CHANGES}  # by class
        self.with_change = dict.fromkeys(CHANGES, 0)  # evaluations with at least one such object
        self.iou_histogram = np.zeros(IOU_BINS + 1, np.int64)

    def add(self, evaluations: Iterable[Evaluation], iou_threshold: float) -> int:
        """Count the detection evaluations among `evaluations` (others, failed ones and the identity
        carry no `boxes`: left out) judged at `iou_threshold`; returns how many were counted."""
        counted = 0
        with self._lock:
            for ev in evaluations:
                if ev.boxes is None or ev.followup is None:
                    continue
                if iou_threshold != self.iou_threshold:
                    self._clear(iou_threshold)
                boxes, found = ev.boxes, ev.followup.detections
                expected = boxes['expected']
                classes = {
                    'lost': [expected[i]['class'] for i in boxes['lost']],
                    'new': [found[j].cls for j in boxes['new']],
                    'reclassed': [expected[i]['class'] for i, _ in boxes['reclassed']],
                    'displaced': [expected[i]['class'] for i, _, _ in boxes['displaced']],
                }
                self.evaluations += 1
                self.violating += any(ev.violation.values())
                self.expected += sum(bool(e['required']) for e in expected)
                self.matched += len(boxes['matched'])
                for change, names in classes.items():
                    self.objects[change].update(names)
                    self.with_change[change] += bool(names)
                ious = np.array([iou for _, _, iou in boxes['matched']], float)
                bins = np.clip((ious * IOU_BINS).astype(np.int64), 0, IOU_BINS)
                np.add.at(self.iou_histogram, bins, 1)
                counted += 1
        return counted

    def iou_quantile(self, q: float) -> float:
        """The `q` quantile of the matched pairs' IoU: the least IoU that a share `q` of them do not
        exceed, to within half a bin; nan before any pair."""
        with self._lock:
            cumulative = np.cumsum(self.iou_histogram)
        if not cumulative[-1]:
            return math.nan
        rank = max(1, math.ceil(q * int(cumulative[-1])))
        k = int(np.searchsorted(cumulative, rank))
        return min(1.0, (k + 0.5) / IOU_BINS)

    def figures(self) -> dict[str, float | int]:
        """The figures /diagnostics shows, by key (docs/ros.md, "Boxes on /diagnostics")."""
        p50, p10 = self.iou_quantile(0.5), self.iou_quantile(0.1)
        with self._lock:
            n = self.evaluations
            out: dict[str, float | int] = {
                'evaluations_judged': n,
                'evaluations_violating': self.violating,
                'violation_rate': self.violating / n if n else math.nan,
                'objects_expected': self.expected,
                'objects_matched': self.matched,
            }
            out.update({change: sum(self.objects[change].values()) for change in CHANGES})
            out.update({f'{c}_rate': self.with_change[c] / n if n else math.nan for c in CHANGES})
            out.update(
                matched_iou_p50=p50,
                matched_iou_p10=p10,
                iou_threshold=math.nan if self.iou_threshold is None else self.iou_threshold,
            )
            for change in CHANGES:
                out.update({f'{change}/{cls}': k for cls, k in sorted(self.objects[change].items())})
        return out

    def statuses(self) -> list[DiagnosticStatus]:
        """The boxes status (none before a detection evaluation was judged): WARN once a box violation
        was seen, OK otherwise; the figures as values."""
        figures = self.figures()
        n, violating = figures['evaluations_judged'], figures['evaluations_violating']
        if not n:
            return []
        if violating:
            changes = ', '.join(f'{c} {figures[c]}' for c in CHANGES)
            level, message = DiagnosticStatus.WARN, f'{violating} of {n} evaluations changed boxes: {changes}'
        else:
            level, message = DiagnosticStatus.OK, f'no box changed ({n} evaluations judged)'
        return [
            DiagnosticStatus(
                level=level,
                name=BOXES_STATUS,
                message=message,
                hardware_id=NODE_NAME,
                values=[KeyValue(key=k, value=_text(v)) for k, v in figures.items()],
            )
        ]


def _text(value: object) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.6g}'
    return str(value)
