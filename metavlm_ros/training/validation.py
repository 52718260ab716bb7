"""How a model under hardening is judged on frames it is not trained on: violation rate of planned
follow-ups, drift of its clean answers from the base model's, and accuracy against the ground truth
(presence AUC for confidences and counts, F1 at IoU 0.5 for boxes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metavlm_ros.method.answers import Thresholds, answer_for
from metavlm_ros.method.boxes import Detection, source_accuracy
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.relations import apply_composition

__all__ = [
    'MIN_AUC_FRAMES',
    'Figures',
    'FrameTruth',
    'ValidationSet',
    'clean_accuracy',
    'presence_auc',
]

#: A class enters the presence AUC only with at least this many frames that show it and as many that do
#: not: an AUC over one or two frames a side says which frames happened to be drawn, not how the model
#: ranks (2 frames with and 2 without give only the values 0, 0.25, ..., 1).
MIN_AUC_FRAMES = 5


@dataclass(frozen=True)
class FrameTruth:
    """What a frame truly shows, at the size the model is asked at: which classes, and their boxes."""

    present: tuple[bool, ...]
    boxes: tuple[Detection, ...] = ()


def presence_auc(scores: np.ndarray, present: np.ndarray, least: int = MIN_AUC_FRAMES) -> float | None:
    """Mean ROC AUC over the classes of per-class scores against presence; a class shown on fewer than
    `least` frames or missing from fewer is left out (None when no class is left)."""
    from sklearn.metrics import roc_auc_score

    values = [
        float(roc_auc_score(present[:, c], scores[:, c]))
        for c in range(present.shape[1])
        if least <= present[:, c].sum() <= len(present) - least
    ]
    return float(np.mean(values)) if values else None


def clean_accuracy(
    answers: Sequence[Prediction],
    truths: Sequence[FrameTruth | None],
    classes: Sequence[str],
    frames: Sequence[np.ndarray],
) -> tuple[str, float | None]:
    """How right the answers are on clean frames, in the measure of their kind: boxes, F1 of precision
    and recall at IoU 0.5 pooled over the frames (the oracle's class-by-class matching,
    `source_accuracy`, boxes in the pixels of `frames`, the frames answered); confidences and counts,
    the presence AUC (`presence_auc`). None: a frame without ground truth, or too few frames for the
    measure.

    Returns:
        (the measure's name, its value).
    """
    detections = bool(answers) and answers[0].kind == 'detection'
    measure = 'detection F1 at IoU 0.5' if detections else 'presence AUC'
    if not answers or any(t is None for t in truths):
        return measure, None
    if detections:
        hits = found = there = 0
        for answer, truth, frame in zip(answers, truths, frames, strict=True):
            height, width = frame.shape[:2]
            result = source_accuracy(truth.boxes, answer.detections, width, height)
            hits += result.true_positives
            found += result.true_positives + result.false_positives
            there += result.true_positives + result.false_negatives
        return measure, (2 * hits / (found + there) if found + there else None)
    scores = np.array([[a.values[c] for c in classes] for a in answers], float)
    return measure, presence_auc(scores, np.array([t.present for t in truths], bool))


@dataclass(frozen=True)
class Figures:
    """A model's figures on a validation set: the share of follow-ups that violate (at the threshold),
    the share of clean frames whose answer moved from the base model's (judged as a follow-up with no
    change), and the accuracy on the clean frames in `measure` (`clean_accuracy`; None: no ground
    truth, or too few frames)."""

    violation_rate: float
    clean_drift: float
    accuracy: float | None
    measure: str = 'presence AUC'

    def as_record(self) -> dict:
        return {
            'violation_rate': self.violation_rate,
            'clean_drift': self.clean_drift,
            'accuracy': self.accuracy,
            'accuracy_measure': self.measure,
        }


@dataclass(frozen=True)
class ValidationSet:
    """Frames held out of training, each with the base model's answer and fixed follow-ups (changes
    drawn once from the plan, so that every candidate is judged on the same pairs)."""

    frames: tuple[np.ndarray, ...]
    base: tuple[Prediction, ...]
    changes: tuple[tuple[Composition, ...], ...]
    truths: tuple[FrameTruth | None, ...]
    #: Each frame's range map for MR12 (None: its priors); empty: none for any frame.
    ranges: tuple[np.ndarray | None, ...] = ()

    def figures(
        self, predict, classes: Sequence[str], threshold: float, iou_threshold: float = 0.5
    ) -> Figures:
        """The figures of the model behind `predict` (frames -> Predictions), each follow-up judged by
        its kind of answer as the search judges it (method/answers.py: boxes through the change)."""
        sources = predict(list(self.frames))
        followups = predict(
            [
                apply_composition(frame, change, ranges=ranges)
                for frame, changes, ranges in zip(
                    self.frames, self.changes, self.ranges or (None,) * len(self.frames), strict=True
                )
                for change in changes
            ]
        )
        pairs = [(s, c) for s, changes in zip(sources, self.changes, strict=True) for c in changes]
        criteria = Thresholds((threshold,), iou_threshold)

        def violates(
            source: Prediction, followup: Prediction, change: Composition, frame: np.ndarray
        ) -> bool:
            size = (int(frame.shape[1]), int(frame.shape[0]))
            judged = answer_for(source.kind).judge(source, followup, criteria, change, size)
            return any(judged.violation.values())

        shapes = [frame for frame, changes in zip(self.frames, self.changes, strict=True) for _ in changes]
        violated = [
            violates(s, f, c, frame) for (s, c), f, frame in zip(pairs, followups, shapes, strict=True)
        ]
        same = Composition.identity()
        drift = [violates(b, s, same, f) for b, s, f in zip(self.base, sources, self.frames, strict=True)]
        measure, accuracy = clean_accuracy(sources, self.truths, classes, self.frames)
        return Figures(
            float(np.mean(violated)) if violated else 0.0,
            float(np.mean(drift)) if drift else 0.0,
            accuracy,
            measure,
        )
