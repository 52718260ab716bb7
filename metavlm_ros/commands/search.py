"""`metavlm search`: search frames offline for the compositions that change the VLM's answer."""

from __future__ import annotations

import argparse
import sys

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.footage.arguments import add_frame_arguments
from metavlm_ros.method import defaults
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.models.arguments import (
    add_model_arguments,
    create_backend_from_args,
    search_identity,
)
from metavlm_ros.viewer import DEFAULT_HOST

HELP = 'search frames offline for the smallest transformations that change the model'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser('search', help=HELP, description=HELP + '.')
    parser.add_argument(
        'frames',
        nargs='+',
        metavar='FRAME',
        help='image files, folders of images, videos, or bags (rosbag2 mcap / sqlite3, ROS 1 .bag)',
    )
    add_model_arguments(parser)
    group = parser.add_argument_group('search')
    group.add_argument(
        '--algorithm',
        default=defaults.ALGORITHM,
        help='nsga2 (MetaVLM, the default), random (Rand), nsga3, smsemoa, moead, or mobo (sample-efficient: '
        'a tenth of the evaluations for expensive models) (docs/method.md §7); for acceptance criteria, '
        'uniform (uniform samples of the --relations and --range given) or envelope (the boundary search, '
        'docs/assurance.md)',
    )
    group.add_argument(
        '--population',
        type=int,
        default=defaults.POPULATION,
        help=f'population / batch size (default: {defaults.POPULATION})',
    )
    group.add_argument(
        '--evaluations',
        type=int,
        default=defaults.EVALUATIONS,
        help=f'evaluations per frame (default: {defaults.EVALUATIONS})',
    )
    group.add_argument(
        '--seed', type=int, default=defaults.SEED, help=f'random seed (default: {defaults.SEED})'
    )
    group.add_argument(
        '--iou-threshold',
        type=float,
        default=DEFAULT_IOU_THRESHOLD,
        help='detection models: a matched box below this IoU is a displaced object, a violation '
        f'(default: {DEFAULT_IOU_THRESHOLD}; docs/method.md §13)',
    )
    group.add_argument(
        '--find-inserted',
        action='store_true',
        help='detection models with object insertion (--relations ... insertion): the pasted object must be '
        'found too, its class at the IoU threshold, when it covers 0.5%% of the frame or more; without it '
        "only the source's objects around it must stay (MetaOD's oracle; docs/method.md §13)",
    )
    group.add_argument(
        '--water-ranges',
        choices=('prior', 'truth'),
        default='prior',
        help="where MR12 water takes each pixel's range to the scene: 'prior' (its extras: the same range "
        "over the frame, or a seabed plane with --range water_tilt=T:T) or 'truth' (the range map beside "
        'each frame: ranges/<frame>.png in a folder `metavlm scenes --format png` wrote; a frame without '
        'one is refused). Default: prior (docs/underwater.md)',
    )
    group.add_argument(
        '--skip-wrong-sources',
        action='store_true',
        help="detection models on footage with ground truth (the project's scenes and bags): search only "
        'the frames the model gets right (every object found, nothing else, at the IoU threshold), as the '
        'study searched only correctly classified images; the others are named and skipped',
    )
    group.add_argument(
        '--relations',
        nargs='+',
        default=None,
        metavar='ID',
        help='the relations the search may use: ids (rotation, turbidity, insertion, ...) or the groups '
        "paper, underwater, optics, all (default: the paper's six; docs/method.md §12, §13)",
    )
    group.add_argument(
        '--range',
        action='append',
        default=[],
        metavar='ID=LOW:HIGH',
        help='narrow a relation parameter range, e.g. rotation=-2:2 or motion_blur_angle=90:90 (repeatable)',
    )
    group.add_argument(
        '--thresholds', nargs='+', type=float, default=None, metavar='TH', help='confidence thresholds'
    )
    group.add_argument(
        '--working-size',
        default='auto',
        metavar='PX',
        help="longer side the relations act at: auto (2x the model's input side, the default), "
        'full (or 0: the frame as it is) or pixels; recorded in every result',
    )
    add_frame_arguments(parser)
    out = parser.add_argument_group('output')
    out.add_argument('--out', default='results/search', metavar='DIR', help='results directory')
    mode = out.add_mutually_exclusive_group()
    mode.add_argument(
        '--resume', action='store_true', help='continue in a directory that already has results'
    )
    mode.add_argument('--overwrite', action='store_true', help='replace the results already in DIR')
    out.add_argument('--quiet', action='store_true', help='no progress bar')
    out.add_argument(
        '--foxglove-port',
        type=int,
        metavar='PORT',
        help='serve the search live to Foxglove / Lichtblick on this port (off by default; docs/ros.md)',
    )
    out.add_argument(
        '--foxglove-host',
        default=DEFAULT_HOST,
        metavar='ADDR',
        help='address the Foxglove server binds (127.0.0.1: this machine only)',
    )
    out.add_argument(
        '--foxglove-wait',
        type=float,
        default=0.0,
        metavar='SECONDS',
        help='once the model is loaded, wait up to SECONDS for a Foxglove client to subscribe before '
        'searching, so that a short search is seen whole (default: 0, no wait)',
    )
    out.add_argument(
        '--pareto-pngs',
        default=defaults.PARETO_PNGS,
        metavar='K',
        help='follow-up PNGs per search for its non-dominated set: K spread along the front (always the '
        f'smallest-f_trans violation and the largest f_pred), 0 none, all every member (default: '
        f'{defaults.PARETO_PNGS}); the others: metavlm render',
    )
    parser.set_defaults(handler=run)


def parse_ranges(items: list[str]) -> dict[str, tuple[float, float]]:
    """Parse `ID=LOW:HIGH` strings into a ranges mapping; an extra that names its values takes them by
    name too, as criteria files do (`water_type=II:5C`)."""
    from metavlm_ros.method.relations import RELATIONS

    named = {i: e for r in RELATIONS for i, e in zip(r.extra_ids, r.extras, strict=True) if e.parse}
    ranges = {}
    for item in items:
        try:
            name, bounds = item.split('=', 1)
            texts = bounds.split(':', 1)
            extra = named.get(name.strip())
            low, high = (extra.read(v.strip()) if extra else float(v) for v in texts)
        except ValueError:
            raise ParameterError(f'--range {item!r}: expected ID=LOW:HIGH, e.g. rotation=-2:2') from None
        except ParameterError as exc:
            raise ParameterError(f'--range {item!r}: {exc}') from None
        ranges[name.strip()] = (low, high)
    return ranges


# Free space a search needs at least: its evaluation records take about 1 KiB each.
RECORD_BYTES = 1024


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from metavlm_ros.common.errors import ModelError, ResultsError
    from metavlm_ros.common.results import ResultsStore, check_results_dir, search_key
    from metavlm_ros.footage.frames import frame_digest, iter_frames, verify_sources
    from metavlm_ros.footage.ground_truth import SourceCheck
    from metavlm_ros.method.encoding import SearchSpace
    from metavlm_ros.method.metrics import DEFAULT_THRESHOLDS
    from metavlm_ros.method.search import SearchConfig, run_search, summarise_orders

    # Everything a user can get wrong is checked before the model loads or a file is touched:
    # settings, frames (bags whole, for damage), model files, the results directory and its disk.
    config = SearchConfig(
        algorithm=args.algorithm,
        population=args.population,
        evaluations=args.evaluations,
        seed=args.seed,
        space=SearchSpace.from_options(enabled=args.relations, ranges=parse_ranges(args.range)),
        thresholds=tuple(args.thresholds) if args.thresholds else DEFAULT_THRESHOLDS,
        working_size=args.working_size,
        pareto_pngs=args.pareto_pngs,
        iou_threshold=args.iou_threshold,
        find_inserted=args.find_inserted,
        water_ranges=args.water_ranges,
    ).validate()
    verify_sources(args.frames)
    frames = iter_frames(
        args.frames,
        topic=args.topic,
        every=args.every,
        start=args.start,
        end=args.end,
        max_frames=args.max_frames,
    )
    first = next(frames, None)
    if first is None:
        raise ParameterError('no frames selected from ' + ', '.join(args.frames))
    if config.water_ranges == 'truth':
        from metavlm_ros.footage.ranges import missing_ranges

        missing = missing_ranges(first)  # before the model loads; later frames are checked as reached
        if missing is not None:
            raise missing
    identity = search_identity(args, config)
    options = {'overwrite': args.overwrite, 'resume': args.resume, 'identity': identity}
    check_results_dir(args.out, refuse_existing=True, need_bytes=config.evaluations * RECORD_BYTES, **options)
    live = _start_live(args)  # a port in use is refused before the model loads
    backend = create_backend_from_args(args)
    if live is not None and args.foxglove_wait > 0:
        print(
            f'metavlm: waiting up to {args.foxglove_wait:g} s for a Foxglove client at {live.url}',
            file=sys.stderr,
            flush=True,
        )
        if not live.wait_for_viewer(args.foxglove_wait):
            print('metavlm: no Foxglove client subscribed; searching anyway', file=sys.stderr, flush=True)

    def note(message: str) -> None:
        print(f'metavlm: {message}', file=sys.stderr)

    store = ResultsStore(args.out, log=note, **options)
    if live is not None:
        from metavlm_ros.viewer.live import LiveResults

        store = LiveResults(store, live)  # publishes each record after it is written
    done = store.completed_searches()
    searched_frames = store.frame_digests()

    def all_frames():
        yield first
        yield from frames

    searched = skipped = 0
    check_source = SourceCheck(backend, config)
    with store:
        for frame in all_frames():
            digest = frame_digest(frame.rgb)
            if searched_frames.get(frame.id, {digest}) != {digest}:
                raise ResultsError(
                    f'{frame.id}: not the frame searched under that name in {args.out} (its pixels differ); '
                    '--resume continues only the same search: use another --out'
                )
            key = search_key(
                {
                    'image': frame.id,
                    'algorithm': config.algorithm,
                    'seed': config.seed,
                    'model': backend.model_id,
                }
            )
            if key in done:
                print(f'{frame.id}: already searched, skipped (--resume)')
                continue
            with tqdm(
                total=config.evaluations,
                desc=frame.id,
                unit='eval',
                disable=args.quiet,
                file=sys.stderr,
                dynamic_ncols=True,
            ) as bar:
                prepared, source, accuracy = check_source(frame)
                if accuracy is not None and args.skip_wrong_sources and not accuracy.correct:
                    print(
                        f'{frame.id}: skipped (--skip-wrong-sources): the model is wrong on the source: '
                        f'{accuracy.false_negatives} object(s) missed, {accuracy.false_positives} false, at '
                        f'IoU {accuracy.iou_threshold:g}'
                    )
                    skipped += 1
                    continue
                if live is not None:
                    store.next_source(frame.rgb)
                result = run_search(
                    prepared,
                    backend,
                    config,
                    image_id=frame.id,
                    store=store,
                    progress=bar.update,
                    source=source,
                    summary_fields={} if accuracy is None else {'source_accuracy': accuracy.as_record()},
                    extra_fields={
                        'model': backend.model_id,
                        'backend': backend.name,
                        'stamp_ns': frame.stamp_ns,
                        'frame_sha256': digest,
                        # Where to find the frame again: the file, its position there (and stamp_ns).
                        'frame_file': frame.file,
                        'frame_index': frame.index,
                    },
                )
            searched += 1
            _print_summary(result, summarise_orders)
            if result.stopped:
                # Only a backend stops this search (a served model's server gone): kept, resumable.
                why = getattr(backend, 'failure', '') or 'the model stopped answering'
                raise ModelError(f'{frame.id}: search stopped: {why}; what finished is kept in {args.out}')
    from metavlm_ros.common.manifest import write_manifest

    # The directory as this command leaves it, for `sha256sum -c` and `metavlm verify` (docs/assurance.md).
    write_manifest(args.out)
    if skipped:
        print(f'{skipped} frame(s) skipped: the model is wrong on their source (--skip-wrong-sources)')
    print(
        f'{searched} frame(s) searched; results in {store.directory}/ '
        '(evaluations.jsonl.gz, pareto.jsonl.gz, summary.jsonl.gz, frames/, sources/, search.json, '
        'SHA256SUMS)'
    )
    if live is not None:
        live.close()
    return 0


def _start_live(args: argparse.Namespace):
    """The Foxglove live server `--foxglove-port` asks for, or None."""
    if args.foxglove_port is None:
        if args.foxglove_wait:
            raise ParameterError('--foxglove-wait needs --foxglove-port')
        return None
    if not args.foxglove_wait >= 0:
        raise ParameterError(f'--foxglove-wait must be 0 or more seconds, got {args.foxglove_wait:g}')
    from metavlm_ros.viewer.live import LiveServer

    live = LiveServer(args.foxglove_port, args.foxglove_host)
    print(f'metavlm: serving the search live to Foxglove at {live.url}', file=sys.stderr, flush=True)
    return live


def _print_summary(result, summarise_orders) -> None:
    from metavlm_ros.method.relations import RELATION_BY_ID

    src = ', '.join(f'{k}={v:.3g}' for k, v in result.source.values.items())
    rate = len(result.evaluations) / result.seconds if result.seconds else float('nan')
    print(
        f'{result.image}: {result.algorithm} seed {result.seed}: {len(result.evaluations)} evaluations '
        f'in {result.seconds:.1f} s ({rate:.1f}/s), {result.frames_judged} frames sent to the model in '
        f'{result.model_calls} calls; hypervolume {result.hypervolume:.4f}'
    )
    print(f'  source prediction: {src}' + (f'  text: {result.source.text!r}' if result.source.text else ''))
    if result.source_error:
        print(f'  not searched: the source answer does not read ({result.source_error})')
        return
    width, height = result.source_size
    print(f'  relations at working size {result.working_size} px (frame {width}x{height}; --working-size)')
    numbered = ', '.join(f'{RELATION_BY_ID[rid].number} {rid}' for rid in result.relations)
    print(f'  relations searched: {numbered} (--relations)')
    for line in summarise_orders(result):
        print(line)
    failures = sum(ev.followup is not None and bool(ev.followup.error) for ev in result.evaluations)
    if failures:
        share = 100 * failures / len(result.evaluations)
        print(f'  {failures} answer(s) did not parse ({share:.0f} %): failed evaluations')
    for i in result.pareto[:5]:
        ev = result.evaluations[i]
        params = ', '.join(f'{k}={v:.3g}' for k, v in ev.composition.parameters.items())
        print(f'  front: {ev.composition.label} f_trans={ev.f_trans:.3f} f_pred={ev.f_pred:.3f} ({params})')
