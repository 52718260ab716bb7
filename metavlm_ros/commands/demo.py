"""`metavlm demo`: synthetic footage, both demo models searched through the ROS nodes, and a short report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method import defaults
from metavlm_ros.ros.launcher import require_rclpy
from metavlm_ros.ros.transport import add_transport_argument

if TYPE_CHECKING:
    from metavlm_ros.common.document import Block

__all__ = ['add_parser', 'run', 'run_demo']

HELP = (
    'see metavlm work end to end: synthetic footage, the demo CLIP, BLIP and detector searched through ROS, '
    'a report'
)
DEMO_SIZE = (384, 216)  # the tester's default transport size (longer side 384): no resize on the way
# One frame every 2 s: about the time a search takes here, so most frames get searched (a busy tester
# drops what arrives meanwhile, as on a robot).
DEMO_FPS = 0.5
DEMO_MODELS = ('clip', 'blip', 'detector')
# How the report names each demo model.
TITLES = {'clip': 'demo CLIP', 'blip': 'demo BLIP', 'detector': 'demo detector'}
# What a demo directory holds; --overwrite only replaces a directory that holds these and nothing else.
_MARKERS = ('report.md', 'footage')
_DEMO_NAMES = frozenset(
    {
        'report.md',
        'report.json',
        'footage',
        'strongest_violations.png',
        'trade_off.png',
        'assurance',
        'water',
        'modes',
        *DEMO_MODELS,
        *(f'{backend}_rand' for backend in DEMO_MODELS),
    }
)
# The envelope per Jerlov water type (MR12): its claims, and how many frames of the footage, spread over
# it, it is measured on (each a boundary search per type and model: about 2 s a frame for all three).
WATER_CRITERIA = 'demo_water.yaml'
WATER_FRAMES = 3
# Free space the demo needs at least (it writes about 45 MB with the defaults, docs/demo.md).
DEMO_BYTES = 64 * 2**20


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `metavlm demo`."""
    parser = subparsers.add_parser('demo', help=HELP, description=HELP + '.')
    parser.add_argument(
        '--out', type=Path, default=Path('results/demo'), help='output directory (results/demo)'
    )
    parser.add_argument('--frames', type=int, default=6, help='frames of synthetic footage (default 6)')
    parser.add_argument(
        '--evaluations', type=int, default=300, help='evaluations per searched frame (default 300)'
    )
    parser.add_argument('--seed', type=int, default=0, help='seed of the footage and the searches')
    parser.add_argument(
        '--also',
        nargs='+',
        default=[],
        metavar='ALGORITHM',
        help='search the same frames with these algorithms too, in process (e.g. mobo), beside Rand',
    )
    parser.add_argument('--overwrite', action='store_true', help='replace an earlier demo in --out')
    add_transport_argument(parser)
    parser.set_defaults(handler=run)


def _demo_names() -> frozenset[str]:
    """What a demo directory may hold: _DEMO_NAMES and the results of every algorithm `--also` takes."""
    from metavlm_ros.method.search import ALGORITHMS  # the registry; pymoo loads slowly

    return _DEMO_NAMES | {f'{backend}_{algorithm}' for backend in DEMO_MODELS for algorithm in ALGORITHMS}


def _check_also(algorithms: list[str]) -> None:
    """--also names registered algorithms other than the demo's own two, each once.

    Raises:
        ParameterError: naming the first that is not.
    """
    from metavlm_ros.method.search import ALGORITHMS, ENVELOPE

    allowed = [a for a in ALGORITHMS if a not in ('nsga2', 'random', ENVELOPE)]
    for algorithm in algorithms:
        if algorithm not in allowed:
            raise ParameterError(
                f'--also: unknown algorithm {algorithm!r} (choose from {", ".join(allowed)})'
            )
    if len(set(algorithms)) != len(algorithms):
        raise ParameterError('--also names an algorithm twice')


def _check_can_start(out: Path, overwrite: bool) -> None:
    """Everything that can stop the demo, checked before an earlier demo in `out` is touched.

    Raises:
        ParameterError: `out` holds something else than an earlier demo, or one without --overwrite.
        StorageError: `out` cannot be written, or its disk has less than DEMO_BYTES free.
        ModelError: a demo model is missing or its weights are damaged.
        InputError: rclpy is not installed.
    """
    from metavlm_ros.common.results import check_output_dir
    from metavlm_ros.common.scratch import is_stale
    from metavlm_ros.models.vlm import resolve_model

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ParameterError(f'{out} exists and is not empty; pass --overwrite to replace the demo there')
        if not out.is_dir() or not any((out / m).exists() for m in _MARKERS):
            raise ParameterError(f'{out} does not look like a metavlm demo directory; refusing to replace it')
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _demo_names() and not is_stale(p))
        if foreign:
            shown = ', '.join(foreign[:5]) + (', ...' if len(foreign) > 5 else '')
            raise ParameterError(f'{out}: holds files a demo does not write ({shown}); not replacing it')
    check_output_dir(out, need_bytes=DEMO_BYTES, what='the demo')
    for backend in DEMO_MODELS:
        resolve_model(backend, 'demo')  # the files, and the headers of their weights
    require_rclpy('demo')


def _prepare_out(out: Path, overwrite: bool) -> None:
    """An empty `out`: an earlier demo there is replaced whole (its PNGs too) by renames, at once."""
    from metavlm_ros.common.results import replace_directory, storage_error

    try:
        if overwrite and out.is_dir() and any(out.iterdir()):
            replace_directory(out, log=print)
        else:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(out, exc, what='the demo', kept='an earlier demo there is intact') from None


def _footage(out: Path, frames: int, seed: int, say: Any) -> tuple[Path, dict[int, Any]]:
    """Write the synthetic bag; return its path and its frames by stamp (for the montage)."""
    from tqdm import tqdm

    from metavlm_ros.footage.bags import write_bag
    from metavlm_ros.footage.frames import iter_frames
    from metavlm_ros.footage.ranges import render_with_ranges
    from metavlm_ros.footage.scenes import SceneGenerator

    generator = SceneGenerator(*DEMO_SIZE, DEMO_FPS, seed, environment='shallow')
    bar = tqdm(total=frames, desc='footage', unit='frame', leave=False)

    def scenes():
        for i in range(frames):
            # With each frame's range map: the demo bag serves searches of --water-ranges truth too.
            yield render_with_ranges(generator, i)
            bar.update(1)

    bag = write_bag(out / 'footage' / 'demo', scenes(), fps=DEMO_FPS, storage='mcap')
    bar.close()
    by_stamp = {frame.stamp_ns: frame.rgb for frame in iter_frames([bag])}
    say(f'footage: {frames} frame(s) {DEMO_SIZE[0]}x{DEMO_SIZE[1]} at {DEMO_FPS:g} Hz in {bag}')
    return bag, by_stamp


def _parameters(backend: str, evaluations: int, seed: int) -> dict[str, dict[str, Any]]:
    """Parameter blocks of the two nodes for one demo model (ROS endpoint: the tester probes perception)."""
    model = {'backend': backend, 'model': 'demo', 'device': 'cpu'}
    return {
        'metavlm_perception': dict(model),
        'metavlm_tester': {
            **model,
            'vlm_endpoint': 'ros',
            'population': min(defaults.POPULATION, max(2, evaluations)),
            'evaluations': evaluations,
            'seed': seed,
            'frame_period_s': 0.0,
            'publish_violation_images': True,
            # A handful of frames, not a dive: the Pareto PNGs `metavlm search` writes, as Rand's beside it.
            'pareto_pngs': defaults.PARETO_PNGS,
        },
    }


def _rand_searches(
    backend: str,
    records: list[dict],
    by_stamp: dict[int, Any],
    out: Path,
    evaluations: int,
    seed: int,
    algorithm: str = 'random',
) -> list[dict]:
    """Search the frames the tester searched again with Rand (or `algorithm`; in process, same budget
    and seed), for the NSGA-II vs Rand trade-off; results kept in `out` like any search's. Returns their
    evaluation records."""
    from metavlm_ros.common.results import ResultsStore, read_jsonl
    from metavlm_ros.method.search import SearchConfig, run_search
    from metavlm_ros.models.vlm import create_backend, identity_record, model_identity

    images = {}
    for record in records:
        stamp = int(record.get('source_stamp', 0))
        if stamp in by_stamp:
            images.setdefault(str(record['image']), stamp)
    if not images:
        return []
    model = create_backend(backend, 'demo', device='cpu')
    config = SearchConfig(
        algorithm=algorithm,
        population=min(defaults.POPULATION, max(2, evaluations)),
        evaluations=evaluations,
        seed=seed,
    )
    # The identity record of `metavlm search`, from the same builder: the demo's Rand searches and a
    # user's `metavlm search --model demo` compare.
    identity = identity_record(config, model_identity(backend, 'demo', {'device': 'cpu'}))
    with ResultsStore(out, identity=identity) as store:
        for image, stamp in images.items():
            extra = {'source_stamp': stamp, 'model': model.model_id, 'endpoint': 'inprocess'}
            run_search(by_stamp[stamp], model, config, image_id=image, store=store, extra_fields=extra)
    return read_jsonl(out / 'evaluations.jsonl')


def _hypervolumes(directory: Path) -> dict[str, float]:
    from metavlm_ros.common.results import read_jsonl

    return {str(r['image']): float(r['hypervolume']) for r in read_jsonl(directory / 'summary.jsonl')}


# The demo's regression gate: the demo CLIP against two updates of it: its weights quantised to 8 bits
# (demo/variants.py), and demo-clip-v2, fine-tuned on 300 frames without the augmentation that made
# the demo CLIP robust (metavlm_ros/models/demo-clip-v2/README.md).
UPDATES = {
    'int8': 'weights quantised to 8 bits',
    'v2': 'fine-tuned on 300 frames without augmentation (demo-clip-v2)',
}


def _assurance(
    out: Path, bag: Path, evaluations: int, seed: int, log: Any
) -> tuple[list[Block], dict[str, Any]]:
    """The example criteria judged on the demo CLIP, and the regression gate against its two updates.

    Returns:
        The report's section (its blocks), and the outcomes (verdict, regressions per update).
    """
    from metavlm_ros.assurance.compare import comparison_outcome
    from metavlm_ros.assurance.criteria import example_criteria, load_criteria
    from metavlm_ros.assurance.workflow import compare_results, verify_frames
    from metavlm_ros.common.document import Code, Link, Paragraph, Strong, Table
    from metavlm_ros.demo.variants import quantised_copy
    from metavlm_ros.footage.frames import iter_frames
    from metavlm_ros.models.vlm import create_backend, model_identity, resolve_model

    criteria = load_criteria(example_criteria())
    frames = list(iter_frames([bag]))
    demo = Path(resolve_model('clip', 'demo'))
    models = {
        'clip': 'demo',
        'int8': str(quantised_copy(demo, out / 'models' / 'clip-int8')),
        'v2': str(demo.with_name('demo-clip-v2')),
    }
    verified = {}
    for name, model in models.items():
        log(f'  verify {name}: the example criteria ({criteria.path.name}) on {len(frames)} frame(s)')
        verified[name] = verify_frames(
            criteria, frames, create_backend('clip', model), model_identity('clip', model, {}),
            out / f'verify-{name}', population=20, evaluations=evaluations, seed=seed, working_size='auto',
            envelope_rounds=2, log=lambda line: log(f'    {line}'),
        )  # fmt: skip
    base = verified['clip']
    outcomes: dict[str, Any] = {'verdict': base.outcome, 'regressions': {}}
    gate = []
    for name, what in UPDATES.items():
        done = compare_results(out / 'verify-clip', out / f'verify-{name}', out / f'compare-{name}')
        regressed = [c.item for c in done.regressions]
        outcomes['regressions'][name] = regressed
        verdict = comparison_outcome(done.changes)
        log(f'  compare {name} ({what}): {verdict}' + (f': {", ".join(regressed)}' if regressed else ''))
        link = Link(verdict, f'assurance/compare-{name}/compare.md')
        gate.append([f'{name}: {what}', link, ', '.join(regressed) or 'none'])
    blocks: list[Block] = [
        Paragraph(
            Code('metavlm verify'),
            ' with ',
            Code(criteria.path.name),
            f' ({criteria.name}) on the demo CLIP: ',
            Strong(base.outcome),
            ' (',
            Link('verdict', 'assurance/verify-clip/verdict.md'),
            ').',
        ),
        Table(
            columns=['criterion', 'status', 'why'],
            rows=[[v.criterion, v.status, v.reason] for v in base.verdicts],
        ),
        Paragraph(
            Code('metavlm compare'),
            ' of the demo CLIP (base) against two updates of it, the same plan on the same frames:',
        ),
        Table(columns=['update', 'verdict', 'items regressed'], rows=gate),
    ]
    return blocks, outcomes


def run_demo(
    out: Path,
    *,
    frames: int,
    evaluations: int,
    seed: int,
    log: Any = print,
    dds_transport: str = 'shm',
    also: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the whole demo into `out` (which must be empty or absent); `also`: further algorithms that
    search the same frames in process, beside Rand (results in `<model>_<algorithm>`).

    Returns:
        Paths (bag, results per model, report.md, report.json, montage) and the run summaries.
    """
    from metavlm_ros.assurance.criteria import example_criteria, load_criteria
    from metavlm_ros.assurance.water_envelopes import Subject, measure_waters
    from metavlm_ros.common.results import read_jsonl
    from metavlm_ros.demo.report import (
        DemoSection,
        montage,
        pair_panel,
        pareto_plot,
        strongest,
        write_demo_report,
    )
    from metavlm_ros.explain.sections import results_modes
    from metavlm_ros.footage.frames import iter_frames
    from metavlm_ros.method.encoding import Composition
    from metavlm_ros.method.relations import apply_composition
    from metavlm_ros.models.registry import backend_class
    from metavlm_ros.ros.launcher import run_nodes
    from metavlm_ros.viewer.boxes import draw_outlines, violation_outlines

    started = time.monotonic()
    steps = 4 + len(DEMO_MODELS)
    log(f'[1/{steps}] rendering synthetic footage ...')
    bag, by_stamp = _footage(out, frames, seed, log)
    sections, summaries, panels = [], {}, []
    groups: dict[str, dict[str, list[dict]]] = {}
    hypervolumes: dict[str, dict[str, dict[str, float]]] = {}
    for step, backend in enumerate(DEMO_MODELS, start=2):
        results = out / backend
        log(
            f'[{step}/{steps}] {backend}: perception and tester nodes on the footage '
            f'({evaluations} evaluations per searched frame)'
        )
        summary = run_nodes(
            _parameters(backend, evaluations, seed),
            source=bag,
            rate=DEMO_FPS,
            results_dir=results,
            log=lambda line, b=backend: log(f'  {b}: {line}'),
            dds_transport=dds_transport,
        )
        summaries[backend] = summary
        records = read_jsonl(results / 'evaluations.jsonl')  # none when nothing was searched
        kind = backend_class(backend).kinds[0]  # the demo models give one kind each
        notes = [
            f'{summary["searches"]} search(es), {summary["evaluations"]} evaluations '
            f'({summary["failed"]} failed), {summary["frames_dropped"]} frame(s) dropped while searching, '
            f'{summary["seconds"]:.0f} s.'
        ]
        if summary['searches_paused_disk']:
            notes.append(
                f'{summary["searches_paused_disk"]} frame(s) not searched: the results disk was below '
                "the tester's min_free_disk_mb."
            )
        sections.append(DemoSection(f'{TITLES[backend]} through ROS', results, records, kind, notes))
        log(
            f'  {backend}: {summary["searches"]} search(es), {summary["evaluations"]} evaluations, '
            f'{summary["violations"]} violation(s)'
        )
        log(f'  {backend}: the same frame(s) searched with Rand, for the trade-off plot ...')
        rand_dir = out / f'{backend}_rand'
        rand_records = _rand_searches(backend, records, by_stamp, rand_dir, evaluations, seed)
        title = TITLES[backend]
        groups[title] = {'nsga2': records, 'random': rand_records}
        hypervolumes[title] = {'nsga2': _hypervolumes(results), 'random': _hypervolumes(rand_dir)}
        for algorithm in also:
            log(f'  {backend}: the same frame(s) searched with {algorithm} ...')
            extra_dir = out / f'{backend}_{algorithm}'
            groups[title][algorithm] = _rand_searches(
                backend, records, by_stamp, extra_dir, evaluations, seed, algorithm
            )
            hypervolumes[title][algorithm] = _hypervolumes(extra_dir) if groups[title][algorithm] else {}
        for record in strongest(records, 2):
            stamp = int(record.get('source_stamp', record.get('stamp_ns', 0)))
            if stamp not in by_stamp:
                continue
            source = by_stamp[stamp]
            followup = apply_composition(source, Composition.from_parameters(record['parameters']))
            if record.get('kind') == 'detection':
                # Where the warp put the source's objects, and what the detector found (viewer/boxes.py).
                outlines = violation_outlines(record.get('boxes'), record.get('followup_detections'))
                draw_outlines(followup, outlines, text=0.7)
            panels.append(pair_panel(source, followup, record, f'demo {backend} | {record["image"]}'))
    log(f'[{steps - 2}/{steps}] acceptance criteria and the regression gate (demo CLIP) ...')
    assurance_lines, gate = _assurance(out / 'assurance', bag, evaluations, seed, log)
    log(f'[{steps - 1}/{steps}] the demo models in Jerlov water types (MR12 water) ...')
    footage = list(iter_frames([bag]))
    spread = footage[:: max(1, len(footage) // WATER_FRAMES)][:WATER_FRAMES]
    water = measure_waters(
        load_criteria(example_criteria(WATER_CRITERIA)), spread,
        [Subject(b, TITLES[b], b, 'demo') for b in DEMO_MODELS], out / 'water', population=20,
        evaluations=evaluations, seed=seed, envelope_rounds=2, log=log,
    )  # fmt: skip
    log(f'[{steps}/{steps}] writing the report ...')
    # The demo CLIP's failure modes, from its searches through ROS and Rand's of the same frames.
    modes = results_modes(
        [out / 'clip', out / 'clip_rand'], out / 'modes', 'Failure modes (demo CLIP)', link='modes'
    )
    log(f'  failure modes of the demo CLIP: {len(modes.records)} in {out / "modes"}')
    montage_path = None
    if panels:
        from metavlm_ros.common.images import encode_png
        from metavlm_ros.common.results import write_file_atomic

        montage_path = out / 'strongest_violations.png'
        write_file_atomic(montage_path, encode_png(montage(panels)))
    plot = pareto_plot(groups, out / 'trade_off.png')
    md, js = write_demo_report(
        out,
        sections,
        montage_path,
        trade_off={'plot': plot, 'hypervolume': hypervolumes},
        assurance=assurance_lines,
        modes=modes.section,
        modes_records=modes.records,
        water=water.section('The demo models in Jerlov water (MR12 water)', 'water'),
        water_figures=water.as_json(),
    )
    return {
        'bag': bag,
        'results': {b: out / b for b in DEMO_MODELS},
        'report': md,
        'report_json': js,
        'montage': montage_path,
        'trade_off': plot,
        'assurance': gate,
        'modes': out / 'modes' if modes.files else None,
        'water': out / 'water',
        'summaries': summaries,
        'seconds': time.monotonic() - started,
    }


def run(args: argparse.Namespace) -> int:
    """Run the demo and print where everything is."""
    if args.frames < 1:
        raise ParameterError(f'--frames must be at least 1, got {args.frames}')
    if args.evaluations < 1:
        raise ParameterError(f'--evaluations must be at least 1, got {args.evaluations}')
    out = Path(args.out)
    _check_also(args.also)
    # Validated first; an earlier demo is replaced only once the new one can start.
    _check_can_start(out, args.overwrite)
    _prepare_out(out, args.overwrite)
    done = run_demo(
        out,
        frames=args.frames,
        evaluations=args.evaluations,
        seed=args.seed,
        dds_transport=args.dds_transport,
        also=tuple(args.also),
    )
    print(f'demo finished in {done["seconds"]:.0f} s')
    print(f'  footage (ROS 2 bag):   {done["bag"]}')
    for backend, path in done['results'].items():
        print(f'  {backend + " results:":22} {path}/ (evaluations, violations, summary: .jsonl.gz)')
    print(f'  report:                {done["report"]}')
    print(f'  tables (JSON):         {done["report_json"]}')
    print(f'  NSGA-II vs Rand:       {done["trade_off"]}')
    if done['montage'] is not None:
        print(f'  strongest violations:  {done["montage"]}')
    else:
        print('  no violation found: raise --evaluations or --frames for a montage')
    if done.get('modes') is not None:
        print(f'  failure modes:         {done["modes"] / "modes.md"}')
    if done.get('water') is not None:
        print(f'  Jerlov water (MR12):   {done["water"]}/ (per model: verdict, evidence)')
    gate = done['assurance']
    print(f'  verdict (demo CLIP):   {gate["verdict"]}: {out / "assurance" / "verify-clip" / "verdict.md"}')
    for name, regressed in gate['regressions'].items():
        verdict = f'REGRESSED ({", ".join(regressed)})' if regressed else 'no regression'
        print(f'  gate, {name:8}       {verdict}: {out / "assurance" / f"compare-{name}" / "compare.md"}')
    return 0
