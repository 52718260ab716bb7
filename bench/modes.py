"""Benchmark: the failure-mode catalogue finds what is planted, maps look where the model looks, and what
both cost on a tester hour of evidence.

Usage: python bench/modes.py [--seeds 3] [--searches 153] [--per-search 3000] [--repeats 3]

1. Recovery: the planted double of test/explain/planted.py (trash drops on dark frames rotated by
   more than +2 deg; animal rises below downsampling 0.95, both seen in the pixels) searched on its six
   frames (two dark, two as made, two bright; rotation, scaling, downsampling, translation; 300
   evaluations a frame) by Rand and by NSGA-II with --seeds seeds each. Per run: the planted modes the
   catalogue recovers (its change, its relation with the right sign, the threshold within 0.5 deg or
   0.02 of the planted one, and for the dark mode a brightness condition) and its false modes (every
   other mode it keeps).
2. Attribution mass: the region double of test/explain/region.py (every score a function of one
   quadrant) mapped on each planted mode's example, source and follow-up, for the top-right and the
   bottom-left quadrant, by integrated gradients (32 steps) and by occlusion (the default budget of
   1000 frames; and 20, a 2 x 2 grid on the quadrants): the share of each map's mass inside the
   quadrant.
3. A tester hour: --searches searches of --per-search evaluations each, written as the tester writes
   them (153 searches of 3000 an hour: the 15-minute tester run of docs/results.md judged 116,310
   evaluations, 465,000 an hour, at 153 searches an hour), their answers synthesised from the planted
   rules on the parameters and the frame (160 x 120 planted frames, one per search, stored), not
   judged by a model. Timed: `metavlm modes` on it (a child process: wall seconds, peak RSS); the
   tester's bounded catalogue (explain/tracker.py at its default sample of 50,000: reading the hour
   streamed, one search handed over, one catalogue learnt, --repeats times); and the maps of the
   hour's modes by the demo CLIP in process (integrated gradients at 32 steps, occlusion at the
   default budget). Timings are printed, never asserted; the recovery figures are checked.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / 'bench'), str(ROOT)]  # timing, and the test doubles (test/explain)
from timing import Checks, fmt  # noqa: E402

from metavlm_ros.common.results import ResultsStore  # noqa: E402
from metavlm_ros.explain.catalogue import CatalogueSettings  # noqa: E402
from metavlm_ros.explain.modes import attribute_modes, catalogue_of, map_settings_for  # noqa: E402
from metavlm_ros.explain.tracker import DEFAULT_SAMPLE, ModeTracker  # noqa: E402
from metavlm_ros.method.encoding import Composition, SearchSpace  # noqa: E402
from metavlm_ros.method.objectives import f_trans  # noqa: E402
from metavlm_ros.method.relations import RELATION_BY_ID  # noqa: E402
from metavlm_ros.method.search import SearchConfig, run_search  # noqa: E402
from metavlm_ros.models.identity import answered_model_identity, identity_record  # noqa: E402
from test.explain.conftest import FRAMES_PER_LIGHT, RELATIONS  # noqa: E402
from test.explain.planted import (  # noqa: E402
    BASE,
    DOWNSAMPLING_SCALE,
    DROP,
    LIGHTS,
    RISE,
    ROTATION_DEG,
    PlantedBackend,
    planted_frame,
)
from test.explain.region import BOTTOM_LEFT, TOP_RIGHT, RegionBackend, region_mask  # noqa: E402

SETTINGS = CatalogueSettings(threshold=0.05)
#: (label, relation, sign, planted value, tolerance, also needs a brightness at-most condition)
PLANTED = (
    ('trash dropped', 'rotation', '+', ROTATION_DEG, 0.5, True),
    ('animal rose', 'downsampling', '-', DOWNSAMPLING_SCALE, 0.02, False),
)


def _planted_search(directory: Path, algorithm: str, seed: int, evaluations: int = 300) -> Path:
    """The planted double's six frames searched into `directory` (as test/explain/conftest.py does)."""
    backend = PlantedBackend()
    space = SearchSpace.from_options(RELATIONS)
    config = SearchConfig(algorithm=algorithm, population=30, evaluations=evaluations, seed=seed, space=space)
    model = answered_model_identity(backend.model_id, backend.classes, backend=backend.name)
    with ResultsStore(directory, identity=identity_record(config, model)) as store:
        frames = [(light, k) for light in LIGHTS for k in range(FRAMES_PER_LIGHT)]
        for i, (light, k) in enumerate(frames):
            config_i = SearchConfig(**{**config.__dict__, 'seed': seed + i})
            extra = {'model': backend.model_id, 'backend': backend.name, 'stamp_ns': 0}
            run_search(planted_frame(k, light), backend, config_i, image_id=f'{light}{k}', store=store,
                       extra_fields=extra)  # fmt: skip
    return directory


def _matches(mode, planted) -> bool:
    label, relation, sign, value, tolerance, dark = planted
    if mode.change.label != label:
        return False
    named = {c.feature.name: c for c in mode.conditions}
    condition = named.get(relation)
    if condition is None or condition.sign != sign or abs(condition.value - value) > tolerance:
        return False
    return not dark or ('brightness' in named and not named['brightness'].above)


def recovery(root: Path, seeds: int, checks: Checks) -> dict:
    print('\n1. Recovery of the planted modes (6 frames x 300 evaluations a run, threshold 0.05)')
    header = f'{"algorithm":9} {"seed":>4} {"modes":>5} {"recovered":>9} {"false":>5}'
    print(f'  {header}  thresholds found (planted)')
    found = {'recovered': 0, 'planted': 0, 'false': 0, 'runs': 0}
    last = None
    for algorithm in ('random', 'nsga2'):
        for s in range(seeds):
            seed = 11 + 100 * s
            directory = _planted_search(root / f'planted-{algorithm}-{seed}', algorithm, seed)
            catalogue = catalogue_of([directory], SETTINGS)
            matched = {p[0]: next((m for m in catalogue.modes if _matches(m, p)), None) for p in PLANTED}
            recovered = sum(m is not None for m in matched.values())
            false = sum(1 for m in catalogue.modes if m not in matched.values())
            said = ', '.join(
                f'{p[1]} {next(c.value for c in m.conditions if c.feature.name == p[1]):.3f} ({p[3]:g})'
                for p in PLANTED
                if (m := matched[p[0]]) is not None
            )
            print(f'  {algorithm:9} {seed:>4} {len(catalogue.modes):>5} {recovered:>7}/2 {false:>5}  {said}')
            found['recovered'] += recovered
            found['planted'] += len(PLANTED)
            found['false'] += false
            found['runs'] += 1
            if algorithm == 'random':
                last = (directory, catalogue)
    print(f'  recovered {found["recovered"]} of {found["planted"]} planted modes, '
          f'{found["false"]} false modes in {found["runs"]} runs')  # fmt: skip
    checks.check(found['recovered'] == found['planted'], 'every planted mode recovered in every run')
    checks.check(found['false'] == 0, 'no false mode in any run')
    return {'directory': last[0], 'catalogue': last[1]}


def attribution(planted: dict, checks: Checks) -> None:
    print('\n2. Attribution mass in the region the double looks at (each mode: source and follow-up map)')
    header = f'{"region":11} {"method":14} {"maps":>4} {"share in region, min / median / max":>33}'
    print(f'  {header} {"frames":>7} {"s":>6}')
    least: dict[str, float] = {}
    for name, region in (('top-right', TOP_RIGHT), ('bottom-left', BOTTOM_LEFT)):
        for method, budget in (('gradients', 1000), ('occlusion', 1000), ('occlusion', 20)):
            backend = RegionBackend(region)
            started = time.perf_counter()
            maps = attribute_modes(
                planted['catalogue'], backend, map_settings_for(method=method, steps=32, budget=budget)
            )
            seconds = time.perf_counter() - started
            shares = [
                float(side.mass[region_mask(side.mass.shape, region)].sum())
                for made in maps.by_rank.values()
                for side in (made.source, made.followup)
            ]
            label = method if budget == 1000 else f'{method} {budget}'
            least[label] = min(least.get(label, 1.0), *shares)
            print(f'  {name:11} {label:14} {len(shares):>4} {fmt(shares, 100, 1) + " %":>33} '
                  f'{maps.frames_judged:>7} {seconds:>6.2f}')  # fmt: skip
    print('  (occlusion 20: 5 frames a map, a 2 x 2 grid whose cells are the quadrants; at the default\n'
          "  budget cells that straddle the quadrant's edges carry their mass half outside it)")  # fmt: skip
    for label, bound in (('gradients', 0.9), ('occlusion 20', 0.9), ('occlusion', 0.75)):
        said = f'{label}: each map puts >= {bound:.0%} of its mass in the region (least {least[label]:.1%})'
        checks.check(least[label] >= bound, said)


def _hour_record(rng, space_ids, frame_dark: bool, image: str, seed: int, index: int) -> dict:
    order = int(rng.integers(1, len(space_ids) + 1))
    chosen = sorted(rng.choice(len(space_ids), order, replace=False))
    parameters = {}
    for k in chosen:
        relation = RELATION_BY_ID[space_ids[k]]
        parameters[relation.id] = float(rng.uniform(relation.low, relation.high))
    composition = Composition.from_parameters(parameters)
    followup = dict(BASE)
    if frame_dark and parameters.get('rotation', 0.0) > ROTATION_DEG:
        followup['trash'] -= DROP
    if parameters.get('downsampling', 1.0) < DOWNSAMPLING_SCALE:
        followup['animal'] += RISE
    changes = {c: abs(followup[c] - BASE[c]) for c in BASE}
    violation = {
        key: any(d >= float(key) - 1e-12 for d in changes.values()) for key in ('0.01', '0.03', '0.05')
    }
    strength = {k: (sum(changes.values()) if v else None) for k, v in violation.items()}
    return {
        'model': 'fake-planted', 'backend': 'fake-planted', 'stamp_ns': 0, 'image': image,
        'algorithm': 'nsga2', 'seed': seed, 'working_size': 160, 'index': index, 'generation': index // 30,
        'genotype': [round(float(v), 9) for v in rng.uniform(0, 1, 2 * len(space_ids))],
        'composition': composition.label, 'order': composition.order, 'parameters': parameters,
        'f_trans': f_trans(composition), 'f_pred': float(sum(changes.values())), 'kind': 'confidence',
        'source': dict(BASE), 'followup': followup, 'source_text': '', 'followup_text': '',
        'violation': violation, 'strength': strength, 'cached': False, 'failed': False,
    }  # fmt: skip


def write_hour(directory: Path, searches: int, per_search: int) -> float:
    """A tester hour: `searches` frames (planted frames in turn), `per_search` evaluations each."""
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    space = SearchSpace.from_options(RELATIONS)
    config = SearchConfig(algorithm='nsga2', population=30, evaluations=per_search, seed=0, space=space)
    model = answered_model_identity('fake-planted', tuple(BASE), backend='fake-planted')
    lights = list(LIGHTS)
    with ResultsStore(directory, identity=identity_record(config, model)) as store:
        for i in range(searches):
            light = lights[i % len(lights)]
            frame = planted_frame(i, light)
            source_frame, sha = store.save_source(frame)
            image = f'camera@{i}'
            for index in range(per_search):
                store.append_evaluation(_hour_record(rng, RELATIONS, light == 'dark', image, 0, index))
                if index % 30 == 29:
                    store.flush()
            store.append_summary({
                'model': 'fake-planted', 'backend': 'fake-planted', 'image': image, 'algorithm': 'nsga2',
                'seed': 0, 'kind': 'confidence', 'source': dict(BASE), 'relations': list(RELATIONS),
                'evaluations': per_search, 'source_frame': source_frame, 'source_sha256': sha,
            })  # fmt: skip
            store.flush()
    return time.perf_counter() - started


def tester_hour(root: Path, args: argparse.Namespace, checks: Checks) -> None:
    total = args.searches * args.per_search
    print(f'\n3. A tester hour: {args.searches} searches x {args.per_search} evaluations = {total:,}')
    hour = root / 'hour'
    seconds = write_hour(hour, args.searches, args.per_search)
    size = sum(p.stat().st_size for p in hour.rglob('*') if p.is_file()) / 1e6
    print(f'  written in {seconds:.0f} s: {size:.1f} MB')
    # `metavlm modes` on the hour, as a user runs it: a process of its own, its peak memory.
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, '-m', 'metavlm_ros.cli', 'modes', str(hour), '--out', str(root / 'hour-modes')],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f'  metavlm modes: {wall:.1f} s wall, peak RSS {peak:.0f} MiB, exit {done.returncode}')
    print('    ' + '\n    '.join(done.stdout.strip().splitlines()))
    checks.check(done.returncode == 0, 'metavlm modes reads the hour')
    # The tester's bounded catalogue: the hour read streamed into a default sample, then learnt.
    started = time.perf_counter()
    tracker = ModeTracker(hour, SETTINGS, capacity=DEFAULT_SAMPLE)
    tracker.load()
    load_s = time.perf_counter() - started
    tracemalloc.start()  # again, traced (several times slower): what a tracker keeps, its sample
    traced = ModeTracker(hour, SETTINGS, capacity=DEFAULT_SAMPLE)
    traced.load()
    held = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    del traced
    learns = []
    for _ in range(args.repeats):
        tracker.pending = 1  # as after a new violation
        learns.append(tracker.learn())
    one = [
        _hour_record(np.random.default_rng(1), RELATIONS, True, 'next', 0, i) for i in range(args.per_search)
    ]
    started = time.perf_counter()
    tracker.add_search([{'image': 'next', 'algorithm': 'nsga2', 'seed': 0}], one)
    add_ms = (time.perf_counter() - started) * 1000
    learnt = learns[-1]
    print(f'  tester (modes_sample {DEFAULT_SAMPLE:,}): hour read streamed in {load_s:.1f} s, '
          f'{held:.0f} MiB kept; one search '
          f'handed over in {add_ms:.0f} ms; a catalogue of {learnt.sampled:,} evaluations in '
          f'{fmt([x.seconds for x in learns], 1, 2)} s (min / median / max of {args.repeats}); '
          f'{len(learnt.catalogue.modes)} modes')  # fmt: skip
    for rank, mode in enumerate(learnt.catalogue.modes, start=1):
        print(f'    {rank}. {mode.rule} ({mode.rate_inside:.1%} inside, {mode.rate_outside:.2%} outside)')
    whole = catalogue_of([hour], SETTINGS)
    same = [m.change.label for m in whole.modes] == [m.change.label for m in learnt.catalogue.modes]
    checks.check(same, 'the sample names the modes of the whole hour, in the same order')
    # The maps of the hour's modes by the demo CLIP, in process.
    from metavlm_ros.models.vlm import create_backend

    backend = create_backend('clip', 'demo', device='cpu')
    for method, options in (
        ('gradients', {'steps': 32, 'budget': 1000}),
        ('occlusion', {'steps': 32, 'budget': 1000}),
    ):
        started = time.perf_counter()
        maps = attribute_modes(whole, backend, map_settings_for(method=method, **options))
        seconds = time.perf_counter() - started
        count = 2 * len(maps.by_rank)
        print(f'  maps ({method}, demo CLIP): {len(maps.by_rank)} modes, {count} maps, {maps.frames_judged} '
              f'frames judged, {seconds:.1f} s ({seconds / max(1, count):.2f} s a map)')  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, default=3, help='planted runs per algorithm')
    parser.add_argument('--searches', type=int, default=153, help='searches in the tester hour')
    parser.add_argument('--per-search', type=int, default=3000, help='evaluations a search')
    parser.add_argument('--repeats', type=int, default=3, help='catalogues timed on the sample')
    args = parser.parse_args()
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='modes-bench-') as tmp:
        root = Path(tmp)
        planted = recovery(root, args.seeds, checks)
        attribution(planted, checks)
        tester_hour(root, args, checks)
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
