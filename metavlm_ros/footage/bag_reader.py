"""Reading bags (ROS 2: mcap, sqlite3; ROS 1: .bag) without a ROS installation: verified, streamed."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.codec import (
    decode_compressed,
    decode_raw,
)
from metavlm_ros.common.errors import BagError, InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.range_maps import encode_ranges_png
from metavlm_ros.footage.bag_format import (
    DIGEST_KEY,
    GROUND_TRUTH_TOPIC,
    IMAGE_MSGTYPES,
    MessageDigest,
    bag_name,
    bag_typestore,
    ground_truth_from_message,
    resolve_bag,
)
from metavlm_ros.footage.truth import GroundTruth

__all__ = [
    'BAG_FILE_SUFFIXES',
    'COMPRESSED_DEPTH_FORMAT',
    'DEPTH_TRANSPORT',
    'RANGES_TOPIC',
    'cdr_bytes',
    'compressed_depth_data',
    'compressed_depth_png',
    'decode_image',
    'iter_bag_frames',
    'iter_bag_messages',
    'list_image_topics',
    'open_bag',
    'read_ground_truth',
    'read_range_pngs',
    'verify_bag',
]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


#: What a bag file may end in: rosbag2 storage files, and ROS 1 bags.
BAG_FILE_SUFFIXES = ('.mcap', '.db3', '.bag')

# -- range maps in bags: what `metavlm scenes` writes (bag_writer.py) and `footage.ranges` reads ------

#: The image_transport transport that carries depth images as PNG (compressed_depth_image_transport):
#: a topic named .../compressedDepth holds depth, never a camera's frames.
DEPTH_TRANSPORT = 'compressedDepth'
#: The topic of a bag's range maps (`metavlm scenes` bags), as a ROS camera driver names its depth
#: image's compressedDepth transport: /camera/depth/image_raw, registered to /camera/image_raw (the
#: same size and frame_id, each map stamped with its frame's header stamp).
RANGES_TOPIC = f'/camera/depth/image_raw/{DEPTH_TRANSPORT}'
#: sensor_msgs/CompressedImage.format of a 16-bit depth image of millimetres in that transport.
COMPRESSED_DEPTH_FORMAT = f'16UC1; {DEPTH_TRANSPORT} png'
# compressed_depth_image_transport's ConfigHeader (compression_common.h, written before the PNG by
# encodeCompressedDepthImage in codec.cpp): the enum compressionFormat as int32 (INV_DEPTH = 0, the
# only value) and float depthParam[2], the inverse-depth quantisation of 32FC1 images, left 0 for
# 16UC1 (value-initialised), whose decoder skips the 12 bytes and reads the PNG as it is. Copied
# with memcpy in the host's order: little-endian on every platform ROS ships for.
_CONFIG_HEADER = struct.Struct('<iff')
_INV_DEPTH = 0


def compressed_depth_data(ranges: np.ndarray) -> bytes:
    """A range map as the data of a compressedDepth CompressedImage (format COMPRESSED_DEPTH_FORMAT):
    the 12-byte ConfigHeader (INV_DEPTH, quantisation 0 0), then the 16-bit PNG of millimetres that
    `footage.ranges.write_ranges_png` writes (0 = no surface): the layout encodeCompressedDepthImage
    gives a 16UC1 image (without its publisher's cut of ranges beyond `depth_max`, 10 m by default).

    Raises:
        InputError: The map is not 2-D.
    """
    return _CONFIG_HEADER.pack(_INV_DEPTH, 0.0, 0.0) + encode_ranges_png(ranges)


def compressed_depth_png(fmt: str, data: bytes | np.ndarray, what: str = 'the range map') -> bytes:
    """The PNG of millimetres a compressedDepth CompressedImage of a 16UC1 image carries (its data
    after the ConfigHeader); `decode_ranges_png` reads it.

    Raises:
        InputError: Another format (a 32FC1 image's quantised inverse depth, RVL), or nothing after
            the header (one line naming `what`); `decode_ranges_png` refuses bytes that are no PNG.
    """
    encoding, _, transport = (part.strip() for part in fmt.partition(';'))
    if encoding != '16UC1' or transport not in (f'{DEPTH_TRANSPORT} png', DEPTH_TRANSPORT):
        raise InputError(
            f'{what}: format {fmt!r}, not a 16UC1 depth image as PNG ({COMPRESSED_DEPTH_FORMAT!r})'
        )
    data = bytes(data)
    if len(data) <= _CONFIG_HEADER.size:
        raise InputError(f'{what}: no image after the compressedDepth header')
    return data[_CONFIG_HEADER.size :]


@contextmanager
def open_bag(path: str | Path) -> Iterator[Any]:
    """The one bag opener: a rosbag2 bag (directory, .mcap or .db3) or a ROS 1 bag (.bag), read-only.

    Both generations are read through rosbags' AnyReader: one `connections`, `start_time`,
    `messages()` and `deserialize()` (CDR or ROS 1 wire format, by the bag's own type definitions,
    else the ROS 2 Jazzy ones); `is2` tells them apart.

    Raises:
        BagError: no such bag, not a bag, of unknown storage, or unreadable.
    """
    from rosbags.highlevel import AnyReader

    path = resolve_bag(path)
    if path.is_dir() and not (path / 'metadata.yaml').is_file():
        # A directory holding one storage file but no metadata (copied by hand): read the file.
        files = sorted(p for p in path.iterdir() if p.suffix in ('.mcap', '.db3'))
        if len(files) != 1:
            raise BagError(f'{path}: not a bag (no metadata.yaml)')
        path = files[0]
    if path.is_file() and path.suffix.lower() not in BAG_FILE_SUFFIXES:
        raise BagError(
            f'{path}: unknown bag storage {path.suffix!r} (expected .mcap, .db3, .bag or a bag directory)'
        )
    try:
        reader = AnyReader([path], default_typestore=bag_typestore())
        reader.open()
    except Exception as exc:  # rosbags raises several types (AnyReaderError, KeyError, sqlite3, mcap)
        kind = 'ROS 1 bag' if path.suffix.lower() == '.bag' else 'bag'
        raise BagError(f'{path}: unreadable {kind} ({_one_line(exc)})') from None
    try:
        yield reader
    finally:
        reader.close()


def cdr_bytes(reader: Any) -> Callable[[Any, bytes | memoryview], bytes]:
    """How the messages of an open bag become ROS 2 CDR bytes, for rclpy and Foxglove.

    A rosbag2 bag's are already; a ROS 1 bag's are migrated to the ROS 2 Jazzy definitions of
    their types (a header's `seq` dropped), as `rosbags-convert` does.

    Raises:
        BagError: (from the returned function) a ROS 1 message of a type ROS 2 does not define.
    """
    if reader.is2:
        return lambda _conn, raw: bytes(raw)
    from rosbags.convert.converter import migrate_bytes

    target = bag_typestore()
    cache: dict[str, object] = {}

    def convert(conn: Any, raw: bytes | memoryview) -> bytes:
        if conn.msgtype not in target.fielddefs:
            raise BagError(f'{conn.topic}: ROS 1 type {conn.msgtype} has no ROS 2 definition')
        try:
            data = migrate_bytes(
                reader.typestore, target, conn.msgtype, conn.msgtype, cache, raw, src_is2=False, dst_is2=True
            )
            return bytes(data)
        except Exception as exc:
            raise BagError(f'{conn.topic}: corrupt {conn.msgtype} message ({_one_line(exc)})') from None

    return convert


def verify_bag(path: str | Path) -> None:
    """Read every message of a bag to check it is whole: mcap chunk CRCs, and the message digest of
    bags written by `write_bag` (the only check sqlite3 storage has).

    Raises:
        BagError: The bag is unreadable, truncated, or its content does not match its checksums.
    """
    with open_bag(path) as reader:
        digest = MessageDigest()
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
    if not reader.is2:
        return None  # a ROS 1 bag: its chunks are read whole, no digest of ours
    storage = reader.readers[0].storage
    custom = getattr(getattr(storage, 'metadata', None), 'custom', None) or {}
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
        # A compressedDepth topic holds 16-bit depth (the scenes' range maps), not a camera's frames.
        if conn.msgtype in IMAGE_MSGTYPES and conn.topic.rsplit('/', 1)[-1] != DEPTH_TRANSPORT:
            conns.setdefault(conn.topic, []).append(conn)
    return conns


def list_image_topics(path: str | Path) -> list[str]:
    """The image topics (sensor_msgs/Image or CompressedImage) of a bag, sorted; depth images on
    image_transport's compressedDepth topics (`.../compressedDepth`) are none.

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


def _deserialise(reader: Any, conn: Any, timestamp: int, raw: bytes, path: Path) -> Any:
    """One message from its bytes (CDR or ROS 1); a damaged one is a BagError naming its type and time."""
    try:
        return reader.deserialize(raw, conn.msgtype)
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
    """Stream the frames of an image topic of a bag (ROS 2 or ROS 1), one message at a time, read-only.

    Args:
        path: A bag directory, an .mcap / .db3 storage file, or a ROS 1 .bag file.
        topic: The image topic; default the bag's only image topic.
        every: Keep every n-th message of the selected time window.
        start: Skip messages earlier than this many seconds after the bag's first message.
        end: Stop after messages later than this many seconds after the bag's first message.
        max_frames: Stop after this many frames.

    Yields:
        Frame with id '<bag name>@<stamp_ns>', stamp_ns the header stamp (the bag time when the
        header stamp is zero), file the bag and index the message's position on its topic. Messages
        before `start` are read to count them, not decoded.

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
        first = None if start is None else t0 + round(start * 1e9)
        last = None if end is None else t0 + round(end * 1e9)
        if max_frames is not None and max_frames <= 0:
            return
        yielded = 0
        position = 0
        # From the topic's first message, so that `index` counts every message of the topic.
        messages = reader.messages(connections=conns[topic])
        for index, (conn, timestamp, raw) in enumerate(_raw_messages(messages, path)):
            if first is not None and timestamp < first:
                continue
            if last is not None and timestamp > last:
                return
            keep = position % every == 0
            position += 1
            if not keep:
                continue
            msg = _deserialise(reader, conn, timestamp, raw, path)
            try:
                rgb = decode_image(msg)
            except InputError as exc:
                raise InputError(f'{path}: {topic} at {timestamp}: {exc}') from None
            stamp = _header_stamp(msg) or int(timestamp)
            yield Frame(id=f'{name}@{stamp}', rgb=rgb, stamp_ns=stamp, file=str(path), index=index)
            yielded += 1
            if max_frames is not None and yielded >= max_frames:
                return  # before the next message is read: what follows may be damaged


def iter_bag_messages(
    path: str | Path, topics: Iterable[str] | None = None
) -> Iterator[tuple[str, str, int, Any]]:
    """Stream every message of a bag (or of `topics`) in time order, deserialised, read-only.

    Messages are read by the type definitions stored in the bag (`bag_typestore()`'s when it stores
    none). A ROS 1 bag's messages have ROS 1 fields (a header's `seq`).

    Yields:
        (topic, msgtype, timestamp_ns, rosbags message object).

    Raises:
        BagError: Unreadable, truncated or corrupt bag, or a requested topic missing.
    """
    with open_bag(path) as reader:
        conns = reader.connections
        if topics is not None:
            wanted = set(topics)
            missing = wanted - {c.topic for c in conns}
            if missing:
                present = ', '.join(sorted({c.topic for c in conns}))
                raise BagError(f'{path}: no topic {", ".join(sorted(missing))}; topics: {present}')
            conns = [c for c in conns if c.topic in wanted]
        messages = reader.messages(connections=conns)
        for conn, timestamp, raw in _raw_messages(messages, path):
            msg = _deserialise(reader, conn, timestamp, raw, path)
            yield conn.topic, conn.msgtype, int(timestamp), msg


def read_ground_truth(path: str | Path) -> list[tuple[int, GroundTruth]]:
    """The ground truth stored in a bag written by `write_bag`: (header stamp ns, GroundTruth) in order.

    Raises:
        BagError: The bag cannot be read or has no /metavlm/ground_truth topic.
    """
    out = []
    for _topic, _type, _t, msg in iter_bag_messages(path, [GROUND_TRUTH_TOPIC]):
        out.append((_header_stamp(msg), ground_truth_from_message(msg)))
    return out


def read_range_pngs(path: str | Path) -> dict[int, bytes]:
    """The range maps of a bag `metavlm scenes` wrote: header stamp (ns) -> the PNG of millimetres of
    each message on RANGES_TOPIC (`footage.ranges.compressed_depth_png`), undecoded; empty for a bag
    without that topic (footage other tools recorded).

    Raises:
        BagError: The bag cannot be read.
        InputError: A message on the topic that is no 16UC1 compressedDepth PNG.
    """
    with open_bag(path) as reader:
        conns = [c for c in reader.connections if c.topic == RANGES_TOPIC]
        if not conns:
            return {}
        found: dict[int, bytes] = {}
        for conn, timestamp, raw in _raw_messages(reader.messages(connections=conns), Path(path)):
            msg = _deserialise(reader, conn, timestamp, raw, Path(path))
            stamp = _header_stamp(msg) or int(timestamp)
            found[stamp] = compressed_depth_png(msg.format, msg.data, f'{path}: {RANGES_TOPIC} at {stamp}')
        return found
