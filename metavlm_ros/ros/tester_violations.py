"""The tester's `violations` status of one violating evaluation, and the flag it publishes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.answers import answer_for
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.search import Evaluation
from metavlm_ros.ros.tester_settings import NODE_NAME

__all__ = ['VIOLATION_STATUS', 'published_flag', 'violation_status']

VIOLATION_STATUS = 'metavlm/violation'


def published_flag(flags: Mapping[str, bool], threshold: float) -> str:
    """The key of `flags` that the report threshold selects ('count' for count-type models, the IoU
    key for detections: they have one flag each)."""
    if 'count' in flags:
        return 'count'
    for key in flags:
        if key.startswith('iou'):
            return key
    for key in flags:
        if math.isclose(float(key), threshold):
            return key
    raise ParameterError(f'no violation flag for threshold {threshold:g}')


def _compact(value: object) -> str:
    return json.dumps(value, separators=(',', ':'))


def violation_status(
    ev: Evaluation,
    source: Prediction,
    source_stamp_ns: int,
    *,
    image: str = '',
    frame: str = '',
    boxes: Mapping | None = None,
    found: Sequence[Mapping] | None = None,
) -> DiagnosticStatus:
    """The `violations` status of one violating evaluation (docs/ros.md).

    Level ERROR when severe (f_pred reaches half its largest value: half the number of classes, 0.5
    for detections), WARN otherwise; the message is the composition label; values: composition,
    order, each active relation's parameter, f_trans, f_pred, source/<class>, followup/<class>,
    source_stamp (ns), image and the follow-up PNG; for a detection search also `boxes` (the match:
    expected boxes, lost, new, reclassed, displaced, matched) and `followup_detections` (the found
    boxes), compact JSON in the records' form, boxes in camera-frame pixels.

    Args:
        boxes: The evaluation record's `boxes` (detections only).
        found: The evaluation record's `followup_detections` (detections only).
    """
    followup = ev.followup.values if ev.followup is not None else {}
    severe = ev.f_pred >= answer_for(source.kind).f_pred_scale(len(source.values)) / 2
    values = [
        KeyValue(key='composition', value=ev.composition.label),
        KeyValue(key='order', value=str(ev.composition.order)),
    ]
    values += [KeyValue(key=name, value=repr(float(v))) for name, v in ev.composition.parameters.items()]
    values += [
        KeyValue(key='f_trans', value=repr(float(ev.f_trans))),
        KeyValue(key='f_pred', value=repr(float(ev.f_pred))),
    ]
    values += [KeyValue(key=f'source/{c}', value=repr(float(v))) for c, v in source.values.items()]
    values += [KeyValue(key=f'followup/{c}', value=repr(float(v))) for c, v in followup.items()]
    values += [
        KeyValue(key='source_stamp', value=str(int(source_stamp_ns))),
        KeyValue(key='image', value=image),
        KeyValue(key='frame', value=frame),
    ]
    if source.kind == 'detection':
        values += [
            KeyValue(key='boxes', value=_compact(boxes)),
            KeyValue(key='followup_detections', value=_compact(found)),
        ]
    return DiagnosticStatus(
        level=DiagnosticStatus.ERROR if severe else DiagnosticStatus.WARN,
        name=VIOLATION_STATUS,
        message=ev.composition.label,
        hardware_id=NODE_NAME,
        values=values,
    )
