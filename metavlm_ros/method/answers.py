"""The kinds of answer a model gives, each declared once: its violation keys, how a follow-up is judged.

- `count` (BLIP family): per class a count; Eqs. 2, 4, 7.
- `confidence` (CLIP family): per class a confidence; Eqs. 3, 5, 8, at each threshold.
- `detection` (detectors, grounding VLMs): objects with class, score and box; the box oracle of
  method/boxes.py (docs/method.md §13): f_pred = 1 - panoptic quality of the follow-up's boxes
  matched to the source's moved by the composition's warp, a violation a lost, new, reclassed or
  displaced object.
With object insertion active (§13) each kind expects its own change (method/insertion_oracle.py): the
source's boxes around the pasted object stay, one more of its class is counted, its confidence does
not fall. The search judges through `ANSWERS[source.kind]`; a fourth kind is one more declaration here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD, compare_detections, expected_boxes
from metavlm_ros.method.insertion_oracle import (
    confidence_change,
    count_change,
    expected_with_insertion,
    inserted_in,
)
from metavlm_ros.method.metrics import threshold_key, violation_flags, violation_strength_of
from metavlm_ros.method.objectives import f_pred
from metavlm_ros.method.relations import composition_matrix

if TYPE_CHECKING:
    from metavlm_ros.method.encoding import Composition
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'ANSWERS',
    'Answer',
    'Judgement',
    'Thresholds',
    'answer_for',
    'iou_key',
    'key_answer',
    'key_label',
    'key_order',
]


def iou_key(iou_threshold: float) -> str:
    """The key of a detection violation at an IoU threshold in violation flags, e.g. 'iou0.5'."""
    return f'iou{float(iou_threshold):g}'


@dataclass(frozen=True)
class Thresholds:
    """What a follow-up is judged by: the confidence thresholds (Eq. 5), the IoU threshold below
    which a matched box is displaced (§13), and whether a detector must find the object insertion
    pasted (§13's strict option; else only the source's objects around it must stay)."""

    thresholds: tuple[float, ...]
    iou_threshold: float = DEFAULT_IOU_THRESHOLD
    find_inserted: bool = False


@dataclass(frozen=True)
class Judgement:
    """A follow-up judged against its source: f_pred, a violation flag and strength per key, and for
    detections the match (`boxes`: what the records keep of it)."""

    f_pred: float
    violation: dict[str, bool]
    strength: dict[str, float | None]
    boxes: dict | None = field(default=None)


class Answer:
    """A kind of answer: its violation keys and how a follow-up is judged against the source."""

    kind: ClassVar[str]

    def owns(self, key: str) -> bool:
        """Whether a record's violation key is one of this kind's."""
        raise NotImplementedError

    def label(self, key: str, short: bool = False) -> str:
        """A key in words, for reports ('count change', 'Th=0.05'); `short` for a table's column."""
        raise NotImplementedError

    def keys(self, criteria: Thresholds) -> tuple[str, ...]:
        """The violation keys of a record, in order."""
        raise NotImplementedError

    def refining_key(self, criteria: Thresholds) -> str:
        """The most demanding key (the one the boundary search refines by)."""
        return self.keys(criteria)[0]

    def judge(
        self,
        source: Prediction,
        followup: Prediction,
        criteria: Thresholds,
        composition: Composition,
        size: tuple[int, int],
    ) -> Judgement:
        """Judge `followup` (of `composition` applied to the source frame of `size` (width, height))."""
        raise NotImplementedError

    def unchanged(self, criteria: Thresholds) -> Judgement:
        """The judgement of no change (the identity, a failed evaluation): f_pred 0, no violation."""
        keys = self.keys(criteria)
        return Judgement(0.0, dict.fromkeys(keys, False), dict.fromkeys(keys))

    def f_pred_scale(self, n_classes: int) -> int:
        """The largest f_pred, which normalises it for the hypervolume (§5): |C| for the paper's kinds."""
        return n_classes


class CountAnswer(Answer):
    kind = 'count'

    def owns(self, key: str) -> bool:
        return key == 'count'

    def label(self, key: str, short: bool = False) -> str:
        return 'count' if short else 'count change'

    def keys(self, criteria: Thresholds) -> tuple[str, ...]:
        return ('count',)

    def judge(self, source, followup, criteria, composition, size) -> Judgement:
        inserted = inserted_in(composition, *size)
        if inserted is not None:
            # One more of the pasted class is expected: the counts are judged against that (§13).
            change, violation, strength = count_change(source, followup, inserted)
            return Judgement(change, {'count': violation}, {'count': strength})
        return Judgement(
            f_pred(source, followup),
            violation_flags(source, followup, criteria.thresholds),
            {'count': violation_strength_of(source, followup)},
        )


class ConfidenceAnswer(Answer):
    kind = 'confidence'

    def owns(self, key: str) -> bool:
        try:
            return 0 < float(key) < 1
        except ValueError:
            return False

    def label(self, key: str, short: bool = False) -> str:
        return f'Th={100 * float(key):g}%' if short else f'Th={key}'

    def keys(self, criteria: Thresholds) -> tuple[str, ...]:
        if not criteria.thresholds:
            raise ParameterError('at least one violation threshold is needed for confidence predictions')
        return tuple(threshold_key(t) for t in criteria.thresholds)

    def refining_key(self, criteria: Thresholds) -> str:
        return threshold_key(min(criteria.thresholds))

    def judge(self, source, followup, criteria, composition, size) -> Judgement:
        inserted = inserted_in(composition, *size)
        if inserted is not None:
            # Only the pasted class is judged, and only a fall (§13).
            return Judgement(*confidence_change(source, followup, inserted, criteria.thresholds))
        return Judgement(
            f_pred(source, followup),
            violation_flags(source, followup, criteria.thresholds),
            {threshold_key(t): violation_strength_of(source, followup, t) for t in criteria.thresholds},
        )


class DetectionAnswer(Answer):
    kind = 'detection'

    def owns(self, key: str) -> bool:
        return key.startswith('iou')

    def label(self, key: str, short: bool = False) -> str:
        iou = float(key[3:])
        return f'IoU={100 * iou:g}%' if short else f'objects (lost, new, reclassed or IoU < {iou:g})'

    def keys(self, criteria: Thresholds) -> tuple[str, ...]:
        return (iou_key(criteria.iou_threshold),)

    def judge(self, source, followup, criteria, composition, size) -> Judgement:
        width, height = size
        expected = expected_boxes(
            source.detections, composition_matrix(composition, width, height), width, height
        )
        inserted = inserted_in(composition, width, height)
        if inserted is not None:
            # MetaOD's oracle: the objects around the pasted one stay; it is found under the strict option.
            expected = expected_with_insertion(expected, inserted, criteria.find_inserted)
        match = compare_detections(expected, followup.detections, criteria.iou_threshold)
        key = iou_key(criteria.iou_threshold)
        # Indices into the record's own lists: `expected` (each naming its source object, None for a
        # pasted one) and the follow-up's detections, so a record reads whole
        # (`boxes.expected[boxes.lost[0]].class`).
        boxes = {
            'expected': [{**e.as_record(), 'source': e.source} for e in expected],
            'lost': list(match.lost),
            'new': list(match.new),
            'reclassed': [list(pair) for pair in match.reclassed],
            'displaced': [[i, j, round(iou, 6)] for i, j, iou in match.displaced],
            'matched': [[i, j, round(iou, 6)] for i, j, iou in match.pairs],
        }
        return Judgement(
            match.f_pred, {key: match.violation}, {key: match.f_pred if match.violation else None}, boxes
        )

    def f_pred_scale(self, n_classes: int) -> int:
        return 1  # 1 - panoptic quality: in [0, 1] whatever the vocabulary


#: Every kind of answer, by the name a Prediction carries.
ANSWERS: dict[str, Answer] = {a.kind: a for a in (CountAnswer(), ConfidenceAnswer(), DetectionAnswer())}


def answer_for(kind: str) -> Answer:
    """The declaration of a prediction kind.

    Raises:
        ParameterError: an unknown kind.
    """
    try:
        return ANSWERS[kind]
    except KeyError:
        raise ParameterError(
            f'unknown prediction kind {kind!r}; expected one of {", ".join(ANSWERS)}'
        ) from None


def key_answer(key: str) -> Answer:
    """The kind of answer a record's violation key belongs to.

    Raises:
        ParameterError: a key of no kind.
    """
    for answer in ANSWERS.values():
        if answer.owns(key):
            return answer
    raise ParameterError(f'unknown violation key {key!r} (count, a threshold such as 0.05, or iou0.5)')


def key_label(key: str, short: bool = False) -> str:
    """A record's violation key in words (`Answer.label`)."""
    return key_answer(key).label(key, short)


def key_order(key: str) -> tuple:
    """Sorts violation keys: by kind as `ANSWERS` lists them, then by threshold ascending."""
    answer = key_answer(key)
    number = ''.join(c for c in key if c.isdigit() or c == '.')
    return (list(ANSWERS).index(answer.kind), float(number) if number else 0.0)
