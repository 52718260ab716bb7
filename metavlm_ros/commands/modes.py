"""`metavlm modes`: the failure modes of results, as readable rules over every evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = 'group violations into failure modes, each a readable rule with its rates and smallest example'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm modes`."""
    from metavlm_ros.explain.attribution import METHODS, MapSettings
    from metavlm_ros.explain.catalogue import CatalogueSettings
    from metavlm_ros.models.arguments import add_model_arguments

    defaults, maps = CatalogueSettings(), MapSettings()
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
    group = parser.add_argument_group('attribution maps')
    group.add_argument(
        '--maps', action='store_true',
        help="also map what the model looked at on each mode's example, source and follow-up (maps/); "
        'needs --backend and --model, the model the evidence is of',
    )  # fmt: skip
    group.add_argument(
        '--map-method', choices=METHODS, default=None,
        help=f'gradients (integrated gradients, in-process CLIP and SigLIP), occlusion (any model, served '
        f'ones too) or auto: gradients where the backend has them (default: {maps.method})',
    )  # fmt: skip
    group.add_argument(
        '--map-steps', type=int, default=None, metavar='N',
        help=f"integrated gradients' steps, each a forward and backward pass (default: {maps.steps})",
    )  # fmt: skip
    group.add_argument(
        '--map-budget', type=int, default=None, metavar='FRAMES',
        help=f'most frames occlusion may have the model judge, all maps together (default: {maps.budget})',
    )  # fmt: skip
    add_model_arguments(parser)
    # No model unless named: --maps must be told which model the evidence is of, never assume one.
    parser.set_defaults(handler=run, model=None)


def _map_settings(args: argparse.Namespace):
    """The maps' settings, or None without --maps; map and model options without it are refused."""
    from metavlm_ros.common.errors import ParameterError
    from metavlm_ros.explain.attribution import MapSettings
    from metavlm_ros.explain.modes import map_settings_for

    given = {'--map-method': args.map_method, '--map-steps': args.map_steps,
             '--map-budget': args.map_budget, '--model': args.model}  # fmt: skip
    if not args.maps:
        named = [flag for flag, value in given.items() if value is not None]
        if named:
            raise ParameterError(f'{named[0]}: only with --maps')
        return None
    if args.model is None:
        raise ParameterError('--maps needs the model the evidence is of: --backend B --model M')
    defaults = MapSettings()
    return map_settings_for(
        method=args.map_method or defaults.method,
        steps=defaults.steps if args.map_steps is None else args.map_steps,
        budget=defaults.budget if args.map_budget is None else args.map_budget,
    )


def run(args: argparse.Namespace) -> int:
    """Read the evidence, build the catalogue, write it; errors reach the CLI as one line."""
    from metavlm_ros.explain.modes import attribute_modes, catalogue_of, settings_for
    from metavlm_ros.explain.report import check_out, write_catalogue
    from metavlm_ros.models.arguments import create_backend_from_args, model_options

    map_settings = _map_settings(args)
    if map_settings is not None:
        model_options(args)  # refused options fail now, not after the catalogue is learnt
    settings = settings_for(
        threshold=args.threshold,
        max_modes=args.max_modes,
        depth=args.depth,
        min_violations=args.min_violations,
        min_lift=args.min_lift,
    )
    catalogue = catalogue_of(args.results, settings)
    maps = None
    if map_settings is not None:
        check_out(args.out, args.results)  # before the model loads and the maps are made
        maps = attribute_modes(catalogue, create_backend_from_args(args), map_settings)
    written = write_catalogue(catalogue, args.out, args.results, maps)
    for rank, mode in enumerate(catalogue.modes, start=1):
        print(f'{rank}. {mode.rule} ({mode.violations_inside}/{mode.evaluations_inside} inside, '
              f'{mode.rate_outside:.2%} outside)')  # fmt: skip
    if not catalogue.modes:
        print('no failure mode: no answer change is much likelier under any rule than outside it')
    if maps is not None:
        print(f'maps: {len(maps.by_rank)} mode(s) by {maps.method.replace("_", " ")}, '
              f'{maps.frames_judged} frames judged', file=sys.stderr)  # fmt: skip
        for note in maps.notes:
            print(f'note: {note}', file=sys.stderr)
    shown = [p for p in written if p.parent == args.out]
    print(f'modes: {len(catalogue.modes)} in {", ".join(str(p) for p in shown)}', file=sys.stderr)
    return 0
