"""What our bags hold: topics, storages, the typestore, bag names and the messages of a frame."""

from __future__ import annotations

import hashlib
import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.codec import (
    JPEG_QUALITY,
    encode_compressed,
    encode_raw,
)
from metavlm_ros.common.errors import BagError, ParameterError
from metavlm_ros.footage.truth import KINDS, GroundTruth
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'BAG_VERSION',
    'CAMERA_INFO_TOPIC',
    'COMPRESSED_MSGTYPE',
    'COMPRESSED_TOPIC',
    'DEFAULT_START_NS',
    'DIGEST_KEY',
    'GROUND_TRUTH_TOPIC',
    'IMAGE_MSGTYPE',
    'IMAGE_MSGTYPES',
    'IMAGE_TOPIC',
    'MessageDigest',
    'STORAGES',
    'STORAGE_SUFFIXES',
    'bag_name',
    'bag_typestore',
    'camera_info_message',
    'ground_truth_from_message',
    'ground_truth_message',
    'image_message',
    'resolve_bag',
    'resolve_bag_output',
]


IMAGE_TOPIC = '/camera/image_raw'
COMPRESSED_TOPIC = '/camera/image_raw/compressed'
CAMERA_INFO_TOPIC = '/camera/camera_info'
GROUND_TRUTH_TOPIC = '/metavlm/ground_truth'
STORAGES = ('mcap', 'sqlite3')
# A storage file's suffix -> its storage plugin; such a file is a whole bag on its own.
STORAGE_SUFFIXES = {'.mcap': 'mcap', '.db3': 'sqlite3'}
# 2026-01-01T00:00:00Z: a fixed start keeps written bags byte-for-byte reproducible from a seed.
DEFAULT_START_NS = 1_767_225_600_000_000_000
# rosbag2 metadata version 8 is read by the rosbag2 of ROS 2 Jazzy and newer.
BAG_VERSION = 8

IMAGE_MSGTYPE = 'sensor_msgs/msg/Image'
COMPRESSED_MSGTYPE = 'sensor_msgs/msg/CompressedImage'
IMAGE_MSGTYPES = (IMAGE_MSGTYPE, COMPRESSED_MSGTYPE)
# metadata.yaml custom_data key: a digest of every message, which `verify_bag` recomputes (sqlite3
# storage has no checksums of its own; mcap has its chunk CRCs too).
DIGEST_KEY = 'metavlm_messages_sha256'


class MessageDigest:
    """A digest of a bag's messages, per topic in time order, independent of how topics interleave."""

    def __init__(self) -> None:
        self.topics: dict[str, Any] = {}

    def update(self, topic: str, timestamp: int, data: bytes | memoryview) -> None:
        digest = self.topics.get(topic)
        if digest is None:
            digest = self.topics[topic] = hashlib.sha256()
        digest.update(struct.pack('<qQ', int(timestamp), len(data)))
        digest.update(data)

    def hexdigest(self) -> str:
        lines = ''.join(f'{topic}\n{d.hexdigest()}\n' for topic, d in sorted(self.topics.items()))
        return hashlib.sha256(lines.encode()).hexdigest()


@lru_cache(maxsize=1)
def bag_typestore() -> Any:
    """The rosbags typestore used to write and read bags (ROS 2 Jazzy message definitions).

    Image, CompressedImage, CameraInfo and DiagnosticArray are identical from Humble to Kilted, so
    bags written with it replay on any of them.
    """
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def bag_name(path: str | Path) -> str:
    """The name frames of a bag are labelled with: the bag directory name, or a storage file's stem."""
    path = Path(path)
    return path.name if path.is_dir() else path.stem


def resolve_bag(path: str | Path) -> Path:
    """The bag a user's name refers to: `path` itself, or the bag directory an older `scenes` wrote.

    `metavlm scenes --out X.mcap` writes the file X.mcap; before, it wrote the directory X/ holding
    X/X.mcap and metadata.yaml. A name X.mcap (or X.db3) that does not exist, next to such a
    directory, names that directory, so the names of existing bags keep working.

    Raises:
        BagError: Nothing exists under the name, nor such a directory.
    """
    path = Path(path)
    if path.exists():
        return path
    legacy = path.with_suffix('')
    if (
        path.suffix.lower() in STORAGE_SUFFIXES
        and (legacy / 'metadata.yaml').is_file()
        and (legacy / path.name).is_file()
    ):
        return legacy
    raise BagError(f'{path}: no such bag')


def resolve_bag_output(out: str | Path, storage: str | None = None) -> tuple[Path, str]:
    """Decide the bag path and storage plugin for an output path given by a user.

    The name given is the name the bag gets: 'demo.mcap' is the single-file bag demo.mcap (mcap
    storage), 'demo.db3' the single-file bag demo.db3 (sqlite3); both hold their own metadata, as
    rosbag2 reads it (`ros2 bag play demo.mcap`). Any other path is a rosbag2 bag directory
    (metadata.yaml and one storage file named after the directory), with `storage` (default mcap).

    Returns:
        (bag path, storage plugin name).

    Raises:
        ParameterError: The storage is unknown or contradicts the file suffix.
    """
    out = Path(out)
    if storage is not None and storage not in STORAGES:
        raise ParameterError(f'unknown bag storage {storage!r}; choose one of {", ".join(STORAGES)}')
    suffix = out.suffix.lower()
    implied = STORAGE_SUFFIXES.get(suffix)
    if implied:
        if storage is not None and storage != implied:
            raise ParameterError(f'{out}: a {suffix} output is {implied} storage, not {storage}')
        return out, implied
    return out, storage or 'mcap'


def _stamp(ns: int) -> Any:
    types = bag_typestore().types
    return types['builtin_interfaces/msg/Time'](sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def _header(ns: int, frame_id: str) -> Any:
    return bag_typestore().types['std_msgs/msg/Header'](stamp=_stamp(ns), frame_id=frame_id)


def image_message(
    rgb: np.ndarray,
    stamp_ns: int,
    *,
    compressed: bool = False,
    frame_id: str = 'camera',
    quality: int = JPEG_QUALITY,
) -> Any:
    """An rgb8 sensor_msgs/Image, or a JPEG sensor_msgs/CompressedImage, of an RGB frame (common/codec.py)."""
    types = bag_typestore().types
    header = _header(stamp_ns, frame_id)
    if compressed:
        fmt, data = encode_compressed(rgb, 'jpeg', quality)
        return types[COMPRESSED_MSGTYPE](header=header, format=fmt, data=np.frombuffer(data, np.uint8))
    raw = encode_raw(rgb)
    return types[IMAGE_MSGTYPE](
        header=header,
        height=raw.height,
        width=raw.width,
        encoding=raw.encoding,
        is_bigendian=raw.is_bigendian,
        step=raw.step,
        data=np.frombuffer(raw.data, np.uint8),
    )


def camera_info_message(
    width: int, height: int, stamp_ns: int, *, frame_id: str = 'camera', focal: float | None = None
) -> Any:
    """A pinhole sensor_msgs/CameraInfo: no distortion, focal length 0.72 * width (about 70 degrees).

    The focal length matches the scene generator's camera.
    """
    types = bag_typestore().types
    f = float(focal if focal is not None else 0.72 * width)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    return types['sensor_msgs/msg/CameraInfo'](
        header=_header(stamp_ns, frame_id),
        height=height,
        width=width,
        distortion_model='plumb_bob',
        d=np.zeros(5, np.float64),
        k=np.array([f, 0, cx, 0, f, cy, 0, 0, 1], np.float64),
        r=np.eye(3).reshape(-1),
        p=np.array([f, 0, cx, 0, 0, f, cy, 0, 0, 0, 1, 0], np.float64),
        binning_x=0,
        binning_y=0,
        roi=types['sensor_msgs/msg/RegionOfInterest'](
            x_offset=0, y_offset=0, height=0, width=0, do_rectify=False
        ),
    )


def ground_truth_message(gt: GroundTruth, stamp_ns: int, *, frame_id: str = 'camera') -> Any:
    """The ground truth of a frame as a diagnostic_msgs/DiagnosticArray (layout: docs/footage.md).

    One status per class, level OK, name 'metavlm/ground_truth/<class>', hardware_id the scene
    environment, message the number of visible objects; values: 'count', one per kind of the class,
    'frame_index', and 'boxes' (a JSON list of the class's boxes, as in GroundTruth.boxes).
    """
    types = bag_typestore().types
    kv = types['diagnostic_msgs/msg/KeyValue']
    status_t = types['diagnostic_msgs/msg/DiagnosticStatus']
    statuses = []
    for cls in CLASSES:
        boxes = [b for b in gt.boxes if b['class'] == cls]
        values = [kv(key='count', value=str(gt.counts.get(cls, 0)))]
        values += [kv(key=kind, value=str(gt.kind_counts.get(kind, 0))) for kind in KINDS[cls]]
        values.append(kv(key='frame_index', value=str(gt.frame_index)))
        values.append(kv(key='boxes', value=json.dumps(boxes, separators=(',', ':'))))
        statuses.append(
            status_t(
                level=0,
                name=f'metavlm/ground_truth/{cls}',
                message=str(gt.counts.get(cls, 0)),
                hardware_id=gt.environment,
                values=values,
            )
        )
    return types['diagnostic_msgs/msg/DiagnosticArray'](header=_header(stamp_ns, frame_id), status=statuses)


def ground_truth_from_message(msg: Any) -> GroundTruth:
    """The ground truth a `ground_truth_message` carries (its inverse)."""
    counts: dict[str, int] = {}
    kind_counts: dict[str, int] = {}
    boxes: list[dict] = []
    frame_index, environment = 0, ''
    for status in msg.status:
        cls = status.name.rsplit('/', 1)[-1]
        environment = status.hardware_id
        for item in status.values:
            if item.key == 'count':
                counts[cls] = int(item.value)
            elif item.key == 'boxes':
                boxes.extend(json.loads(item.value))
            elif item.key == 'frame_index':
                frame_index = int(item.value)
            else:
                kind_counts[item.key] = int(item.value)
    boxes.sort(key=lambda b: b.get('id', 0))
    return GroundTruth(counts, kind_counts, boxes, frame_index, environment)
