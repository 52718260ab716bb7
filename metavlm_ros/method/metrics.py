"""Violations, violation rate and strength, non-dominated sets and hypervolume (docs/method.md §4-5)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from metavlm_ros.common.errors import ParameterError

if TYPE_CHECKING:
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'DEFAULT_THRESHOLDS',
    'KINDS',
    'THRESHOLD_SLACK',
    'anytime_hypervolume',
    'class_differences',
    'hypervolume',
    'is_violation',
    'non_dominated',
    'threshold_key',
    'violation_flags',
    'violation_rate',
    'violation_strength',
    'violation_strength_of',
]

DEFAULT_THRESHOLDS: tuple[float, ...] = (0.01, 0.03, 0.05)
KINDS = ('count', 'confidence')

# A confidence difference of 0.3 - 0.27 is 0.0299999... in binary floating point; this slack keeps
# Eq. 5 true to its decimal meaning (d >= Th) without admitting any real difference below Th.
THRESHOLD_SLACK = 1e-12


def class_differences(source: Prediction, followup: Prediction) -> dict[str, float]:
    """Absolute per-class difference |source - follow-up| of two predictions of the same kind and classes.

    Raises:
        ParameterError: when the kinds differ or are unknown, or the class sets differ.
    """
    if source.kind not in KINDS:
        raise ParameterError(f'unknown prediction kind {source.kind!r}; expected one of {", ".join(KINDS)}')
    if followup.kind != source.kind:
        raise ParameterError(
            f'source and follow-up predictions differ in kind: {source.kind!r} vs {followup.kind!r}'
        )
    if set(source.values) != set(followup.values):
        raise ParameterError(
            f'source and follow-up predictions have different classes: '
            f'{sorted(source.values)} vs {sorted(followup.values)}'
        )
    return {name: abs(float(value) - float(followup.values[name])) for name, value in source.values.items()}


def _check_threshold(threshold: float) -> float:
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise ParameterError(f'a violation threshold must be a number, got {threshold!r}') from None
    if not (math.isfinite(value) and value > 0):
        raise ParameterError(f'a violation threshold must be a positive number, got {threshold!r}')
    return value


def _violating(source: Prediction, followup: Prediction, threshold: float | None) -> dict[str, float]:
    """Per-class differences of the classes that violate (count: d >= 1; confidence: d >= Th)."""
    differences = class_differences(source, followup)
    if source.kind == 'count':
        limit = 1.0
    else:
        limit = _check_threshold(DEFAULT_THRESHOLDS[0] if threshold is None else threshold) - THRESHOLD_SLACK
    return {name: d for name, d in differences.items() if d >= limit}


def is_violation(source: Prediction, followup: Prediction, threshold: float | None = None) -> bool:
    """Boolean violation of a source / follow-up pair.

    Counts (Eq. 4): some class count differs by at least 1; ``threshold`` is ignored.
    Confidences (Eq. 5): some class confidence differs by at least ``threshold`` (0.01 when None).

    Raises:
        ParameterError: on mismatched predictions or a threshold that is not a positive number.
    """
    return bool(_violating(source, followup, threshold))


def threshold_key(threshold: float) -> str:
    """The key of a threshold in violation flags, e.g. '0.03'."""
    return f'{float(threshold):g}'


def violation_flags(
    source: Prediction, followup: Prediction, thresholds: Iterable[float] = DEFAULT_THRESHOLDS
) -> dict[str, bool]:
    """Violation of a pair under each criterion: {'count': b} for counts, {'0.01': b, ...} for confidences.

    Raises:
        ParameterError: on mismatched predictions or an invalid threshold.
    """
    if source.kind == 'count':
        return {'count': is_violation(source, followup)}
    thresholds = tuple(thresholds)
    if not thresholds:
        raise ParameterError('at least one violation threshold is needed for confidence predictions')
    return {threshold_key(t): is_violation(source, followup, t) for t in thresholds}


def violation_strength_of(
    source: Prediction, followup: Prediction, threshold: float | None = None
) -> float | None:
    """Summed per-class differences over the violating classes of a pair (Eqs. 7, 8); None when no violation.

    Raises:
        ParameterError: on mismatched predictions or an invalid threshold.
    """
    violating = _violating(source, followup, threshold)
    return float(sum(violating.values())) if violating else None


def violation_rate(flags: Sequence[bool]) -> float:
    """Eq. 6: the fraction of violating pairs in a solution set; nan for an empty set."""
    values = np.asarray(list(flags), dtype=bool)
    return float(values.mean()) if values.size else math.nan


def violation_strength(strengths: Sequence[float | None]) -> float:
    """Eqs. 7-8: mean violation strength over the violating pairs; nan when there are none.

    ``strengths`` holds one entry per violating pair; None entries (pairs that do not violate, as
    returned by violation_strength_of) are skipped.
    """
    values = [float(s) for s in strengths if s is not None]
    return float(np.mean(values)) if values else math.nan


def _objectives(f_trans: ArrayLike, f_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(f_trans, dtype=float).reshape(-1)
    p = np.asarray(f_pred, dtype=float).reshape(-1)
    if t.shape != p.shape:
        raise ParameterError(f'f_trans and f_pred must have the same length, got {t.size} and {p.size}')
    return t, p


def non_dominated(f_trans: ArrayLike, f_pred: ArrayLike) -> np.ndarray:
    """Indices (ascending) of the non-dominated points when minimising f_trans and maximising f_pred.

    A point is in the set when no other point is at least as good in both objectives and better in
    one; points with identical objectives are all kept (they add no hypervolume, and none of them
    dominates the others). Points with a nan objective (failed evaluations) are never in the set.

    Raises:
        ParameterError: when the two arrays differ in length.
    """
    t, p = _objectives(f_trans, f_pred)
    valid = np.flatnonzero(~(np.isnan(t) | np.isnan(p)))
    if valid.size == 0:
        return np.empty(0, dtype=np.intp)
    # Sweep by f_trans ascending, f_pred descending: a point is non-dominated exactly when its f_pred
    # is the best of its f_trans group and beats every group of smaller f_trans.
    order = valid[np.lexsort((-p[valid], t[valid]))]
    ts, ps = t[order], p[order]
    starts = np.concatenate(([True], ts[1:] != ts[:-1]))
    group = np.cumsum(starts) - 1
    group_best = ps[starts]
    best_before = np.maximum.accumulate(np.concatenate(([-np.inf], group_best[:-1])))
    keep = (ps == group_best[group]) & (ps > best_before[group])
    return np.sort(order[keep])


def hypervolume(f_trans: ArrayLike, f_pred: ArrayLike, n_classes: int, n_relations: int = 6) -> float:
    """Hypervolume of a set of (f_trans, f_pred) points on the normalised objectives of docs/method.md §5.

    f_trans is divided by the number of relations the search used (its largest possible value: 6
    for the paper's six) and f_pred, clipped to [0, n_classes], by n_classes; the indicator
    minimises (f_trans_n, -f_pred_n) against the reference point (1, 0), so the result is in [0, 1].
    Computed with pymoo's HV indicator; an empty or fully dominated set gives 0.

    Raises:
        ParameterError: when n_classes or n_relations is below 1 or the arrays differ in length.
    """
    if int(n_classes) != n_classes or n_classes < 1:
        raise ParameterError(f'the number of classes must be a positive integer, got {n_classes!r}')
    if int(n_relations) != n_relations or n_relations < 1:
        raise ParameterError(f'the number of relations must be a positive integer, got {n_relations!r}')
    t, p = _objectives(f_trans, f_pred)
    keep = ~(np.isnan(t) | np.isnan(p))
    t_n = t[keep] / float(n_relations)
    p_n = np.clip(p[keep], 0.0, float(n_classes)) / float(n_classes)
    # Only points strictly better than the reference in both objectives add volume.
    inside = (t_n < 1.0) & (p_n > 0.0)
    if not inside.any():
        return 0.0
    from pymoo.indicators.hv import HV  # imported here: pymoo is slow to import and only needed now

    points = np.column_stack((t_n[inside], -p_n[inside]))
    return float(HV(ref_point=np.array([1.0, 0.0])).do(points))


def anytime_hypervolume(
    f_trans: ArrayLike, f_pred: ArrayLike, n_classes: int, n_relations: int, at: ArrayLike
) -> np.ndarray:
    """The hypervolume (as `hypervolume`) of the first k points of a search, for every k in `at`.

    A search's evaluations in the order it made them give its anytime result: what it had found
    after k model evaluations. In two objectives the volume is a sum of rectangles under the sorted
    front, so each prefix costs one sort, not one indicator run.

    Raises:
        ParameterError: as `hypervolume`.
    """
    if int(n_classes) != n_classes or n_classes < 1:
        raise ParameterError(f'the number of classes must be a positive integer, got {n_classes!r}')
    if int(n_relations) != n_relations or n_relations < 1:
        raise ParameterError(f'the number of relations must be a positive integer, got {n_relations!r}')
    t, p = _objectives(f_trans, f_pred)
    t_n = t / float(n_relations)
    p_n = np.clip(p, 0.0, float(n_classes)) / float(n_classes)
    out = []
    for k in np.asarray(at, dtype=int).reshape(-1):
        tk, pk = t_n[: max(k, 0)], p_n[: max(k, 0)]
        inside = ~(np.isnan(tk) | np.isnan(pk)) & (tk < 1.0) & (pk > 0.0)
        tk, pk = tk[inside], pk[inside]
        if tk.size == 0:
            out.append(0.0)
            continue
        front = non_dominated(tk, pk)
        order = front[np.argsort(tk[front], kind='stable')]
        ts, ps = tk[order], pk[order]
        widths = np.diff(np.concatenate([ts, [1.0]]))
        out.append(float(np.sum(widths * ps)))
    return np.array(out)
