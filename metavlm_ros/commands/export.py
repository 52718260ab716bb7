"""`metavlm export`: a results directory (and its footage bag) as one MCAP for Foxglove and Lichtblick."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm export`."""
    parser = subparsers.add_parser(
        'export',
        help='write results as an MCAP file for Foxglove / Lichtblick',
        description='Write a results directory (search, tester node, run, demo, campaign cell) as one '
        'MCAP: source and follow-up frames, overlays, violations and summaries (docs/ros.md).',
    )
    parser.add_argument('results', type=Path, metavar='RESULTS', help='results directory')
    parser.add_argument('--mcap', type=Path, required=True, metavar='OUT.mcap', help='MCAP file to write')
    parser.add_argument(
        '--bag',
        type=Path,
        metavar='BAG',
        help="footage bag the results were searched on: merged onto the export's timeline",
    )
    parser.add_argument('--overwrite', action='store_true', help='replace OUT.mcap if it exists')
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Export; errors reach the CLI as one line."""
    from metavlm_ros.viewer.export import export_mcap

    export_mcap(args.results, args.mcap, bag=args.bag, overwrite=args.overwrite, log=print)
    return 0
