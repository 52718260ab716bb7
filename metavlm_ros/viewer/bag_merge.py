"""A footage bag in an export: frames checked against the results' hashes, topics copied as they are."""

from __future__ import annotations

from pathlib import Path

import foxglove

from metavlm_ros.common.errors import BagError, InputError
from metavlm_ros.common.images import encode_png
from metavlm_ros.footage.bag_reader import DEPTH_TRANSPORT
from metavlm_ros.footage.bags import bag_typestore, cdr_bytes, decode_image, open_bag, verify_bag
from metavlm_ros.footage.frames import frame_digest

__all__ = ['check_bag_frames', 'merge_bag']

IMAGE_TYPES = ('sensor_msgs/msg/Image', 'sensor_msgs/msg/CompressedImage')


def check_bag_frames(bag: str | Path, wanted: dict[int, str]) -> dict[int, bytes]:
    """Verify a bag whole, and that it holds every searched frame with the hash its records carry.

    Args:
        bag: The footage bag.
        wanted: Camera stamp (ns) -> `frame_sha256` of every searched frame of the results.

    Returns:
        Camera stamp -> the frame as PNG, for the source-image topic.

    Raises:
        BagError: The bag is damaged or unreadable.
        InputError: The results have no bag frames, or a frame is missing from the bag or differs.
    """
    if not wanted:
        raise InputError(f'{bag}: the results hold no frames with a camera stamp and hash to match a bag')
    verify_bag(bag)  # whole, with its checksums, before any of it is used
    found: dict[int, bytes] = {}
    with open_bag(bag) as reader:
        # A compressedDepth topic (a range map at the frame's stamp) holds depth, never the camera's frame.
        connections = [
            c
            for c in reader.connections
            if c.msgtype in IMAGE_TYPES and c.topic.rsplit('/', 1)[-1] != DEPTH_TRANSPORT
        ]
        for connection, timestamp, raw in reader.messages(connections=connections):
            msg = reader.deserialize(raw, connection.msgtype)
            header = msg.header.stamp
            stamp = int(header.sec) * 1_000_000_000 + int(header.nanosec) or int(timestamp)
            if stamp not in wanted or stamp in found:
                continue
            rgb = decode_image(msg)
            digest = frame_digest(rgb)
            if digest != wanted[stamp]:
                raise InputError(
                    f'{bag}: the frame at {stamp} on {connection.topic} does not match the results '
                    f'(frame_sha256 {digest} in the bag, {wanted[stamp]} in them): another bag?'
                )
            found[stamp] = encode_png(rgb)
    missing = sorted(set(wanted) - set(found))
    if missing:
        more = f' and {len(missing) - 1} more' if len(missing) > 1 else ''
        raise InputError(f'{bag}: has no frame at {missing[0]}{more} that the results searched: another bag?')
    return found


def merge_bag(bag: str | Path, context: foxglove.Context) -> int:
    """Copy every message of a bag, CDR bytes and ROS 2 schema as they are, into `context`'s sinks.

    A ROS 1 bag's messages are migrated to their ROS 2 definitions first (`cdr_bytes`).

    Returns:
        The number of messages copied.
    """
    typestore = bag_typestore()
    channels: dict[int, foxglove.Channel] = {}
    copied = 0
    with open_bag(bag) as reader:
        to_cdr = cdr_bytes(reader)
        for connection in reader.connections:
            text = (
                connection.msgdef.data if reader.is2 and connection.msgdef and connection.msgdef.data else ''
            )
            if not text:
                # sqlite3 bags may not store definitions; the typestore knows the standard ones.
                try:
                    text = typestore.generate_msgdef(connection.msgtype)[0]
                except Exception as exc:
                    raise BagError(f'{bag}: no definition of {connection.msgtype} ({exc})') from None
            schema = foxglove.Schema(name=connection.msgtype, encoding='ros2msg', data=text.encode())
            channels[connection.id] = foxglove.Channel(
                connection.topic, schema=schema, message_encoding='cdr', context=context
            )
        for connection, timestamp, raw in reader.messages():
            channels[connection.id].log(to_cdr(connection, raw), log_time=int(timestamp))
            copied += 1
    return copied
