"""Writing scene footage into a bag (ROS 2: mcap, sqlite3, checksummed; ROS 1), reproducible from a seed."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.codec import (
    JPEG_QUALITY,
)
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.scratch import remove_stale, scratch_path
from metavlm_ros.footage.bag_format import (
    BAG_VERSION,
    CAMERA_INFO_TOPIC,
    COMPRESSED_MSGTYPE,
    COMPRESSED_TOPIC,
    DEFAULT_START_NS,
    DIGEST_KEY,
    GROUND_TRUTH_TOPIC,
    IMAGE_MSGTYPE,
    IMAGE_TOPIC,
    STORAGE_SUFFIXES,
    STORAGES,
    MessageDigest,
    bag_typestore,
    camera_info_message,
    ground_truth_message,
    image_message,
)
from metavlm_ros.footage.bag_reader import COMPRESSED_DEPTH_FORMAT, RANGES_TOPIC, compressed_depth_data
from metavlm_ros.footage.truth import GroundTruth

__all__ = [
    'write_bag',
]


# The first bytes of each storage's files (what an existing output must start with to be replaced).
_MAGIC = {'mcap': b'\x89MCAP0\r\n', 'sqlite3': b'SQLite format 3\x00'}


def _is_storage_file(path: Path, storage: str) -> bool:
    with open(path, 'rb') as handle:
        return handle.read(len(_MAGIC[storage])) == _MAGIC[storage]


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


#: The suffix of a ROS 1 bag output: written as `rosbag record` on Noetic writes it.
ROS1_SUFFIX = '.bag'
_CAMERA_INFO_TYPE = 'sensor_msgs/msg/CameraInfo'
# What a bag is written from, per frame: its pixels, its ground truth, and its range map where it has one.
FrameItem = tuple[np.ndarray, GroundTruth | None] | tuple[np.ndarray, GroundTruth | None, np.ndarray]
_GROUND_TRUTH_TYPE = 'diagnostic_msgs/msg/DiagnosticArray'


def _ranges_message(index: int, ranges: np.ndarray, rgb: np.ndarray, image: Any) -> Any:
    """Frame `index`'s range map as image_transport's compressedDepth form of a 16UC1 depth image
    (bag_reader.py), registered to its camera image: the image message's header, its size."""
    if not isinstance(ranges, np.ndarray) or ranges.shape != rgb.shape[:2]:
        raise InputError(
            f"frame {index}: a range map of shape {np.shape(ranges)}, not its frame's {rgb.shape[:2]}"
        )
    data = np.frombuffer(compressed_depth_data(ranges), np.uint8)
    return bag_typestore().types[COMPRESSED_MSGTYPE](
        header=image.header, format=COMPRESSED_DEPTH_FORMAT, data=data
    )


def _frame_messages(
    frames: Iterable[FrameItem],
    *,
    fps: float,
    compressed: bool,
    start_ns: int,
    frame_id: str,
    quality: int,
) -> Iterator[tuple[str, str, int, Any]]:
    """The messages of each frame, in order: (topic, msgtype, stamp, ROS 2 message), for any bag."""
    image_topic, image_type = (
        (COMPRESSED_TOPIC, COMPRESSED_MSGTYPE) if compressed else (IMAGE_TOPIC, IMAGE_MSGTYPE)
    )
    for index, (rgb, gt, *ranges) in enumerate(frames):
        if not (
            isinstance(rgb, np.ndarray) and rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
        ):
            raise InputError(f'frame {index}: expected an RGB uint8 (H, W, 3) array')
        stamp = start_ns + round(index * 1e9 / fps)
        msg = image_message(rgb, stamp, compressed=compressed, frame_id=frame_id, quality=quality)
        yield image_topic, image_type, stamp, msg
        info = camera_info_message(rgb.shape[1], rgb.shape[0], stamp, frame_id=frame_id)
        yield CAMERA_INFO_TOPIC, _CAMERA_INFO_TYPE, stamp, info
        if gt is not None:
            yield (
                GROUND_TRUTH_TOPIC,
                _GROUND_TRUTH_TYPE,
                stamp,
                ground_truth_message(gt, stamp, frame_id=frame_id),
            )
        if ranges:
            yield RANGES_TOPIC, COMPRESSED_MSGTYPE, stamp, _ranges_message(index, ranges[0], rgb, msg)


def _topics(compressed: bool, ranges: bool) -> list[tuple[str, str]]:
    image = (COMPRESSED_TOPIC, COMPRESSED_MSGTYPE) if compressed else (IMAGE_TOPIC, IMAGE_MSGTYPE)
    topics = [image, (CAMERA_INFO_TOPIC, _CAMERA_INFO_TYPE), (GROUND_TRUTH_TOPIC, _GROUND_TRUTH_TYPE)]
    return topics + [(RANGES_TOPIC, COMPRESSED_MSGTYPE)] if ranges else topics


# A bag's topics and the messages of its frames: called once the output may be written, since the first
# frame is made to see whether the frames have range maps.
_Plan = Callable[[], tuple[list[tuple[str, str]], Iterator[tuple[str, str, int, Any]]]]


def _plan(frames: Iterable[FrameItem], compressed: bool, **options: Any) -> _Plan:
    def plan() -> tuple[list[tuple[str, str]], Iterator[tuple[str, str, int, Any]]]:
        items = iter(frames)
        first = next(items, None)
        ranged = first is not None and len(first) > 2
        items = itertools.chain([] if first is None else [first], items)
        return _topics(compressed, ranged), _frame_messages(items, compressed=compressed, **options)

    return plan


def write_bag(
    bag_dir: str | Path,
    frames: Iterable[FrameItem],
    *,
    fps: float,
    storage: str = 'mcap',
    compressed: bool = False,
    overwrite: bool = False,
    start_ns: int = DEFAULT_START_NS,
    frame_id: str = 'camera',
    quality: int = JPEG_QUALITY,
) -> Path:
    """Write frames (and their ground truth) as a ROS 2 bag (a directory, or one .mcap / .db3 file),
    or as a ROS 1 bag (a path ending in .bag).

    Topics: /camera/image_raw (sensor_msgs/Image, rgb8) or, when `compressed`,
    /camera/image_raw/compressed (sensor_msgs/CompressedImage, JPEG); /camera/camera_info
    (sensor_msgs/CameraInfo); /metavlm/ground_truth (diagnostic_msgs/DiagnosticArray) for frames
    with ground truth; /camera/depth/image_raw/compressedDepth (sensor_msgs/CompressedImage,
    '16UC1; compressedDepth png': footage/ranges.py) for frames with a range map. Message i is
    stamped start_ns + i / fps seconds, in the header and the bag.
    A ROS 1 bag holds the same messages in their ROS 1 (Noetic) definitions. The bag appears at
    `bag_dir` only when complete; an interrupted write leaves the previous bag intact, and its
    scratch copy is removed by the next write of the same name.

    Args:
        bag_dir: The bag directory to create, a path ending in .mcap / .db3 for a single-file bag
            of that storage (see `resolve_bag_output`), or in .bag for a ROS 1 bag.
        frames: (rgb, ground truth or None) pairs, or (rgb, ground truth or None, range map) triples
            (float32 metres, the frame's size, inf = no surface), consumed one at a time; the first
            says which (a bag holds the range topic when its frames have maps).
        fps: Frame rate of the stamps.
        storage: 'mcap' or 'sqlite3' (ROS 2 bags).
        compressed: Write JPEG CompressedImage instead of raw Image.
        overwrite: Replace an existing bag at `bag_dir`.
        start_ns: Stamp of the first frame.
        frame_id: Header frame id.
        quality: JPEG quality when compressed.

    Returns:
        The bag (directory or file).

    Raises:
        InputError: The output exists (without overwrite), a frame is not RGB uint8, or a range map
            is not of its frame's size.
        ParameterError: Unknown storage, a storage that contradicts the suffix, or invalid fps.
    """
    from rosbags.rosbag2 import StoragePlugin

    bag_dir = Path(bag_dir)
    if storage not in STORAGES:
        raise ParameterError(f'unknown bag storage {storage!r}; choose one of {", ".join(STORAGES)}')
    if not fps or fps <= 0:
        raise ParameterError(f'fps must be > 0, got {fps}')
    plan = _plan(frames, compressed, fps=fps, start_ns=start_ns, frame_id=frame_id, quality=quality)
    if bag_dir.suffix.lower() == ROS1_SUFFIX:
        return _write_ros1(bag_dir, plan, overwrite)
    implied = STORAGE_SUFFIXES.get(bag_dir.suffix.lower())
    if implied is not None and implied != storage:
        raise ParameterError(f'{bag_dir}: a {bag_dir.suffix} bag is {implied} storage, not {storage}')
    typestore = bag_typestore()
    plugin = StoragePlugin.MCAP if storage == 'mcap' else StoragePlugin.SQLITE3
    with _staging(bag_dir, storage, overwrite) as staged:
        topics, messages = plan()
        digest = MessageDigest()
        with _checksummed_writer()(staged, version=BAG_VERSION, storage_plugin=plugin) as writer:
            qos = _offered_qos()
            connections = {
                topic: writer.add_connection(topic, msgtype, typestore=typestore, offered_qos_profiles=qos)
                for topic, msgtype in topics
            }
            for topic, msgtype, stamp, msg in messages:
                data = typestore.serialize_cdr(msg, msgtype)
                digest.update(topic, stamp, data)
                writer.write(connections[topic], stamp, data)
            writer.set_custom_data(DIGEST_KEY, digest.hexdigest())
    return bag_dir


_ROS1_MAGIC = b'#ROSBAG V2.0\n'


def _write_ros1(bag: Path, plan: _Plan, overwrite: bool) -> Path:
    """The messages in a ROS 1 bag at `bag`, migrated to their Noetic definitions, written aside first."""
    from rosbags.convert.converter import migrate_message
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    if bag.exists() or bag.is_symlink():
        if not overwrite:
            raise InputError(f'{bag}: already exists (use --overwrite to replace it)')
        with open(bag, 'rb') if bag.is_file() else contextlib.nullcontext(None) as handle:
            if handle is None or handle.read(len(_ROS1_MAGIC)) != _ROS1_MAGIC:
                raise InputError(f'{bag}: exists and is not a ROS 1 bag; refusing to replace it')
    bag.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(bag.parent, bag.name)
    tmp = scratch_path(bag, ROS1_SUFFIX)
    topics, messages = plan()
    source, noetic = bag_typestore(), get_typestore(Stores.ROS1_NOETIC)
    cache: dict[str, object] = {}
    try:
        with Writer(tmp) as writer:
            connections = {
                topic: writer.add_connection(topic, msgtype, typestore=noetic, callerid='/metavlm_scenes')
                for topic, msgtype in topics
            }
            for topic, msgtype, stamp, msg in messages:
                ros1 = migrate_message(source, noetic, msgtype, msgtype, cache, msg)
                writer.write(connections[topic], stamp, noetic.serialize_ros1(ros1, msgtype))
        os.replace(tmp, bag)
    finally:
        tmp.unlink(missing_ok=True)
    return bag
