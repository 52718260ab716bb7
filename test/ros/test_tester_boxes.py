"""The tester's box figures (ros/tester_boxes.py), from evaluations the search's own box oracle judged."""

import math

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from metavlm_ros.method.answers import Thresholds, answer_for
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.records import Evaluation
from metavlm_ros.ros.tester_boxes import BOXES_STATUS, CHANGES, IOU_BINS, BoxTally
from test.ros.tester_graph import values_of

WIDTH, HEIGHT = 200, 100
SHIFT = Composition.from_parameters({'translation': 0.025})  # every pixel 5 to the right
SOURCE = (
    Detection('animal', 0.9, (10.0, 10.0, 50.0, 50.0)),
    Detection('trash', 0.8, (100.0, 20.0, 140.0, 60.0)),
    Detection('object', 0.7, (150.0, 60.0, 190.0, 95.0)),
)


def _moved(detection: Detection, cls: str | None = None, dy: float = 0.0) -> Detection:
    x1, y1, x2, y2 = detection.box
    return Detection(cls or detection.cls, detection.score, (x1 + 5, y1 + dy, x2 + 5, y2 + dy))


def _judged(found, composition=SHIFT, iou_threshold=0.5, failed=False) -> Evaluation:
    """An evaluation of `found` as the follow-up's answer, judged by the detection answer's oracle."""
    answer = answer_for('detection')
    source = Prediction('detection', {}, detections=SOURCE)
    followup = None if failed else Prediction('detection', {}, detections=tuple(found))
    criteria = Thresholds((0.05,), iou_threshold)
    if failed or composition.order == 0:
        judged = answer.unchanged(criteria)
    else:
        judged = answer.judge(source, followup, criteria, composition, (WIDTH, HEIGHT))
    return Evaluation(
        0, 0, np.zeros(0), composition, f_trans(composition), judged.f_pred, followup,
        judged.violation, judged.strength, failed=failed, boxes=judged.boxes,
    )  # fmt: skip


@pytest.fixture
def batch():
    """One follow-up that breaks three objects, one answered right, an identity and a failure."""
    animal, trash, thing = SOURCE
    broken = _judged([
        _moved(animal),  # where the shift put it
        _moved(trash, dy=25),  # found 25 pixels too low: displaced
        _moved(thing, cls='vegetation'),  # in its place, another class: reclassed (lost and new)
        Detection('animal', 0.6, (60.0, 60.0, 80.0, 80.0)),  # nothing there: new
    ])  # fmt: skip
    clean = _judged([_moved(d) for d in SOURCE])
    return [broken, clean, _judged(SOURCE, Composition.identity()), _judged([], failed=True)]


def test_the_figures_count_each_change_by_object_class_and_evaluation(batch):
    tally = BoxTally()
    assert tally.add(batch, 0.5) == 2  # the identity and the failed one carry no boxes
    figures = tally.figures()
    broken = batch[0].boxes
    assert (len(broken['lost']), len(broken['new']), len(broken['displaced'])) == (1, 2, 1)
    assert {k: figures[k] for k in ('evaluations_judged', 'evaluations_violating', 'violation_rate')} == {
        'evaluations_judged': 2, 'evaluations_violating': 1, 'violation_rate': 0.5,
    }  # fmt: skip
    assert (figures['objects_expected'], figures['objects_matched']) == (6, 5)
    assert [figures[c] for c in CHANGES] == [1, 2, 1, 1]
    assert [figures[f'{c}_rate'] for c in CHANGES] == [0.5] * 4
    by_class = {k: v for k, v in figures.items() if '/' in k}
    assert by_class == {
        'lost/object': 1, 'new/animal': 1, 'new/vegetation': 1, 'reclassed/object': 1, 'displaced/trash': 1,
    }  # fmt: skip
    # Four of the five matched pairs are exact; the tenth percentile is the displaced one's IoU.
    displaced_iou = broken['displaced'][0][2]
    assert 0 < displaced_iou < 0.5
    assert figures['matched_iou_p50'] == 1.0
    assert figures['matched_iou_p10'] == pytest.approx(displaced_iou, abs=0.5 / IOU_BINS)
    assert figures['iou_threshold'] == 0.5


def test_the_status_warns_once_a_box_changed_and_is_ok_while_none_has(batch):
    quiet = BoxTally()
    quiet.add(batch[1:], 0.5)
    (ok,) = quiet.statuses()
    assert (ok.name, ok.level) == (BOXES_STATUS, DiagnosticStatus.OK)
    assert ok.message == 'no box changed (1 evaluations judged)'
    assert values_of(ok)['matched_iou_p10'] == '1'
    quiet.add(batch[:1], 0.5)
    (warn,) = quiet.statuses()
    assert warn.level == DiagnosticStatus.WARN
    assert warn.message == '1 of 2 evaluations changed boxes: lost 1, new 2, reclassed 1, displaced 1'
    values = values_of(warn)
    assert (values['evaluations_judged'], values['lost/object'], values['iou_threshold']) == ('2', '1', '0.5')


def test_other_kinds_of_answer_publish_nothing():
    tally = BoxTally()
    source = Prediction('confidence', {'animal': 0.2})
    followup = Prediction('confidence', {'animal': 0.9})
    judged = answer_for('confidence').judge(source, followup, Thresholds((0.05,)), SHIFT, (WIDTH, HEIGHT))
    confidence = Evaluation(
        0, 0, np.zeros(0), SHIFT, f_trans(SHIFT), judged.f_pred, followup, judged.violation, judged.strength
    )
    assert judged.violation['0.05'] and tally.add([confidence], 0.5) == 0
    assert tally.statuses() == []
    assert math.isnan(tally.iou_quantile(0.5))


def test_memory_stays_bounded_and_another_threshold_starts_afresh(batch):
    tally = BoxTally()
    for _ in range(1000):
        tally.add(batch, 0.5)
    figures = tally.figures()
    assert (figures['evaluations_judged'], figures['new'], figures['objects_matched']) == (2000, 2000, 5000)
    assert tally.iou_histogram.shape == (IOU_BINS + 1,) and int(tally.iou_histogram.sum()) == 5000
    # A fifth of the pairs are the displaced one: the tenth percentile still is its IoU.
    assert figures['matched_iou_p10'] == pytest.approx(batch[0].boxes['displaced'][0][2], abs=0.5 / IOU_BINS)
    strict = [_judged(e.followup.detections, iou_threshold=0.7) for e in batch[:2]]
    tally.add(strict, 0.7)
    assert (tally.figures()['evaluations_judged'], tally.figures()['iou_threshold']) == (2, 0.7)
