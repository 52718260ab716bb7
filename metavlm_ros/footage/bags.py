"""Bags without a ROS installation: scene footage written (rosbag2), frames and messages read (ROS 2, 1)."""

from __future__ import annotations

# One import for callers (footage/frames.py, the nodes, the commands, the tests): what bags hold, how
# footage is written into one and how one is read, each in its own module.
from metavlm_ros.footage.bag_format import (
    CAMERA_INFO_TOPIC,
    COMPRESSED_TOPIC,
    DEFAULT_START_NS,
    GROUND_TRUTH_TOPIC,
    IMAGE_TOPIC,
    STORAGES,
    bag_name,
    bag_typestore,
    camera_info_message,
    ground_truth_message,
    image_message,
    resolve_bag,
    resolve_bag_output,
)
from metavlm_ros.footage.bag_reader import (
    BAG_FILE_SUFFIXES,
    RANGES_TOPIC,
    cdr_bytes,
    decode_image,
    iter_bag_frames,
    iter_bag_messages,
    list_image_topics,
    open_bag,
    read_ground_truth,
    read_range_pngs,
    verify_bag,
)
from metavlm_ros.footage.bag_writer import write_bag

__all__ = [
    'BAG_FILE_SUFFIXES',
    'CAMERA_INFO_TOPIC',
    'COMPRESSED_TOPIC',
    'DEFAULT_START_NS',
    'GROUND_TRUTH_TOPIC',
    'IMAGE_TOPIC',
    'RANGES_TOPIC',
    'STORAGES',
    'bag_name',
    'bag_typestore',
    'camera_info_message',
    'cdr_bytes',
    'decode_image',
    'ground_truth_message',
    'image_message',
    'iter_bag_frames',
    'iter_bag_messages',
    'list_image_topics',
    'open_bag',
    'read_ground_truth',
    'read_range_pngs',
    'resolve_bag',
    'resolve_bag_output',
    'verify_bag',
    'write_bag',
]
