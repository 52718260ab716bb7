"""Command-line options that select frames from folders, bags and videos, shared by the commands."""

from __future__ import annotations

import argparse

__all__ = ['add_frame_arguments']


def add_frame_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that select frames from folders, bags (ROS 2 and ROS 1) and videos."""
    group = parser.add_argument_group('frame selection (folders, bags, videos)')
    group.add_argument('--topic', default=None, help='image topic of a bag (default: its only image topic)')
    group.add_argument('--every', type=int, default=1, metavar='N', help='take every Nth frame')
    group.add_argument(
        '--start',
        type=float,
        default=None,
        metavar='S',
        help='skip the first S seconds (a folder: its i-th image is at i s)',
    )
    group.add_argument('--end', type=float, default=None, metavar='S', help='stop after S seconds')
    group.add_argument('--max-frames', type=int, default=None, metavar='N', help='at most N frames')
