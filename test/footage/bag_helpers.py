"""Bags for the tests of footage/ (and the nodes'): a written scene's settings, arbitrary messages, hashes."""

import hashlib
from pathlib import Path

import numpy as np
from rosbags.rosbag1 import Writer as Writer1
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from metavlm_ros.footage.bag_format import DEFAULT_START_NS, bag_typestore

FPS = 5.0
N = 5


def tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob('*'))
        if p.is_file()
    }


def stamps(n: int = N) -> list[int]:
    return [DEFAULT_START_NS + i * 200_000_000 for i in range(n)]


def write_custom(path: Path, messages: list[tuple[str, str, object]], storage=StoragePlugin.MCAP) -> Path:
    """A bag of arbitrary (topic, msgtype, message) entries, one per 0.1 s."""
    ts = bag_typestore()
    with Writer(path, version=8, storage_plugin=storage) as writer:
        conns = {}
        for i, (topic, msgtype, msg) in enumerate(messages):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=ts)
            writer.write(conns[topic], DEFAULT_START_NS + i * 100_000_000, ts.serialize_cdr(msg, msgtype))
    return path


def image(encoding: str, data: np.ndarray, width: int, height: int, step: int, stamp_s: int = 1):
    t = bag_typestore().types
    header = t['std_msgs/msg/Header'](
        stamp=t['builtin_interfaces/msg/Time'](sec=stamp_s, nanosec=0), frame_id='cam'
    )
    return t['sensor_msgs/msg/Image'](
        header=header, height=height, width=width, encoding=encoding, is_bigendian=0, step=step, data=data
    )


def compressed(fmt: str, data: bytes):
    t = bag_typestore().types
    header = t['std_msgs/msg/Header'](
        stamp=t['builtin_interfaces/msg/Time'](sec=2, nanosec=5), frame_id='cam'
    )
    return t['sensor_msgs/msg/CompressedImage'](header=header, format=fmt, data=np.frombuffer(data, np.uint8))


NOETIC = get_typestore(Stores.ROS1_NOETIC)


def noetic_image(bgr: np.ndarray, stamp_ns: int, seq: int = 0):
    """A ROS 1 sensor_msgs/Image, bgr8, as a Noetic camera driver publishes it."""
    t = NOETIC.types
    stamp = t['builtin_interfaces/msg/Time'](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    height, width = bgr.shape[:2]
    return t['sensor_msgs/msg/Image'](
        header=t['std_msgs/msg/Header'](seq=seq, stamp=stamp, frame_id='camera'),
        height=height,
        width=width,
        encoding='bgr8',
        is_bigendian=0,
        step=width * 3,
        data=np.ascontiguousarray(bgr).reshape(-1),
    )


def noetic_compressed(bgr: np.ndarray, stamp_ns: int, seq: int = 0):
    """A ROS 1 sensor_msgs/CompressedImage (JPEG), as image_transport's compressed plugin writes it."""
    import cv2

    t = NOETIC.types
    stamp = t['builtin_interfaces/msg/Time'](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    data = cv2.imencode('.jpg', bgr, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].reshape(-1)
    return t['sensor_msgs/msg/CompressedImage'](
        header=t['std_msgs/msg/Header'](seq=seq, stamp=stamp, frame_id='camera'),
        format='bgr8; jpeg compressed bgr8',
        data=data,
    )


def write_ros1(
    path: Path, messages: list[tuple[str, str, int, object]], compression: str | None = None
) -> Path:
    """A ROS 1 bag of (topic, msgtype, bag time ns, Noetic message) entries, as `rosbag record` writes it
    (`--bz2` / `--lz4`: `compression`)."""
    writer = Writer1(path)
    if compression:
        writer.set_compression(Writer1.CompressionFormat[compression.upper()])
    with writer:
        conns = {}
        for topic, msgtype, stamp, msg in messages:
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=NOETIC, callerid='/camera')
            writer.write(conns[topic], stamp, NOETIC.serialize_ros1(msg, msgtype))
    return path


def write_ros1_scene(
    path: Path, scene, *, compressed: bool = False, fps: float = FPS, compression: str | None = None
) -> Path:
    """A ROS 1 bag of a scene's frames on /camera/image_raw (or .../compressed), bgr8, stamped at `fps`."""
    topic = '/camera/image_raw/compressed' if compressed else '/camera/image_raw'
    msgtype = 'sensor_msgs/msg/CompressedImage' if compressed else 'sensor_msgs/msg/Image'
    build = noetic_compressed if compressed else noetic_image
    entries = []
    for i, (rgb, _gt) in enumerate(scene):
        stamp = DEFAULT_START_NS + round(i * 1e9 / fps)
        entries.append((topic, msgtype, stamp, build(rgb[..., ::-1], stamp, seq=i)))
    return write_ros1(path, entries, compression)
