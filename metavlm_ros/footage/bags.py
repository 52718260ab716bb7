"""ROS 2 bags (mcap, sqlite3) without a ROS installation: write scene footage, stream frames and messages."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.codec import (
    JPEG_QUALITY,
    decode_compressed,
    decode_raw,
    encode_compressed,
    encode_raw,
)
from metavlm_ros.common.errors import BagError, InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.scratch import remove_stale, scratch_path
from metavlm_ros.footage.truth import KINDS, GroundTruth
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'CAMERA_INFO_TOPIC',
    'COMPRESSED_TOPIC',
    'DEFAULT_START_NS',
    'GROUND_TRUTH_TOPIC',
    'IMAGE_TOPIC',
    'STORAGES',
    'bag_name',
    'bag_typestore',
    'camera_info_message',
    'decode_image',
    'ground_truth_message',
    'image_message',
    'iter_bag_frames',
    'iter_bag_messages',
    'list_image_topics',
    'read_ground_truth',
    'resolve_bag',
    'resolve_bag_output',
    'verify_bag',
    'write_bag',
]

IMAGE_TOPIC = '/camera/image_raw'
COMPRESSED_TOPIC = '/camera/image_raw/compressed'
CAMERA_INFO_TOPIC = '/camera/camera_info'
GROUND_TRUTH_TOPIC = '/metavlm/ground_truth'
STORAGES = ('mcap', 'sqlite3')
# A storage file's suffix -> its storage plugin; such a file is a whole bag on its own.
STORAGE_SUFFIXES = {'.mcap': 'mcap', '.db3': 'sqlite3'}
# The first bytes of each storage's files (what an existing output must start with to be replaced).
_MAGIC = {'mcap': b'\x89MCAP0\r\n', 'sqlite3': b'SQLite format 3\x00'}
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


def _offered_qos() -> list[Any]:
    # What a default rclpy publisher offers (reliable, volatile, keep last 10, no deadline): ros2 bag
    # play republishes with it, so default subscribers and sensor-data subscribers both connect.
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    infinite = QosTime(sec=2147483647, nsec=4294967295)
    return [
        Qos(
            history=QosHistory.KEEP_LAST,
            depth=10,
            reliability=QosReliability.RELIABLE,
            durability=QosDurability.VOLATILE,
            deadline=infinite,
            lifespan=infinite,
            liveliness=QosLiveliness.AUTOMATIC,
            liveliness_lease_duration=infinite,
            avoid_ros_namespace_conventions=False,
        )
    ]


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


def _ground_truth_from_message(msg: Any) -> GroundTruth:
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


def _is_storage_file(path: Path, storage: str) -> bool:
    with open(path, 'rb') as handle:
        return handle.read(len(_MAGIC[storage])) == _MAGIC[storage]


@lru_cache(maxsize=1)
def _checksummed_writer() -> Any:
    """rosbags' Writer, with mcap chunks that carry the CRC of their records.

    rosbags writes chunk CRC 0 ('not computed'), so readers could not tell a damaged chunk; with
    the CRC set, rosbags, the mcap library and ros2 bag all report a mismatch.
    """
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.rosbag2.storage_mcap import McapWriter

    class ChecksummedMcapWriter(McapWriter):
        def close_chunk(self) -> None:
            crc = zlib.crc32(self.chunk.bio.getvalue())
            start = self.bio.tell()
            super().close_chunk()
            end = self.bio.tell()
            # Chunk record: opcode (1), length (8), start and end time, records size (8 each), CRC (4).
            self.bio.seek(start + 9 + 24)
            self.bio.write(struct.pack('<I', crc))
            self.bio.seek(end)

    class ChecksummedWriter(Writer):
        STORAGE_PLUGINS = {**Writer.STORAGE_PLUGINS, StoragePlugin.MCAP: ChecksummedMcapWriter}

    return ChecksummedWriter


class _MessageDigest:
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


@contextmanager
def _staging(bag: Path, storage: str, overwrite: bool) -> Iterator[Path]:
    """A fresh directory for rosbags' Writer whose bag replaces `bag` only once complete.

    `bag` is a bag directory, or a single storage file (.mcap / .db3), which is taken out of the
    written directory (its metadata is inside it). The bag is written next to its final place, under
    a scratch name; scratch bags of killed runs for the same name are removed first.
    """
    single = bag.suffix.lower() in STORAGE_SUFFIXES
    if bag.exists() or bag.is_symlink():
        if not overwrite:
            raise InputError(f'{bag}: already exists (use --overwrite to replace it)')
        if single:
            if not bag.is_file() or not _is_storage_file(bag, storage):
                raise InputError(f'{bag}: exists and is not a {storage} bag; refusing to replace it')
        elif not bag.is_dir():
            raise InputError(f'{bag}: exists and is not a directory; refusing to replace it')
        elif any(bag.iterdir()) and not (bag / 'metadata.yaml').is_file():
            raise InputError(f'{bag}: exists and is not a bag; refusing to replace it')
    bag.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(bag.parent, bag.name)
    tmp = scratch_path(bag)
    tmp.mkdir()
    try:
        # rosbags names the storage file after the bag directory, so the staged bag has the final name.
        staged = tmp / (bag.stem if single else bag.name)
        yield staged
        if single:
            os.replace(staged / f'{staged.name}{".mcap" if storage == "mcap" else ".db3"}', bag)
        else:
            if bag.exists():
                shutil.rmtree(bag)
            staged.rename(bag)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bag(
    bag_dir: str | Path,
    frames: Iterable[tuple[np.ndarray, GroundTruth | None]],
    *,
    fps: float,
    storage: str = 'mcap',
    compressed: bool = False,
    overwrite: bool = False,
    start_ns: int = DEFAULT_START_NS,
    frame_id: str = 'camera',
    quality: int = JPEG_QUALITY,
) -> Path:
    """Write frames (and their ground truth) as a ROS 2 bag: a directory, or one .mcap / .db3 file.

    Topics: /camera/image_raw (sensor_msgs/Image, rgb8) or, when `compressed`,
    /camera/image_raw/compressed (sensor_msgs/CompressedImage, JPEG); /camera/camera_info
    (sensor_msgs/CameraInfo); /metavlm/ground_truth (diagnostic_msgs/DiagnosticArray) for frames
    with ground truth. Message i is stamped start_ns + i / fps seconds, in the header and the bag.
    The bag appears at `bag_dir` only when complete; an interrupted write leaves the previous bag
    intact, and its scratch copy is removed by the next write of the same name.

    Args:
        bag_dir: The bag directory to create, or a path ending in .mcap / .db3 for a single-file bag
            of that storage (see `resolve_bag_output`).
        frames: (rgb, ground truth or None) pairs, consumed one at a time.
        fps: Frame rate of the stamps.
        storage: 'mcap' or 'sqlite3'.
        compressed: Write JPEG CompressedImage instead of raw Image.
        overwrite: Replace an existing bag at `bag_dir`.
        start_ns: Stamp of the first frame.
        frame_id: Header frame id.
        quality: JPEG quality when compressed.

    Returns:
        The bag (directory or file).

    Raises:
        InputError: The output exists (without overwrite) or a frame is not RGB uint8.
        ParameterError: Unknown storage, a storage that contradicts the suffix, or invalid fps.
    """
    from rosbags.rosbag2 import StoragePlugin

    bag_dir = Path(bag_dir)
    if storage not in STORAGES:
        raise ParameterError(f'unknown bag storage {storage!r}; choose one of {", ".join(STORAGES)}')
    if not fps or fps <= 0:
        raise ParameterError(f'fps must be > 0, got {fps}')
    implied = STORAGE_SUFFIXES.get(bag_dir.suffix.lower())
    if implied is not None and implied != storage:
        raise ParameterError(f'{bag_dir}: a {bag_dir.suffix} bag is {implied} storage, not {storage}')
    typestore = bag_typestore()
    plugin = StoragePlugin.MCAP if storage == 'mcap' else StoragePlugin.SQLITE3
    image_topic, image_type = (
        (COMPRESSED_TOPIC, COMPRESSED_MSGTYPE) if compressed else (IMAGE_TOPIC, IMAGE_MSGTYPE)
    )
    with _staging(bag_dir, storage, overwrite) as staged:
        digest = _MessageDigest()
        with _checksummed_writer()(staged, version=BAG_VERSION, storage_plugin=plugin) as writer:

            def put(connection: Any, stamp: int, data: Any) -> None:
                digest.update(connection.topic, stamp, data)
                writer.write(connection, stamp, data)

            qos = _offered_qos()
            image_conn = writer.add_connection(
                image_topic, image_type, typestore=typestore, offered_qos_profiles=qos
            )
            info_type, gt_type = 'sensor_msgs/msg/CameraInfo', 'diagnostic_msgs/msg/DiagnosticArray'
            info_conn = writer.add_connection(
                CAMERA_INFO_TOPIC, info_type, typestore=typestore, offered_qos_profiles=qos
            )
            gt_conn = writer.add_connection(
                GROUND_TRUTH_TOPIC, gt_type, typestore=typestore, offered_qos_profiles=qos
            )
            for index, (rgb, gt) in enumerate(frames):
                if not (
                    isinstance(rgb, np.ndarray)
                    and rgb.dtype == np.uint8
                    and rgb.ndim == 3
                    and rgb.shape[2] == 3
                ):
                    raise InputError(f'frame {index}: expected an RGB uint8 (H, W, 3) array')
                stamp = start_ns + round(index * 1e9 / fps)
                msg = image_message(rgb, stamp, compressed=compressed, frame_id=frame_id, quality=quality)
                put(image_conn, stamp, typestore.serialize_cdr(msg, image_type))
                info = camera_info_message(rgb.shape[1], rgb.shape[0], stamp, frame_id=frame_id)
                put(info_conn, stamp, typestore.serialize_cdr(info, 'sensor_msgs/msg/CameraInfo'))
                if gt is not None:
                    diag = ground_truth_message(gt, stamp, frame_id=frame_id)
                    put(gt_conn, stamp, typestore.serialize_cdr(diag, 'diagnostic_msgs/msg/DiagnosticArray'))
            writer.set_custom_data(DIGEST_KEY, digest.hexdigest())
    return bag_dir


# ---------------------------------------------------------------------------------------------
# Reading


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def open_bag(path: str | Path) -> Iterator[Any]:
    """The one bag opener: a rosbag2 bag (directory, .mcap or .db3) read-only, as a rosbags Reader.

    Raises:
        BagError: no such bag, not a rosbag2 bag (a ROS 1 bag says how to convert it), or unreadable.
    """
    from rosbags.rosbag2 import Reader

    path = resolve_bag(path)
    if path.is_file() and path.suffix == '.bag':
        raise BagError(f'{path} is a ROS 1 bag; convert it first (rosbags-convert --src {path.name})')
    if path.is_dir() and not (path / 'metadata.yaml').is_file():
        # A directory holding one storage file but no metadata (copied by hand): read the file.
        files = sorted(p for p in path.iterdir() if p.suffix in ('.mcap', '.db3'))
        if len(files) != 1:
            raise BagError(f'{path}: not a bag (no metadata.yaml)')
        path = files[0]
    if path.is_file() and path.suffix not in ('.mcap', '.db3'):
        raise BagError(
            f'{path}: unknown bag storage {path.suffix!r} (expected .mcap or .db3 or a bag directory)'
        )
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # rosbags raises several types (ReaderError, KeyError, sqlite3, mcap)
        raise BagError(f'{path}: unreadable bag ({_one_line(exc)})') from None
    try:
        yield reader
    finally:
        reader.close()


def verify_bag(path: str | Path) -> None:
    """Read every message of a bag to check it is whole: mcap chunk CRCs, and the message digest of
    bags written by `write_bag` (the only check sqlite3 storage has).

    Raises:
        BagError: The bag is unreadable, truncated, or its content does not match its checksums.
    """
    with open_bag(path) as reader:
        digest = _MessageDigest()
        messages = reader.messages()
        while True:
            try:
                conn, timestamp, raw = next(messages)
            except StopIteration:
                break
            except Exception as exc:  # rosbags raises several types for damaged storage
                raise BagError(f'{path}: damaged bag ({_one_line(exc)})') from None
            digest.update(conn.topic, timestamp, raw)
        expected = _stored_digest(reader, Path(path))
        if expected and expected != digest.hexdigest():
            raise BagError(f'{path}: damaged bag (its messages do not match the digest written with them)')


def _stored_digest(reader: Any, path: Path) -> str | None:
    """The message digest `write_bag` stored: in metadata.yaml, or inside a single-file sqlite3 bag."""
    custom = getattr(getattr(reader.storage, 'metadata', None), 'custom', None) or {}
    if DIGEST_KEY in custom:
        return custom[DIGEST_KEY]
    if not (path.is_file() and path.suffix.lower() == '.db3'):
        return None  # a single mcap file: its chunk CRCs are the check
    import sqlite3

    import yaml

    try:
        with contextlib.closing(sqlite3.connect(f'{path.absolute().as_uri()}?immutable=1', uri=True)) as db:
            row = db.execute('SELECT metadata FROM metadata ORDER BY id DESC LIMIT 1').fetchone()
        info = yaml.safe_load(row[0]) if row else None
        return ((info or {}).get('custom_data') or {}).get(DIGEST_KEY)
    except (sqlite3.Error, yaml.YAMLError, AttributeError, TypeError):
        return None  # bags recorded before rosbag2 stored its metadata inside the database


def _image_connections(reader: Any) -> dict[str, Any]:
    conns: dict[str, list] = {}
    for conn in reader.connections:
        if conn.msgtype in IMAGE_MSGTYPES:
            conns.setdefault(conn.topic, []).append(conn)
    return conns


def list_image_topics(path: str | Path) -> list[str]:
    """The image topics (sensor_msgs/Image or CompressedImage) of a bag, sorted.

    Raises:
        BagError: The bag cannot be read.
    """
    with open_bag(path) as reader:
        return sorted(_image_connections(reader))


def decode_image(msg: Any, msgtype: str | None = None) -> np.ndarray:
    """Decode a sensor_msgs/Image or CompressedImage message (rosbags object) to RGB uint8.

    The nodes decode with the same codec (common/codec.py), so a bag gives the same pixels offline
    and through them. Supported: Image encodings RAW_ENCODINGS, CompressedImage JPEG and PNG.

    Raises:
        InputError: Unsupported encoding or format, or data that does not decode.
    """
    if hasattr(msg, 'format'):
        return decode_compressed(msg.format, msg.data)
    return decode_raw(msg.encoding, msg.width, msg.height, msg.step, msg.is_bigendian, msg.data)


def _header_stamp(msg: Any) -> int:
    stamp = msg.header.stamp
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _raw_messages(messages: Iterator[Any], path: Path) -> Iterator[tuple[Any, int, bytes]]:
    """A bag reader's (connection, timestamp, raw) items; a damaged bag is a BagError, not rosbags' own."""
    while True:
        try:
            item = next(messages)
        except StopIteration:
            return
        except Exception as exc:
            raise BagError(f'{path}: corrupt or truncated bag ({_one_line(exc)})') from None
        yield item


def _deserialise(typestore: Any, conn: Any, timestamp: int, raw: bytes, path: Path) -> Any:
    """One message from its CDR bytes; a damaged one is a BagError naming its type and time."""
    try:
        return typestore.deserialize_cdr(raw, conn.msgtype)
    except Exception as exc:
        raise BagError(f'{path}: corrupt {conn.msgtype} message at {timestamp} ({_one_line(exc)})') from None


def iter_bag_frames(
    path: str | Path,
    topic: str | None = None,
    *,
    every: int = 1,
    start: float | None = None,
    end: float | None = None,
    max_frames: int | None = None,
) -> Iterator[Frame]:
    """Stream the frames of an image topic of a bag, one message at a time, read-only.

    Args:
        path: A bag directory, or an .mcap / .db3 storage file.
        topic: The image topic; default the bag's only image topic.
        every: Keep every n-th message of the selected time window.
        start: Skip messages earlier than this many seconds after the bag's first message.
        end: Stop after messages later than this many seconds after the bag's first message.
        max_frames: Stop after this many frames.

    Yields:
        Frame with id '<bag name>@<stamp_ns>' and stamp_ns the header stamp (the bag time when
        the header stamp is zero).

    Raises:
        BagError: Unreadable, truncated or corrupt bag; no image topic; unknown topic; several image
            topics and none chosen.
        InputError: An image in an unsupported encoding.
    """
    if every < 1:
        raise ParameterError(f'every must be an integer >= 1, got {every!r}')
    name = bag_name(path)
    with open_bag(path) as reader:
        conns = _image_connections(reader)
        if not conns:
            raise BagError(f'{path}: no image topics (sensor_msgs/Image or CompressedImage)')
        if topic is None:
            if len(conns) > 1:
                raise BagError(
                    f'{path}: several image topics, choose one with --topic: {", ".join(sorted(conns))}'
                )
            topic = next(iter(conns))
        if topic not in conns:
            raise BagError(f'{path}: no image topic {topic!r}; image topics: {", ".join(sorted(conns))}')
        t0 = reader.start_time
        kwargs: dict[str, int] = {}
        if start is not None:
            kwargs['start'] = t0 + round(start * 1e9)
        if end is not None:
            kwargs['stop'] = t0 + round(end * 1e9) + 1  # rosbags' stop is exclusive, our end inclusive
        typestore = bag_typestore()
        yielded = 0
        position = 0
        if max_frames is not None and max_frames <= 0:
            return
        messages = reader.messages(connections=conns[topic], **kwargs)
        for conn, timestamp, raw in _raw_messages(messages, path):
            keep = position % every == 0
            position += 1
            if not keep:
                continue
            msg = _deserialise(typestore, conn, timestamp, raw, path)
            try:
                rgb = decode_image(msg)
            except InputError as exc:
                raise InputError(f'{path}: {topic} at {timestamp}: {exc}') from None
            stamp = _header_stamp(msg) or int(timestamp)
            yield Frame(id=f'{name}@{stamp}', rgb=rgb, stamp_ns=stamp)
            yielded += 1
            if max_frames is not None and yielded >= max_frames:
                return  # before the next message is read: what follows may be damaged


def iter_bag_messages(
    path: str | Path, topics: Iterable[str] | None = None
) -> Iterator[tuple[str, str, int, Any]]:
    """Stream every message of a bag (or of `topics`) in time order, deserialised, read-only.

    Message types unknown to `bag_typestore()` are registered from the definitions stored in the bag.

    Yields:
        (topic, msgtype, timestamp_ns, rosbags message object).

    Raises:
        BagError: Unreadable, truncated or corrupt bag, or a requested topic missing.
    """
    from rosbags.typesys import get_types_from_msg

    typestore = bag_typestore()
    with open_bag(path) as reader:
        conns = reader.connections
        if topics is not None:
            wanted = set(topics)
            missing = wanted - {c.topic for c in conns}
            if missing:
                present = ', '.join(sorted({c.topic for c in conns}))
                raise BagError(f'{path}: no topic {", ".join(sorted(missing))}; topics: {present}')
            conns = [c for c in conns if c.topic in wanted]
        known = dict(typestore.fielddefs)
        extra: dict = {}
        for conn in conns:
            if conn.msgtype not in known and conn.msgtype not in extra and conn.msgdef.data:
                try:
                    extra.update(get_types_from_msg(conn.msgdef.data, conn.msgtype))
                except Exception as exc:
                    raise BagError(
                        f'{path}: unreadable definition of {conn.msgtype} ({_one_line(exc)})'
                    ) from None
        if extra:
            # A private copy: registering a bag's own types must not change the shared typestore.
            from rosbags.typesys import Stores, get_typestore

            typestore = get_typestore(Stores.ROS2_JAZZY)
            typestore.register(extra)
        messages = reader.messages(connections=conns)
        for conn, timestamp, raw in _raw_messages(messages, path):
            msg = _deserialise(typestore, conn, timestamp, raw, path)
            yield conn.topic, conn.msgtype, int(timestamp), msg


def read_ground_truth(path: str | Path) -> list[tuple[int, GroundTruth]]:
    """The ground truth stored in a bag written by `write_bag`: (header stamp ns, GroundTruth) in order.

    Raises:
        BagError: The bag cannot be read or has no /metavlm/ground_truth topic.
    """
    out = []
    for _topic, _type, _t, msg in iter_bag_messages(path, [GROUND_TRUTH_TOPIC]):
        out.append((_header_stamp(msg), _ground_truth_from_message(msg)))
    return out
