"""Conversions between ROS 2 messages and metavlm_ros frames and predictions (the one place for them)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from metavlm_ros.common.codec import decode_compressed, decode_raw, encode_compressed, encode_raw
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.images import resize_longer_side

if TYPE_CHECKING:
    from metavlm_ros.method.boxes import Detection
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'IDENTITY_STATUS',
    'MAX_SIDE',
    'PREDICTION_STATUS',
    'array_to_prediction',
    'convert_image_msg',
    'detection_array_to_detections',
    'detection_array_type',
    'detections_from_json',
    'detections_to_json',
    'error_to_array',
    'frame_and_scale',
    'identity_of',
    'identity_status',
    'image_msg_to_rgb',
    'latency_of',
    'prediction_to_array',
    'prediction_to_detection_array',
    'refusal_of',
    'rgb_to_compressed_msg',
    'rgb_to_image_msg',
    'stamp_to_ns',
    'ns_to_stamp',
]

# Longer side above which a frame is reduced (8K UHD); no VLM looks at more, and it bounds memory.
MAX_SIDE = 7680
PREDICTION_STATUS = 'metavlm/prediction'
#: The status beside the prediction in a probe's answer: what identifies the model that answered.
IDENTITY_STATUS = 'metavlm/identity'

#: The prediction message's own keys; every other KeyValue is a class. `detections`: the boxes of a
#: detection answer, compact JSON (`detections_to_json`).
_RESERVED_KEYS = ('latency_ms', 'kind', 'detections')
_KINDS = ('count', 'confidence', 'detection')


def _is_compressed(msg: Any) -> bool:
    return hasattr(msg, 'format') and not hasattr(msg, 'encoding')


def convert_image_msg(msg: Image | CompressedImage, max_side: int = MAX_SIDE) -> tuple[np.ndarray, bool]:
    """Convert a camera message to an RGB frame and say whether it had to be reduced.

    Args:
        msg: a sensor_msgs/Image (an encoding of common/codec.py's RAW_ENCODINGS: rgb8, bgr8,
            rgba8, bgra8, mono8, mono16 and the 16-bit colour ones) or a sensor_msgs/CompressedImage
            (JPEG, PNG).
        max_side: frames whose longer side exceeds this are resized (area interpolation) to it.

    Returns:
        The frame (H, W, 3) uint8 RGB, C-contiguous and owning its memory, and True when it was
        downscaled (callers count these).

    Raises:
        InputError: unknown encoding, empty image, inconsistent step/size, corrupt compressed data.
    """
    rgb, scale = frame_and_scale(msg, max_side)
    return rgb, scale != (1.0, 1.0)


def frame_and_scale(
    msg: Image | CompressedImage, max_side: int = MAX_SIDE
) -> tuple[np.ndarray, tuple[float, float]]:
    """Convert a camera message to an RGB frame, and say how many of the message's pixels one of the
    frame's is, across and down ((1.0, 1.0) unless it was reduced): boxes found on the frame are
    multiplied by it to be in the pixels of the image received.

    Raises:
        InputError: see `convert_image_msg`.
    """
    # The codec bags are read with offline (footage/bags.py): the same pixels both ways.
    if _is_compressed(msg):
        rgb = decode_compressed(msg.format, msg.data)
    else:
        rgb = decode_raw(msg.encoding, msg.width, msg.height, msg.step, msg.is_bigendian, msg.data)
    # The one resize (common/images.py), as the search's working size uses it.
    reduced = resize_longer_side(rgb, max_side)
    if reduced is rgb:
        return rgb, (1.0, 1.0)
    height, width = rgb.shape[:2]
    return np.ascontiguousarray(reduced), (width / reduced.shape[1], height / reduced.shape[0])


def image_msg_to_rgb(msg: Image | CompressedImage) -> np.ndarray:
    """Convert a camera message to an RGB uint8 frame (longer side at most MAX_SIDE).

    Raises:
        InputError: see `convert_image_msg`.
    """
    return convert_image_msg(msg)[0]


def ns_to_stamp(stamp_ns: int) -> Time:
    """A builtin_interfaces/Time from integer nanoseconds."""
    if stamp_ns < 0:
        raise InputError(f'negative stamp {stamp_ns} ns')
    return Time(sec=int(stamp_ns // 1_000_000_000), nanosec=int(stamp_ns % 1_000_000_000))


def stamp_to_ns(stamp: Time) -> int:
    """Integer nanoseconds of a builtin_interfaces/Time."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _header(header_or_stamp: Header | Time | int, frame_id: str) -> Header:
    if isinstance(header_or_stamp, Header):
        return Header(stamp=header_or_stamp.stamp, frame_id=frame_id or header_or_stamp.frame_id)
    if isinstance(header_or_stamp, Time):
        return Header(stamp=header_or_stamp, frame_id=frame_id)
    if isinstance(header_or_stamp, int | np.integer):
        return Header(stamp=ns_to_stamp(int(header_or_stamp)), frame_id=frame_id)
    raise InputError(
        f'expected a Header, a Time or integer nanoseconds, got {type(header_or_stamp).__name__}'
    )


def rgb_to_image_msg(rgb: np.ndarray, header_or_stamp: Header | Time | int, frame_id: str = '') -> Image:
    """Build a sensor_msgs/Image (rgb8) from an RGB frame.

    Args:
        rgb: (H, W, 3) uint8 frame in RGB order.
        header_or_stamp: a Header (stamp and frame_id copied), a Time, or integer nanoseconds.
        frame_id: overrides the header's frame_id when not empty.

    Raises:
        InputError: the array is not a non-empty (H, W, 3) uint8 frame.
    """
    raw = encode_raw(rgb)
    msg = Image(
        header=_header(header_or_stamp, frame_id),
        height=raw.height,
        width=raw.width,
        encoding=raw.encoding,
        is_bigendian=raw.is_bigendian,
        step=raw.step,
    )
    msg.data = raw.data
    return msg


def rgb_to_compressed_msg(
    rgb: np.ndarray, header_or_stamp: Header | Time | int, frame_id: str = ''
) -> CompressedImage:
    """Build a JPEG sensor_msgs/CompressedImage from an RGB frame, as a bag's compressed topic holds it.

    The quality and format are common/codec.py's JPEG_QUALITY and JPEG_FORMAT (image_transport's).

    Args:
        rgb: (H, W, 3) uint8 frame in RGB order.
        header_or_stamp: a Header (stamp and frame_id copied), a Time, or integer nanoseconds.
        frame_id: overrides the header's frame_id when not empty.

    Raises:
        InputError: the array is not a non-empty (H, W, 3) uint8 frame.
    """
    fmt, data = encode_compressed(rgb)
    msg = CompressedImage(header=_header(header_or_stamp, frame_id), format=fmt)
    msg.data = data
    return msg


def _confidence_summary(values: dict[str, float]) -> str:
    return ', '.join(f'{name} {value:.3f}' for name, value in values.items())


def _summary(prediction: Prediction) -> str:
    """The status message: a count model's text, else its values (how many objects per class found)."""
    if prediction.kind == 'count':
        return prediction.text
    if prediction.kind == 'detection':
        return ', '.join(f'{name} {value:g}' for name, value in prediction.values.items())
    return _confidence_summary(prediction.values)


def detections_to_json(detections: Sequence[Detection]) -> str:
    """Detections as compact JSON: a list of {"class", "score", "box": [x1, y1, x2, y2]} (the records'
    form, docs/results.md), numbers exact (repr), no spaces."""
    return json.dumps([d.as_record() for d in detections], separators=(',', ':'))


def detections_from_json(text: str) -> tuple[Detection, ...]:
    """Read `detections_to_json` back.

    Raises:
        InputError: not such a list, or a box that is not four finite numbers.
    """
    from metavlm_ros.method.boxes import Detection

    try:
        found = tuple(Detection.from_record(item) for item in json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f'unreadable detections {text[:80]!r}: {exc}') from None
    for d in found:
        if len(d.box) != 4 or not all(math.isfinite(v) for v in (*d.box, d.score)):
            raise InputError(f'detection of class {d.cls!r} has no finite box [x1, y1, x2, y2]: {d.box}')
    return found


def prediction_to_array(
    prediction: Prediction,
    header: Header,
    model_id: str,
    latency_ms: float,
    identity: DiagnosticStatus | None = None,
) -> DiagnosticArray:
    """Build the `prediction` / `probe/prediction` message of docs/ros.md.

    One DiagnosticStatus named 'metavlm/prediction': hardware_id is the model, message the generated
    text (count-type models), a confidence summary (CLIP) or a count per class (detectors), values one
    KeyValue per class (value as str, exact float repr) followed by 'latency_ms' and 'kind', and for a
    detection answer 'detections' (its boxes, `detections_to_json`, in the frame's pixels).

    Args:
        prediction: the VLM's prediction for the frame.
        header: the frame's header, copied (its stamp correlates probes and replies).
        model_id: model id or directory of the backend.
        latency_ms: milliseconds from the frame's arrival to its prediction.
        identity: the model's `identity_status`, sent after the prediction (the perception node's
            answers to probes: the tester records it).

    Raises:
        InputError: a class name collides with 'latency_ms' or 'kind'.
    """
    clash = [name for name in prediction.values if name in _RESERVED_KEYS]
    if clash:
        raise InputError(f'class name {clash[0]!r} is reserved in prediction messages')
    values = [KeyValue(key=str(name), value=repr(float(value))) for name, value in prediction.values.items()]
    values.append(KeyValue(key='latency_ms', value=f'{float(latency_ms):.3f}'))
    values.append(KeyValue(key='kind', value=prediction.kind))
    if prediction.kind == 'detection':
        values.append(KeyValue(key='detections', value=detections_to_json(prediction.detections)))
    message = _summary(prediction)
    status = DiagnosticStatus(
        level=DiagnosticStatus.OK,
        name=PREDICTION_STATUS,
        message=message,
        hardware_id=str(model_id),
        values=values,
    )
    statuses = [status] if identity is None else [status, identity]
    return DiagnosticArray(header=Header(stamp=header.stamp, frame_id=header.frame_id), status=statuses)


def identity_status(identity: Mapping[str, Any]) -> DiagnosticStatus:
    """The model's identity (models/identity.py `model_identity`) as a status named 'metavlm/identity':
    one KeyValue per part (backend, model, weights_sha256, options, what the backend adds), each value
    JSON, so the tester reads back exactly the record an in-process run writes."""
    values = [
        KeyValue(key=str(key), value=json.dumps(value, sort_keys=True)) for key, value in identity.items()
    ]
    return DiagnosticStatus(
        level=DiagnosticStatus.OK,
        name=IDENTITY_STATUS,
        hardware_id=str(identity.get('model') or ''),
        values=values,
    )


def identity_of(msg: DiagnosticArray) -> dict[str, Any] | None:
    """The identity an answer carries (`identity_status`); None when it carries none (an earlier node).

    Raises:
        InputError: a part that is not JSON.
    """
    for status in msg.status:
        if status.name == IDENTITY_STATUS:
            try:
                return {item.key: json.loads(item.value) for item in status.values}
            except json.JSONDecodeError as exc:
                raise InputError(f'unreadable model identity in the answer: {exc}') from None
    return None


def error_to_array(header: Header, model_id: str, reason: str) -> DiagnosticArray:
    """The answer to a frame that could not be judged: the prediction form with level ERROR.

    One DiagnosticStatus named 'metavlm/prediction', level ERROR, message the reason, hardware_id the
    model, no values; the header is copied, so a probe's stamp identifies the refused request.
    """
    status = DiagnosticStatus(
        level=DiagnosticStatus.ERROR, name=PREDICTION_STATUS, message=str(reason), hardware_id=str(model_id)
    )
    return DiagnosticArray(header=Header(stamp=header.stamp, frame_id=header.frame_id), status=[status])


def refusal_of(msg: DiagnosticArray) -> str | None:
    """The reason of an error answer made by `error_to_array`; None for a prediction."""
    status = _find_status(msg)
    if status.level == DiagnosticStatus.ERROR:
        return status.message or 'refused without a reason'
    return None


def _find_status(msg: DiagnosticArray) -> DiagnosticStatus:
    for status in msg.status:
        if status.name == PREDICTION_STATUS:
            return status
    raise InputError(f'no {PREDICTION_STATUS!r} status in the prediction message')


def array_to_prediction(msg: DiagnosticArray) -> Prediction:
    """Read a Prediction back from a `prediction` / `probe/prediction` message.

    Raises:
        InputError: no 'metavlm/prediction' status, an error answer (level ERROR), no or unknown 'kind',
            a value that is not a number, or unreadable detections.
    """
    from metavlm_ros.method.prediction import Prediction

    status = _find_status(msg)
    if status.level == DiagnosticStatus.ERROR:
        raise InputError(f'the frame was not judged: {status.message}')
    pairs = {item.key: item.value for item in status.values}
    kind = pairs.get('kind')
    if kind not in _KINDS:
        raise InputError(f'prediction message has kind {kind!r}; expected one of {", ".join(_KINDS)}')
    values: dict[str, float] = {}
    for key, text in pairs.items():
        if key in _RESERVED_KEYS:
            continue
        try:
            value = float(text)
        except ValueError:
            raise InputError(f'prediction value of class {key!r} is not a number: {text!r}') from None
        if not math.isfinite(value):
            raise InputError(f'prediction value of class {key!r} is not finite: {text!r}')
        values[key] = value
    text = status.message if kind == 'count' else ''
    detections = detections_from_json(pairs.get('detections', '[]')) if kind == 'detection' else ()
    return Prediction(kind=kind, values=values, text=text, detections=detections)


def latency_of(msg: DiagnosticArray) -> float | None:
    """The 'latency_ms' a prediction message carries, or None when it has none."""
    status = _find_status(msg)
    for item in status.values:
        if item.key == 'latency_ms':
            try:
                return float(item.value)
            except ValueError:
                return None
    return None


# -- vision_msgs: the detections topic (an optional dependency: pip-only installs may lack it) ---------


def detection_array_type() -> type | None:
    """vision_msgs/Detection2DArray, or None where vision_msgs is not installed."""
    try:
        from vision_msgs.msg import Detection2DArray
    except ImportError:
        return None
    return Detection2DArray


def prediction_to_detection_array(prediction: Prediction, header: Header) -> Any:
    """The `detections` message (vision_msgs/Detection2DArray) of a detection answer.

    The header is copied (to the array and to each detection); per object one Detection2D with one
    ObjectHypothesisWithPose (class_id, score) and its box as BoundingBox2D: centre and size in the
    pixels of the frame the answer is about, theta 0.

    Raises:
        ImportError: vision_msgs is not installed (`detection_array_type` says so first).
    """
    from vision_msgs.msg import (
        BoundingBox2D,
        Detection2D,
        Detection2DArray,
        ObjectHypothesis,
        ObjectHypothesisWithPose,
        Point2D,
        Pose2D,
    )

    copied = Header(stamp=header.stamp, frame_id=header.frame_id)
    array = Detection2DArray(header=copied)
    for d in prediction.detections:
        x1, y1, x2, y2 = (float(v) for v in d.box)
        hypothesis = ObjectHypothesisWithPose(
            hypothesis=ObjectHypothesis(class_id=d.cls, score=float(d.score))
        )
        box = BoundingBox2D(
            center=Pose2D(position=Point2D(x=(x1 + x2) / 2, y=(y1 + y2) / 2), theta=0.0),
            size_x=x2 - x1,
            size_y=y2 - y1,
        )
        array.detections.append(Detection2D(header=copied, results=[hypothesis], bbox=box))
    return array


def detection_array_to_detections(msg: Any) -> tuple[Detection, ...]:
    """Read the objects of a Detection2DArray back (its best hypothesis each; boxes as x1, y1, x2, y2)."""
    from metavlm_ros.method.boxes import Detection

    found = []
    for detection in msg.detections:
        if not detection.results:
            continue
        best = max(detection.results, key=lambda r: r.hypothesis.score).hypothesis
        bbox = detection.bbox
        cx, cy = bbox.center.position.x, bbox.center.position.y
        half_w, half_h = bbox.size_x / 2, bbox.size_y / 2
        found.append(
            Detection(best.class_id, best.score, (cx - half_w, cy - half_h, cx + half_w, cy + half_h))
        )
    return tuple(found)
