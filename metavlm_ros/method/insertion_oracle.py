"""What object insertion expects of a follow-up (docs/method.md §13): MetaOD's oracle for boxes, one more
of the pasted class for counts, a confidence in it that does not fall."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import DEFAULT_MIN_VISIBLE, DEFAULT_PIXEL_TOLERANCE, ExpectedBox
from metavlm_ros.method.insertion import InsertedObject, pasted_object
from metavlm_ros.method.metrics import THRESHOLD_SLACK, class_differences, threshold_key
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.method.relations import RELATION_BY_ID

if TYPE_CHECKING:
    from metavlm_ros.method.encoding import Composition, SearchSpace
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'check_insertable',
    'class_changes',
    'confidence_change',
    'count_change',
    'expected_with_insertion',
    'inserted_in',
    'inserted_record',
]

_INSERTION = RELATION_BY_ID['insertion']
_INDEX = _INSERTION.number - 1


def inserted_in(composition: Composition, width: int, height: int) -> InsertedObject | None:
    """The object a composition pastes into its follow-up of `width` x `height` pixels; None when
    insertion is inactive or at its nominal value (nothing pasted)."""
    if not composition.active[_INDEX] or composition.values[_INDEX] == _INSERTION.nominal:
        return None
    cls, x, y = composition.extras[_INDEX]
    return pasted_object(float(composition.values[_INDEX]), float(round(cls)), x, y, int(width), int(height))


def inserted_record(inserted: InsertedObject | None) -> dict | None:
    """What an evaluation's record keeps of the pasted object: its class, its box (frame pixels; None
    when no pixel of it is solid) and whether it is large enough to be expected (counted; found under
    the strict option)."""
    if inserted is None:
        return None
    box = None if inserted.box is None else list(inserted.box)
    return {'class': inserted.cls, 'box': box, 'expected': inserted.expected}


def check_insertable(space: SearchSpace, classes: Iterable[str]) -> None:
    """Check that every class a search space may paste is one the model answers about.

    Raises:
        ParameterError: the space enables insertion of a class the model's vocabulary lacks.
    """
    if not space.enabled[_INDEX]:
        return
    classes = tuple(classes)
    low, high = space.extra_low[_INDEX][0], space.extra_high[_INDEX][0]
    pasted = CLASSES[int(round(low)) : int(round(high)) + 1]
    missing = [c for c in pasted if c not in classes]
    if missing:
        raise ParameterError(
            f'insertion pastes {", ".join(missing)}, which the model does not answer about (its classes: '
            f'{", ".join(classes)}); narrow insertion_class to classes it has'
        )


def expected_with_insertion(
    expected: Sequence[ExpectedBox],
    inserted: InsertedObject,
    find_inserted: bool,
    min_visible: float = DEFAULT_MIN_VISIBLE,
    tolerance: float = DEFAULT_PIXEL_TOLERANCE,
) -> list[ExpectedBox]:
    """The expected boxes of a follow-up with a pasted object (MetaOD's oracle), the pasted one last.

    A source object the pasted one leaves less than `min_visible` of in view is "either" (found or
    not, it counts for nothing); one partly covered may be answered by its whole box or by the part
    left in view, so each edge's band reaches to the box of its uncovered pixels. The pasted object is
    expected where it was drawn (its box, within `tolerance` pixels): required only with
    `find_inserted` (the strict option) and when it is large enough (`InsertedObject.expected`),
    "either" otherwise, so a box found on it is no new object. Its `source` is None.
    """
    out = []
    for box in expected:
        share, seen = inserted.uncovered(box.outer)
        if seen is None or share < min_visible:
            out.append(replace(box, required=False))
            continue
        if share >= 1.0:
            out.append(box)
            continue
        x1, y1, x2, y2 = box.inner
        inner = (max(x1, seen[0]), max(y1, seen[1]), min(x2, seen[2]), min(y2, seen[3]))
        out.append(replace(box, inner=tuple(float(v) for v in inner)))
    if inserted.box is not None:
        width, height = inserted.size
        x1, y1, x2, y2 = inserted.box
        outer = (max(x1 - tolerance, 0.0), max(y1 - tolerance, 0.0), min(x2 + tolerance, width),
                 min(y2 + tolerance, height))  # fmt: skip
        inner = (x1 + tolerance, y1 + tolerance, x2 - tolerance, y2 - tolerance)
        required = find_inserted and inserted.expected
        out.append(
            ExpectedBox(inserted.cls, tuple(map(float, outer)), tuple(map(float, inner)), required, None)
        )
    return out


def class_changes(
    kind: str, source: Mapping[str, float], followup: Mapping[str, float], pasted: str, expected: bool
) -> dict[str, float]:
    """Per class, how far a follow-up's values are from what insertion expects of them, as a record
    holds them (`source`, `followup`, `inserted`'s class and `expected`): for counts |f - s| of every
    class but the pasted one, |f - s - 1| of that (when too small to be expected, the nearer of
    |f - s| and |f - s - 1|); for confidences the pasted class's fall, max(0, s - f), alone (the
    other classes are not judged: an object more of one class may move every class's confidence).

    Raises:
        ParameterError: a pasted class the values do not hold, or a kind with no such rule.
    """
    if pasted not in source or pasted not in followup:
        raise ParameterError(f'insertion pasted {pasted}, which the model does not answer about')
    change = float(followup[pasted]) - float(source[pasted])
    if kind == 'confidence':
        return {pasted: max(0.0, -change)}
    if kind != 'count':
        raise ParameterError(f'no insertion rule for {kind!r} values (count or confidence)')
    differences = {cls: abs(float(followup[cls]) - float(value)) for cls, value in source.items()}
    differences[pasted] = abs(change - 1.0) if expected else min(abs(change), abs(change - 1.0))
    return differences


def count_change(
    source: Prediction, followup: Prediction, inserted: InsertedObject
) -> tuple[float, bool, float | None]:
    """Eqs. 2, 4 and 7 against the expected counts (`class_changes`): the source's, one more of the
    pasted class when it is large enough (`InsertedObject.expected`). Returns f_pred, the violation
    and its strength (None: no violation).

    Raises:
        ParameterError: mismatched predictions, or a pasted class the model does not count.
    """
    class_differences(source, followup)  # the same kind and classes, or a named error
    differences = class_changes('count', source.values, followup.values, inserted.cls, inserted.expected)
    f_pred = float(sum(d / (d + 1.0) for d in differences.values()))
    violating = [d for d in differences.values() if d >= 1.0]
    return f_pred, bool(violating), float(sum(violating)) if violating else None


def confidence_change(
    source: Prediction, followup: Prediction, inserted: InsertedObject, thresholds: Sequence[float]
) -> tuple[float, dict[str, bool], dict[str, float | None]]:
    """Eq. 5 one-sided on the pasted class alone (`class_changes`): its confidence must not fall.
    Returns f_pred (the fall, 0 when it rose), the violation and the strength at each threshold.

    Raises:
        ParameterError: mismatched predictions, or a pasted class the model has no confidence for.
    """
    class_differences(source, followup)
    (fall,) = class_changes('confidence', source.values, followup.values, inserted.cls, True).values()
    flags = {threshold_key(t): fall >= float(t) - THRESHOLD_SLACK for t in thresholds}
    return fall, flags, {key: fall if flag else None for key, flag in flags.items()}
