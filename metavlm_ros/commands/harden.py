"""`metavlm harden`: fine-tune a model on what broke it, then prove it with the tool's own gate."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from metavlm_ros.footage.arguments import add_frame_arguments
from metavlm_ros.method import defaults
from metavlm_ros.models.arguments import add_model_arguments, model_options
from metavlm_ros.training.harden import CHECKPOINT, HardenSettings
from metavlm_ros.training.tuning import METHODS

HELP = 'fine-tune a model so its answers hold under the relations that broke it; gate it on held-out frames'
#: The gate's searches, as `metavlm demo` runs verify: enough to find the example criteria's
#: counterexamples on a few frames in minutes on 2 CPU cores.
GATE_EVALUATIONS, GATE_POPULATION, GATE_ROUNDS = 300, 20, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm harden`."""
    parser = subparsers.add_parser(
        'harden',
        help=HELP,
        description=HELP + '. Trains on FRAMES (a share held out to choose the blend with the base), '
        'writes OUT as the base model is written (every command loads it) with a model card, then runs '
        'metavlm verify on the base and the hardened model on --heldout frames and compares them. Exit '
        'status 0: no item regressed; 1: an item regressed (the model is kept, the card says which); 2: an '
        'error; 130: interrupted (--resume continues). docs/harden.md',
    )
    parser.add_argument(
        'frames', nargs='+', metavar='FRAME', help='frames to train on (files, folders, videos, bags)'
    )
    parser.add_argument(
        '--out', type=Path, required=True, metavar='DIR', help='a new directory for the model'
    )
    parser.add_argument(
        '--results', type=Path, action='append', default=[], metavar='DIR',
        help='evidence of earlier searches (repeatable): its violations are trained on',
    )  # fmt: skip
    parser.add_argument(
        '--criteria', type=Path, default=None, metavar='FILE',
        help="the region the model must hold in and the gate's claims (default: the example criteria)",
    )  # fmt: skip
    parser.add_argument(
        '--heldout', nargs='+', default=None, metavar='FRAME',
        help='frames never trained on, for the gate (verify and compare of base against hardened)',
    )  # fmt: skip
    parser.add_argument('--no-gate', action='store_true', help='train and save only (no --heldout needed)')
    parser.add_argument('--resume', action='store_true', help=f'continue from OUT/{CHECKPOINT}')
    add_model_arguments(parser)
    recipe = parser.add_argument_group('training (docs/harden.md)')
    defaults_ = HardenSettings()
    recipe.add_argument(
        '--method', choices=METHODS, default=defaults_.method, help='lora, full, or auto by size'
    )
    for field in fields(HardenSettings):
        if field.name in ('method', 'threshold', 'iou_threshold'):
            continue
        recipe.add_argument(
            f'--{field.name.replace("_", "-")}', type=type(field.default), default=field.default,
            help=f'(default: {field.default})',
        )  # fmt: skip
    recipe.add_argument(
        '--threshold', type=float, default=None, help="violation threshold (default: the criteria's)"
    )
    recipe.add_argument(
        '--iou-threshold', type=float, default=None,
        help="boxes: a matched box below this IoU is displaced (default: the criteria's)",
    )  # fmt: skip
    gate = parser.add_argument_group('the gate (metavlm verify on --heldout)')
    gate.add_argument(
        '--evaluations', type=int, default=GATE_EVALUATIONS, help=f'(default: {GATE_EVALUATIONS})'
    )
    gate.add_argument('--population', type=int, default=GATE_POPULATION, help=f'(default: {GATE_POPULATION})')
    gate.add_argument('--envelope-rounds', type=int, default=GATE_ROUNDS, help=f'(default: {GATE_ROUNDS})')
    gate.add_argument('--gate-seed', type=int, default=defaults.SEED, help=f'(default: {defaults.SEED})')
    add_frame_arguments(parser)
    parser.set_defaults(handler=run)


def _frames(sources: list[str], args: argparse.Namespace) -> list:
    from metavlm_ros.footage.frames import iter_frames, verify_sources

    verify_sources(sources)
    selection = {k: getattr(args, k) for k in ('topic', 'every', 'start', 'end', 'max_frames')}
    return list(iter_frames(sources, **selection))


def run(args: argparse.Namespace) -> int:
    """Plan, train, save with a model card, gate; print what changed."""
    from metavlm_ros.assurance.criteria import example_criteria, load_criteria
    from metavlm_ros.assurance.harden_job import HardenJob, harden_model
    from metavlm_ros.common.errors import ParameterError

    if args.heldout is None and not args.no_gate:
        raise ParameterError('give --heldout FRAMES for the gate (frames never trained on), or --no-gate')
    criteria = load_criteria(args.criteria or example_criteria())
    threshold = args.threshold if args.threshold is not None else criteria.threshold
    iou = args.iou_threshold if args.iou_threshold is not None else criteria.iou_threshold
    own = ('threshold', 'iou_threshold')
    settings = HardenSettings(
        **{f.name: getattr(args, f.name) for f in fields(HardenSettings) if f.name not in own},
        threshold=threshold,
        iou_threshold=iou,
    )
    job = HardenJob(
        backend=args.backend,
        model=args.model,
        options=model_options(args),
        out=args.out,
        criteria=criteria,
        results=tuple(args.results),
        settings=settings,
        resume=args.resume,
        gate_search={
            'evaluations': args.evaluations,
            'population': args.population,
            'envelope_rounds': args.envelope_rounds,
            'seed': args.gate_seed,
            'working_size': 'auto',
        },
    )
    heldout = None if args.no_gate else _frames(args.heldout, args)
    done = harden_model(job, _frames(args.frames, args), heldout)
    print(done.summary)
    return 1 if done.regressed else 0
