"""`metavlm export`: results as one MCAP for Foxglove and Lichtblick, or as Parquet or CSV tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from metavlm_ros.common.record_tables import TABLE_FORMATS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm export`."""
    parser = subparsers.add_parser(
        'export',
        help='write results as an MCAP file for Foxglove / Lichtblick, or as Parquet or CSV tables',
        description='Write a results directory (search, tester node, run, demo, campaign cell) as one '
        'MCAP: source and follow-up frames, overlays, violations and summaries (docs/ros.md); or, with '
        '--format parquet|csv --out DIR, its records as one table per record file (docs/results.md).',
    )
    parser.add_argument('results', type=Path, metavar='RESULTS', help='results directory')
    parser.add_argument('--mcap', type=Path, metavar='OUT.mcap', help='MCAP file to write')
    parser.add_argument(
        '--format',
        choices=('mcap', *TABLE_FORMATS),
        default='mcap',
        help='mcap (default, --mcap OUT.mcap); parquet (nested fields kept) or csv (nested fields as '
        'dotted columns), one table per record file in --out DIR',
    )
    parser.add_argument('--out', type=Path, metavar='DIR', help='new directory for the tables (parquet, csv)')
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
    from metavlm_ros.common.errors import ParameterError
    from metavlm_ros.viewer.export import export_mcap

    if args.format != 'mcap':
        if args.out is None or args.mcap is not None or args.bag is not None:
            raise ParameterError(f'--format {args.format} writes tables into --out DIR (no --mcap, no --bag)')
        from metavlm_ros.common.record_tables import export_tables

        done = export_tables(args.results, args.out, args.format, log=print)
        tables = ', '.join(f'{name} ({count} records)' for name, count in done.records.items())
        print(f'{args.out}: {tables}')
        return 0
    if args.mcap is None or args.out is not None:
        raise ParameterError('an MCAP export needs --mcap OUT.mcap (--out DIR is for --format parquet|csv)')
    export_mcap(args.results, args.mcap, bag=args.bag, overwrite=args.overwrite, log=print)
    return 0
