"""Conversions between ROS 2 messages and metavlm_ros frames and predictions (the one place for them)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from metavlm_ros.common.errors import InputError

if TYPE_CHECKING:
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'MAX_SIDE',
    'PREDICTION_STATUS',
    'SUPPORTED_ENCODINGS',
    'array_to_prediction',
    'convert_image_msg',
    'error_to_array',
    'image_msg_to_rgb',
    'latency_of',
    'prediction_to_array',
    'refusal_of',
    'rgb_to_image_msg',
    'stamp_to_ns',
    'ns_to_stamp',
]

# Longer side above which a frame is reduced (8K UHD); no VLM looks at more, and it bounds memory.
MAX_SIDE = 7680
PREDICTION_STATUS = 'metavlm/prediction'

# encoding -> (channels, numpy dtype, OpenCV code to RGB or None when already RGB)
SUPPORTED_ENCODINGS: dict[str, tuple[int, str, int | None]] = {
    'rgb8': (3, 'uint8', None),
    'bgr8': (3, 'uint8', cv2.COLOR_BGR2RGB),
    'rgba8': (4, 'uint8', cv2.COLOR_RGBA2RGB),
    'bgra8': (4, 'uint8', cv2.COLOR_BGRA2RGB),
    'mono8': (1, 'uint8', cv2.COLOR_GRAY2RGB),
    'mono16': (1, 'uint16', cv2.COLOR_GRAY2RGB),
    'rgb16': (3, 'uint16', None),
    'bgr16': (3, 'uint16', cv2.COLOR_BGR2RGB),
    'rgba16': (4, 'uint16', cv2.COLOR_RGBA2RGB),
    'bgra16': (4, 'uint16', cv2.COLOR_BGRA2RGB),
}

_RESERVED_KEYS = ('latency_ms', 'kind')

try:  # a real ROS distribution ships cv_bridge; the pip-only install decodes with rosbags-image
    from cv_bridge import CvBridge

    _BRIDGE: Any = CvBridge()
except ImportError:
    _BRIDGE = None
    from rosbags.image import compressed_image_to_cvimage, image_to_cvimage


def _is_compressed(msg: Any) -> bool:
    return hasattr(msg, 'format') and not hasattr(msg, 'encoding')


def _decode_raw(msg: Any) -> np.ndarray:
    """Decode a sensor_msgs/Image into an array in its own encoding, after checking its geometry."""
    encoding = str(msg.encoding)
    if encoding not in SUPPORTED_ENCODINGS:
        known = ', '.join(SUPPORTED_ENCODINGS)
        raise InputError(f'unsupported image encoding {encoding!r} (supported: {known})')
    channels, dtype, _ = SUPPORTED_ENCODINGS[encoding]
    width, height, step = int(msg.width), int(msg.height), int(msg.step)
    if width <= 0 or height <= 0:
        raise InputError(f'empty image ({width}x{height})')
    row_bytes = width * channels * np.dtype(dtype).itemsize
    if step < row_bytes:
        raise InputError(
            f'image step {step} is smaller than a {width}-pixel {encoding} row ({row_bytes} bytes)'
        )
    size = len(msg.data)
    if step * height != size:
        raise InputError(f'image data has {size} bytes but step*height is {step * height}')
    if _BRIDGE is not None:
        return np.asarray(_BRIDGE.imgmsg_to_cv2(msg, desired_encoding='passthrough'))
    if step == row_bytes:
        return np.asarray(image_to_cvimage(msg))  # rclpy's array.array data is read in place
    # rosbags-image assumes rows without padding; drop the padding ourselves.
    rows = np.frombuffer(msg.data, np.uint8).reshape(height, step)[:, :row_bytes]
    compact = SimpleNamespace(
        encoding=encoding,
        width=width,
        height=height,
        is_bigendian=bool(msg.is_bigendian),
        data=np.ascontiguousarray(rows).reshape(-1),
    )
    return np.asarray(image_to_cvimage(compact))


def _decode_compressed(msg: Any) -> np.ndarray:
    """Decode a sensor_msgs/CompressedImage into a BGR, BGRA or grey array."""
    fmt = str(msg.format)
    if 'compresseddepth' in fmt.lower():
        raise InputError(f'compressed depth images are not camera frames (format {fmt!r})')
    if len(msg.data) == 0:
        raise InputError(f'empty compressed image (format {fmt!r})')
    try:
        if _BRIDGE is not None:
            decoded = _BRIDGE.compressed_imgmsg_to_cv2(msg, desired_encoding='passthrough')
        else:
            decoded = compressed_image_to_cvimage(msg)
    except (AssertionError, cv2.error, ValueError, TypeError) as exc:
        raise InputError(f'corrupt or undecodable compressed image (format {fmt!r})') from exc
    if decoded is None or np.asarray(decoded).size == 0:
        raise InputError(f'corrupt or undecodable compressed image (format {fmt!r})')
    return np.asarray(decoded)


def _to_rgb8(array: np.ndarray, encoding: str) -> np.ndarray:
    """Turn a decoded array of a supported encoding into RGB uint8."""
    _, _, code = SUPPORTED_ENCODINGS[encoding]
    if array.dtype == np.uint16:
        # 65535 / 255 == 257: the full 16-bit range maps onto the full 8-bit range, rounded.
        array = ((array.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if code is not None:
        array = cv2.cvtColor(array, code)
    return np.ascontiguousarray(array, dtype=np.uint8)


def _compressed_encoding(array: np.ndarray) -> str:
    if array.ndim == 2 or array.shape[2] == 1:
        return 'mono16' if array.dtype == np.uint16 else 'mono8'
    suffix = '16' if array.dtype == np.uint16 else '8'
    return ('bgra' if array.shape[2] == 4 else 'bgr') + suffix


def convert_image_msg(msg: Image | CompressedImage, max_side: int = MAX_SIDE) -> tuple[np.ndarray, bool]:
    """Convert a camera message to an RGB frame and say whether it had to be reduced.

    Args:
        msg: a sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, mono8, mono16 and their 16-bit colour
            variants) or a sensor_msgs/CompressedImage (JPEG, PNG).
        max_side: frames whose longer side exceeds this are resized (area interpolation) to it.

    Returns:
        The frame (H, W, 3) uint8 RGB, C-contiguous and owning its memory, and True when it was
        downscaled (callers count these).

    Raises:
        InputError: unknown encoding, empty image, inconsistent step/size, corrupt compressed data.
    """
    if _is_compressed(msg):
        decoded = _decode_compressed(msg)
        rgb = _to_rgb8(decoded, _compressed_encoding(decoded))
    else:
        rgb = _to_rgb8(_decode_raw(msg), str(msg.encoding))
    height, width = rgb.shape[:2]
    longer = max(height, width)
    if max_side and longer > max_side:
        scale = max_side / longer
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        return np.ascontiguousarray(cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)), True
    if not rgb.flags.owndata:
        rgb = rgb.copy()  # never hand out a view of the message buffer
    return rgb, False


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
    array = np.asarray(rgb)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or array.size == 0:
        raise InputError(f'expected an RGB uint8 frame of shape (H, W, 3), got {array.dtype} {array.shape}')
    height, width = array.shape[:2]
    msg = Image(
        header=_header(header_or_stamp, frame_id),
        height=height,
        width=width,
        encoding='rgb8',
        is_bigendian=0,
        step=width * 3,
    )
    msg.data = np.ascontiguousarray(array).tobytes()
    return msg


def _confidence_summary(values: dict[str, float]) -> str:
    return ', '.join(f'{name} {value:.3f}' for name, value in values.items())


def prediction_to_array(
    prediction: Prediction, header: Header, model_id: str, latency_ms: float
) -> DiagnosticArray:
    """Build the `prediction` / `probe/prediction` message of docs/ros.md.

    One DiagnosticStatus named 'metavlm/prediction': hardware_id is the model, message the generated
    text (count-type models) or a confidence summary (CLIP), values one KeyValue per class (value as
    str, exact float repr) followed by 'latency_ms' and 'kind'.

    Args:
        prediction: the VLM's prediction for the frame.
        header: the frame's header, copied (its stamp correlates probes and replies).
        model_id: model id or directory of the backend.
        latency_ms: milliseconds from the frame's arrival to its prediction.

    Raises:
        InputError: a class name collides with 'latency_ms' or 'kind'.
    """
    clash = [name for name in prediction.values if name in _RESERVED_KEYS]
    if clash:
        raise InputError(f'class name {clash[0]!r} is reserved in prediction messages')
    values = [KeyValue(key=str(name), value=repr(float(value))) for name, value in prediction.values.items()]
    values.append(KeyValue(key='latency_ms', value=f'{float(latency_ms):.3f}'))
    values.append(KeyValue(key='kind', value=prediction.kind))
    message = prediction.text if prediction.kind == 'count' else _confidence_summary(prediction.values)
    status = DiagnosticStatus(
        level=DiagnosticStatus.OK,
        name=PREDICTION_STATUS,
        message=message,
        hardware_id=str(model_id),
        values=values,
    )
    return DiagnosticArray(header=Header(stamp=header.stamp, frame_id=header.frame_id), status=[status])


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
            or a value that is not a number.
    """
    from metavlm_ros.method.prediction import Prediction

    status = _find_status(msg)
    if status.level == DiagnosticStatus.ERROR:
        raise InputError(f'the frame was not judged: {status.message}')
    pairs = {item.key: item.value for item in status.values}
    kind = pairs.get('kind')
    if kind not in ('count', 'confidence'):
        raise InputError(f"prediction message has kind {kind!r}; expected 'count' or 'confidence'")
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
    return Prediction(kind=kind, values=values, text=text)


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
