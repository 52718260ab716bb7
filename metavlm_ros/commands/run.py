"""`metavlm run`: the perception and tester nodes in one process, fed from a bag, a video or a folder."""

from __future__ import annotations

import argparse

from metavlm_ros.ros.launcher import DEFAULT_FOLDER_RATE_HZ, run_nodes
from metavlm_ros.ros.transport import add_transport_argument

__all__ = ['add_parser', 'run']

HELP = 'run the perception and tester nodes in one process (no ROS distribution needed)'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm run`."""
    parser = subparsers.add_parser('run', help=HELP, description=HELP + '.')
    parser.add_argument(
        '--params',
        default=None,
        metavar='YAML',
        help='ROS parameter file of both nodes (config/metavlm.yaml)',
    )
    parser.add_argument(
        '--source',
        default=None,
        metavar='FOOTAGE',
        help='footage to publish on the camera topic: a bag (ROS 2 or ROS 1), a video or a folder of images',
    )
    parser.add_argument(
        '--topic', default=None, help='image topic to read from a bag (default: its only one)'
    )
    parser.add_argument(
        '--duration',
        type=float,
        default=None,
        metavar='S',
        help='stop after S seconds (default: end of footage)',
    )
    parser.add_argument(
        '--rate',
        type=float,
        default=None,
        metavar='HZ',
        help=f"camera rate (default: the footage's own spacing, {DEFAULT_FOLDER_RATE_HZ:g} Hz for folders)",
    )
    parser.add_argument('--loop', action='store_true', help='replay the footage until --duration ends')
    parser.add_argument(
        '--results-dir', default=None, metavar='DIR', help="override the tester's results_dir"
    )
    add_transport_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run both nodes as the options say and print a summary."""
    summary = run_nodes(
        args.params,
        source=args.source,
        topic=args.topic,
        duration=args.duration,
        rate=args.rate,
        loop=args.loop,
        results_dir=args.results_dir,
        log=print,
        dds_transport=args.dds_transport,
    )
    print(
        f'{summary["frames_published"]} frame(s) published, {summary["searches"]} search(es), '
        f'{summary["evaluations"]} evaluations ({summary["failed"]} failed), '
        f'{summary["violations"]} violation(s), {summary["frames_dropped"]} frame(s) dropped, '
        f'{summary["seconds"]:.1f} s; results in {summary["results_dir"]}/'
    )
    if summary['searches_paused_disk']:
        print(
            f'{summary["searches_paused_disk"]} frame(s) not searched: the results disk was below '
            'min_free_disk_mb (free space, or lower the parameter)'
        )
    return 0
