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
    from metavlm_ros.assurance.verdict import FailureModes, Verdict
    from metavlm_ros.assurance.workflow import Explainer

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
        done = verify_results(
            criteria, evidence, out, junit=args.junit, explain=_explainer(criteria, evidence, out)
        )
    else:
        out = args.out or Path('results/verify')
        evidence = out / 'evidence'
        if args.envelope_rounds < 1:
            raise ParameterError(f'--envelope-rounds must be at least 1, got {args.envelope_rounds}')
        frames = _frames(args)
        if criteria.water_ranges == 'truth':
            from metavlm_ros.footage.ranges import RangeLookup, missing_ranges

            lookup = RangeLookup()
            missing = next(filter(None, (missing_ranges(frame, lookup) for frame in frames)), None)
            if missing is not None:  # every frame, before the model loads
                raise missing
        if out.exists():
            raise ParameterError(f'--out {out}: exists; name a new directory for this verification')
        model = model_identity(args.backend, args.model, model_options(args))
        done = verify_frames(
            criteria, frames, create_backend_from_args(args), model, out,
            population=args.population, evaluations=args.evaluations, seed=args.seed,
            working_size=args.working_size, envelope_rounds=args.envelope_rounds, junit=args.junit,
            explain=_explainer(criteria, evidence, out),
        )  # fmt: skip
    for verdict in done.verdicts:
        print(f'{verdict.status:12} {verdict.criterion}: {verdict.claim}\n             {verdict.reason}')
        if done.modes is not None and verdict.criterion in done.modes.lines:
            lines = done.modes.lines[verdict.criterion]
            more = f'; {len(lines) - SHOWN_MODES} more' if len(lines) > SHOWN_MODES else ''
            print(f'             failure modes: {"; ".join(lines[:SHOWN_MODES])}{more}')
    if done.modes is not None:
        print(f'failure modes, and the criteria they break: {done.modes.catalogue} (docs/explain.md)')
    files = ', '.join(map(str, done.written))
    print(f'{done.outcome}: {criteria.name} ({len(done.verdicts)} criteria; {files})')
    return EXIT_CODES[done.outcome]


#: The modes a FAIL's line names, most violations first (the verdict's files and OUT/modes/ have them all).
SHOWN_MODES = 3


def _explainer(criteria: Criteria, evidence: Path, out: Path) -> Explainer:
    """With a FAIL: the evidence's failure modes into OUT/modes/ (before the verdict and, for a
    verification that gathers its evidence, before OUT's SHA256SUMS, which then lists them), and the
    modes that break each failing criterion for the verdict to name."""

    def explain(verdicts: list[Verdict]) -> FailureModes | None:
        from metavlm_ros.assurance.verdict import FAIL, overall
        from metavlm_ros.explain.verdicts import failing_modes

        if overall(verdicts) != FAIL:
            return None
        return failing_modes(criteria, verdicts, [evidence], out / 'modes').for_verdict()

    return explain
