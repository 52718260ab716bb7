"""`metavlm modes`: the failure modes of results, as readable rules over every evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = 'group violations into failure modes, each a readable rule with its rates and smallest example'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm modes`."""
    from metavlm_ros.explain.catalogue import CatalogueSettings

    defaults = CatalogueSettings()
    parser = subparsers.add_parser('modes', help=HELP, description=HELP + ' (docs/explain.md).')
    parser.add_argument(
        'results', nargs='+', type=Path, metavar='RESULTS',
        help='results: a search, a verify run, a campaign, a tester directory; several at once',
    )  # fmt: skip
    parser.add_argument('--out', type=Path, required=True, metavar='DIR', help='a new directory for modes.*')
    parser.add_argument(
        '--threshold', type=float, default=None, metavar='TH',
        help='confidence threshold of an answer change (default: the largest the records were judged at)',
    )  # fmt: skip
    parser.add_argument('--max-modes', type=int, default=defaults.max_modes, help='modes kept, best first')
    parser.add_argument('--depth', type=int, default=defaults.depth, help='most conditions a rule')
    parser.add_argument(
        '--min-violations', type=int, default=defaults.min_violations, help='fewest violations a mode'
    )
    parser.add_argument(
        '--min-lift', type=float, default=defaults.min_lift,
        help='how many times likelier inside the rule than outside a mode must be',
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Read the evidence, build the catalogue, write it; errors reach the CLI as one line."""
    from metavlm_ros.explain.modes import catalogue_of, settings_for
    from metavlm_ros.explain.report import write_catalogue

    settings = settings_for(
        threshold=args.threshold,
        max_modes=args.max_modes,
        depth=args.depth,
        min_violations=args.min_violations,
        min_lift=args.min_lift,
    )
    catalogue = catalogue_of(args.results, settings)
    written = write_catalogue(catalogue, args.out, args.results)
    for rank, mode in enumerate(catalogue.modes, start=1):
        print(f'{rank}. {mode.rule} ({mode.violations_inside}/{mode.evaluations_inside} inside, '
              f'{mode.rate_outside:.2%} outside)')  # fmt: skip
    if not catalogue.modes:
        print('no failure mode: no answer change is much likelier under any rule than outside it')
    print(f'modes: {len(catalogue.modes)} in {", ".join(str(p) for p in written)}', file=sys.stderr)
    return 0
