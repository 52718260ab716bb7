"""`metavlm replay`: a bag's messages, or a video's frames, published by rclpy in their time (no ros2 CLI)."""

from __future__ import annotations

import argparse

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.ros.bag_player import DEFAULT_CLOCK_HZ, play
from metavlm_ros.ros.transport import add_transport_argument

__all__ = ['add_parser', 'run']

HELP = 'publish the messages of a bag (rosbag2 directory, .mcap, .db3; ROS 1 .bag) or a video on ROS topics'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm replay`."""
    parser = subparsers.add_parser('replay', help=HELP, description=HELP + '.')
    parser.add_argument(
        'bag',
        metavar='FOOTAGE',
        help='rosbag2 directory, .mcap or .db3 file, ROS 1 .bag file, or a video (published as rgb8 Image '
        'on /camera/image_raw at its frame rate)',
    )
    parser.add_argument(
        '--topic', action='append', default=None, metavar='T', help='topic to publish (repeat; default: all)'
    )
    parser.add_argument(
        '--rate', type=float, default=1.0, metavar='R', help='playback speed factor (default 1)'
    )
    parser.add_argument('--loop', action='store_true', help='replay the bag until interrupted')
    parser.add_argument(
        '--clock',
        type=float,
        nargs='?',
        const=DEFAULT_CLOCK_HZ,
        default=None,
        metavar='HZ',
        help=f'publish the bag time on /clock (default {DEFAULT_CLOCK_HZ:g} Hz) for use_sim_time nodes',
    )
    parser.add_argument(
        '--remap',
        action='append',
        default=[],
        metavar='OLD:=NEW',
        help='publish a bag topic under another name',
    )
    parser.add_argument(
        '--qos-profile-overrides-path',
        default=None,
        metavar='YAML',
        help='QoS per topic, as for ros2 bag play',
    )
    parser.add_argument(
        '--wait-for-subscribers',
        type=float,
        default=0.0,
        metavar='S',
        help='wait up to S seconds for every topic to have a subscriber before starting',
    )
    add_transport_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run `metavlm replay`; returns the exit code."""
    if not args.rate > 0:
        raise ParameterError(f'--rate must be positive, got {args.rate}')
    if args.clock is not None and not args.clock > 0:
        raise ParameterError(f'--clock must be positive, got {args.clock}')
    stats, interrupted = play(
        args.bag,
        topics=args.topic,
        rate=args.rate,
        loop=args.loop,
        clock_hz=args.clock,
        remaps=args.remap,
        qos_overrides_path=args.qos_profile_overrides_path,
        wait_for_subscribers_s=args.wait_for_subscribers,
        dds_transport=args.dds_transport,
    )
    ending = ' (interrupted)' if interrupted else ''
    print(
        f'published {stats.total} messages on {len(stats.published)} topic(s) '
        f'in {stats.seconds:.1f} s ({stats.loops} full pass(es)){ending}'
    )
    return 0
