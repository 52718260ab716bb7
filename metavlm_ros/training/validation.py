"""How a model under hardening is judged on frames it is not trained on: violation rate of planned
follow-ups, drift of its clean answers from the base model's, and accuracy against the ground truth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.metrics import is_violation
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.relations import apply_composition

__all__ = ['Figures', 'ValidationSet', 'presence_auc']


def presence_auc(scores: np.ndarray, present: np.ndarray) -> float | None:
    """Mean ROC AUC over the classes of per-class scores against presence (classes that are present on
    every frame or on none are left out; None when no class has both)."""
    from sklearn.metrics import roc_auc_score

    values = [
        float(roc_auc_score(present[:, c], scores[:, c]))
        for c in range(present.shape[1])
        if 0 < present[:, c].sum() < len(present)
    ]
    return float(np.mean(values)) if values else None


@dataclass(frozen=True)
class Figures:
    """A model's figures on a validation set: the share of follow-ups that violate (at the threshold),
    the share of clean frames whose answer moved from the base model's by the threshold or more, and
    the mean presence AUC on the clean frames (None: no ground truth)."""

    violation_rate: float
    clean_drift: float
    accuracy: float | None

    def as_record(self) -> dict:
        return {
            'violation_rate': self.violation_rate,
            'clean_drift': self.clean_drift,
            'presence_auc': self.accuracy,
        }


@dataclass(frozen=True)
class ValidationSet:
    """Frames held out of training, each with the base model's answer and fixed follow-ups (changes
    drawn once from the plan, so that every candidate is judged on the same pairs)."""

    frames: tuple[np.ndarray, ...]
    base: tuple[Prediction, ...]
    changes: tuple[tuple[Composition, ...], ...]
    present: np.ndarray | None  # frames x classes, True where the ground truth shows the class

    def figures(self, predict, classes: Sequence[str], threshold: float) -> Figures:
        """The figures of the model behind `predict` (frames -> Predictions)."""
        sources = predict(list(self.frames))
        followups = predict(
            [
                apply_composition(frame, change)
                for frame, changes in zip(self.frames, self.changes, strict=True)
                for change in changes
            ]
        )
        pairs = [(s, c) for s, changes in zip(sources, self.changes, strict=True) for c in changes]
        violated = [is_violation(s, f, threshold) for (s, _), f in zip(pairs, followups, strict=True)]
        drift = [is_violation(b, s, threshold) for b, s in zip(self.base, sources, strict=True)]
        accuracy = None
        if self.present is not None:
            scores = np.array([[s.values[c] for c in classes] for s in sources], float)
            accuracy = presence_auc(scores, self.present)
        return Figures(
            float(np.mean(violated)) if violated else 0.0, float(np.mean(drift)) if drift else 0.0, accuracy
        )
