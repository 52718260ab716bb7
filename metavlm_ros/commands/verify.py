"""`metavlm verify`: judge a model against acceptance criteria; a verdict per criterion and overall."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metavlm_ros.footage.arguments import add_frame_arguments
from metavlm_ros.method import defaults
from metavlm_ros.method.envelope import ENVELOPE_ROUNDS
from metavlm_ros.models.arguments import add_model_arguments, create_backend_from_args, model_options

if TYPE_CHECKING:
    from metavlm_ros.assurance.criteria import Criteria
    from metavlm_ros.assurance.workflow import Verification

HELP = 'judge results against acceptance criteria: PASS, FAIL or INCONCLUSIVE per criterion and overall'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm verify`."""
    parser = subparsers.add_parser(
        'verify',
        help=HELP,
        description=HELP + '. With FRAMES: search them as the criteria need (evidence under '
        'OUT/evidence), then judge. With --results DIR: judge existing evidence again, without a model. '
        'Exit status 0: all PASS; 1: a FAIL; 3: INCONCLUSIVE and no FAIL; 2: an error (docs/assurance.md).',
    )
    parser.add_argument(
        'frames',
        nargs='*',
        metavar='FRAME',
        help='image files, folders of images, videos or bags to search (not with --results)',
    )
    parser.add_argument(
        '--criteria', type=Path, required=True, metavar='FILE', help='acceptance criteria (YAML)'
    )
    parser.add_argument(
        '--results',
        type=Path,
        default=None,
        metavar='DIR',
        help='evidence to judge again, as it is: a results directory (search, tester, verify, campaign) or '
        'a folder of them; checked against its SHA256SUMS where it has one',
    )
    add_model_arguments(parser)
    group = parser.add_argument_group('searches (with FRAMES)')
    group.add_argument(
        '--evaluations',
        type=int,
        default=defaults.EVALUATIONS,
        help=f'NSGA-II evaluations a frame for each existence claim (default: {defaults.EVALUATIONS}); rate '
        'claims draw their `samples`, the boundary search 8 a direction a round',
    )
    group.add_argument(
        '--population',
        type=int,
        default=defaults.POPULATION,
        help=f'batch size (default: {defaults.POPULATION})',
    )
    group.add_argument(
        '--seed', type=int, default=defaults.SEED, help=f'random seed (default: {defaults.SEED})'
    )
    group.add_argument(
        '--envelope-rounds',
        type=int,
        default=ENVELOPE_ROUNDS,
        metavar='N',
        help=f'rounds of the boundary search (default: {ENVELOPE_ROUNDS}: brackets 1/648 of each range)',
    )
    group.add_argument(
        '--working-size', default='auto', metavar='PX', help='as metavlm search (default: auto)'
    )
    add_frame_arguments(parser)
    out = parser.add_argument_group('output')
    out.add_argument(
        '--out',
        type=Path,
        default=None,
        metavar='DIR',
        help='a new directory: evidence, verdict and SHA256SUMS (default: results/verify); with --results, '
        'where the verdict goes (default: results/verdict; never inside the evidence)',
    )
    out.add_argument('--junit', type=Path, default=None, metavar='FILE', help='also write JUnit XML here')
    parser.set_defaults(handler=run)


def _frames(args: argparse.Namespace) -> list:
    from metavlm_ros.common.errors import ParameterError
    from metavlm_ros.footage.frames import iter_frames, verify_sources

    verify_sources(args.frames)
    frames = list(
        iter_frames(
            args.frames, topic=args.topic, every=args.every, start=args.start, end=args.end,
            max_frames=args.max_frames,
        )
    )  # fmt: skip
    if not frames:
        raise ParameterError('no frames selected from ' + ', '.join(args.frames))
    return frames


def run(args: argparse.Namespace) -> int:
    """Gather evidence (with FRAMES) or take it as it is (--results); judge; print the verdicts; exit
    status by the overall outcome."""
    from metavlm_ros.assurance.criteria import load_criteria
    from metavlm_ros.assurance.verdict import EXIT_CODES
    from metavlm_ros.assurance.workflow import verify_frames, verify_results
    from metavlm_ros.common.errors import ParameterError
    from metavlm_ros.models.vlm import model_identity

    criteria = load_criteria(args.criteria)
    if bool(args.frames) == (args.results is not None):
        raise ParameterError(
            'give FRAMES to search them, or --results DIR to judge evidence already gathered'
        )
    if args.results is not None:
        out, evidence = args.out or Path('results/verdict'), args.results
        done = verify_results(criteria, evidence, out, junit=args.junit)
    else:
        out = args.out or Path('results/verify')
        evidence = out / 'evidence'
        if args.envelope_rounds < 1:
            raise ParameterError(f'--envelope-rounds must be at least 1, got {args.envelope_rounds}')
        frames = _frames(args)
        if out.exists():
            raise ParameterError(f'--out {out}: exists; name a new directory for this verification')
        model = model_identity(args.backend, args.model, model_options(args))
        done = verify_frames(
            criteria, frames, create_backend_from_args(args), model, out,
            population=args.population, evaluations=args.evaluations, seed=args.seed,
            working_size=args.working_size, envelope_rounds=args.envelope_rounds, junit=args.junit,
        )  # fmt: skip
    modes = _failing_modes(criteria, done, evidence, out, sealed=args.results is None)
    for verdict in done.verdicts:
        print(f'{verdict.status:12} {verdict.criterion}: {verdict.claim}\n             {verdict.reason}')
        if verdict.criterion in modes:
            print(f'             {modes[verdict.criterion]}')
    if modes:
        print(f'failure modes, and the criteria they break: {out / "modes" / "modes.md"} (docs/explain.md)')
    files = ', '.join(map(str, done.written))
    print(f'{done.outcome}: {criteria.name} ({len(done.verdicts)} criteria; {files})')
    return EXIT_CODES[done.outcome]


#: The modes a FAIL's line names, most violations first (OUT/modes/modes.md has them all).
SHOWN_MODES = 3


def _failing_modes(
    criteria: Criteria, done: Verification, evidence: Path, out: Path, *, sealed: bool
) -> dict[str, str]:
    """With a FAIL: the evidence's failure modes into OUT/modes/ (and, for a verification that wrote
    OUT's SHA256SUMS, that manifest again, listing them); each failing criterion's modes as a line."""
    from metavlm_ros.assurance.verdict import FAIL
    from metavlm_ros.common.manifest import write_manifest
    from metavlm_ros.explain.verdicts import failing_modes

    if done.outcome != FAIL:
        return {}
    found = failing_modes(criteria, done.verdicts, [evidence], out / 'modes')
    if found.catalogue is None:
        return {}
    if sealed:
        write_manifest(out)
    lines = {}
    for broken in found.broken:
        named = [
            f'{rank}. {found.catalogue.modes[rank - 1].rule} ({count} of its {broken.violations} violations)'
            for rank, count in broken.modes[:SHOWN_MODES]
        ]
        more = f'; {len(broken.modes) - SHOWN_MODES} more' if len(broken.modes) > SHOWN_MODES else ''
        held = '; '.join(named) + more if named else f'none holds its {broken.violations} violations'
        lines[broken.criterion] = f'failure modes: {held}'
    return lines
