"""Bags for the tests of footage/ (and the nodes'): a written scene's settings, arbitrary messages, hashes."""

import hashlib
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer

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
