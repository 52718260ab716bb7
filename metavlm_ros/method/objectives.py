"""The two objectives of MetaVLM (docs/method.md §3, Eqs. 1-3): f_trans (minimise) and f_pred (maximise)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metavlm_ros.method.metrics import class_differences
from metavlm_ros.method.relations import RELATIONS

if TYPE_CHECKING:
    from metavlm_ros.method.encoding import Composition
    from metavlm_ros.method.prediction import Prediction

__all__ = ['f_pred', 'f_trans']


def f_trans(composition: Composition) -> float:
    """Eq. 1: the summed normalised deviation of the active relations from their nominal values.

    Each active relation adds |theta - nominal| / max_deviation, so f_trans lies in [0, 6]; MR3 at
    clip limit 1.0 is active yet adds 0. A relation's extras (MR10's blur angle) add nothing: a
    direction has no magnitude, and at length 0 every angle is the identity (docs/method.md §12).
    """
    return float(
        sum(
            abs(value - relation.nominal) / relation.max_deviation
            for relation, active, value in zip(RELATIONS, composition.active, composition.values, strict=True)
            if active
        )
    )


def f_pred(source: Prediction, followup: Prediction) -> float:
    """How far the follow-up prediction is from the source prediction.

    Count predictions (Eq. 2): sum over classes of d / (d + 1), d the absolute count difference.
    Confidence predictions (Eq. 3): sum over classes of the absolute confidence difference.

    Raises:
        ParameterError: when the predictions differ in kind or classes, or the kind is unknown.
    """
    differences = class_differences(source, followup).values()
    if source.kind == 'count':
        return float(sum(d / (d + 1.0) for d in differences))
    return float(sum(differences))
