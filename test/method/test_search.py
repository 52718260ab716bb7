"""The search (method/search.py): one ask/tell loop, budget, seeding, batching, caching, failures, resume."""

import shutil

import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError, SearchInterrupted
from metavlm_ros.common.results import ResultsStore, free_disk_bytes, read_jsonl
from metavlm_ros.method.algorithms import ENVELOPE
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.metrics import hypervolume, non_dominated
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.method.search import (
    ALGORITHMS,
    SearchConfig,
    prepare_frame,
    run_search,
    summary_record,
)
from test.conftest import make_frame
from test.fakes import BlackCountBackend, ImageStatsBackend, UnreadableEvery


@pytest.mark.parametrize('algorithm', ALGORITHMS)
def test_budget_is_exact_and_each_generation_is_one_call(algorithm, frame):
    backend = ImageStatsBackend()
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=47, seed=3)
    result = run_search(frame, backend, config)
    assert len(result.evaluations) == 47
    assert [ev.index for ev in result.evaluations] == list(range(47))
    generations = max(ev.generation for ev in result.evaluations) + 1
    assert generations == 5  # 10+10+10+10+7
    # First call is the source frame alone; then at most one call per generation.
    assert backend.calls[0] == 1
    assert len(backend.calls) - 1 <= generations
    assert sum(backend.calls) == result.frames_judged


@pytest.mark.parametrize('algorithm', ALGORITHMS)
def test_same_seed_same_genotypes_other_seed_differs(algorithm, frame):
    config = SearchConfig(algorithm=algorithm, population=8, evaluations=40, seed=11)
    a = run_search(frame, ImageStatsBackend(), config)
    b = run_search(frame, ImageStatsBackend(), config)
    c = run_search(
        frame, ImageStatsBackend(), SearchConfig(algorithm=algorithm, population=8, evaluations=40, seed=12)
    )
    ga = np.array([ev.genotype for ev in a.evaluations])
    assert np.array_equal(ga, np.array([ev.genotype for ev in b.evaluations]))
    # The boundary search draws nothing: its magnitudes are set by the ranges and the answers.
    other_seed_differs = not np.array_equal(ga, np.array([ev.genotype for ev in c.evaluations]))
    assert other_seed_differs == (algorithm != ENVELOPE)
    assert a.hypervolume == b.hypervolume


@pytest.mark.parametrize('algorithm', ALGORITHMS)
def test_each_search_has_randomness_of_its_own(algorithm, frame):
    import threading

    config = SearchConfig(algorithm=algorithm, population=8, evaluations=40, seed=5)

    def genotypes(result):
        return np.array([ev.genotype for ev in result.evaluations])

    alone = genotypes(run_search(frame, ImageStatsBackend(), config))
    # numpy's global generator neither feeds a search nor is moved by one.
    np.random.seed(99)
    before = np.random.get_state()[1].copy()
    assert np.array_equal(genotypes(run_search(frame, ImageStatsBackend(), config)), alone)
    assert np.array_equal(np.random.get_state()[1], before)

    class Interleaving(ImageStatsBackend):
        """Hands over to the other search after every model call."""

        def __init__(self, turn: threading.Semaphore, other: threading.Semaphore):
            super().__init__()
            self.turn, self.other = turn, other

        def predict(self, frames):
            self.turn.acquire(timeout=10)
            try:
                return super().predict(frames)
            finally:
                self.other.release()

    # Two searches in one process, generations alternating: each gives what it gives alone.
    first, second = threading.Semaphore(1), threading.Semaphore(0)
    results = {}
    other = SearchConfig(algorithm=algorithm, population=8, evaluations=40, seed=6)
    threads = [
        threading.Thread(
            target=lambda: results.update(a=run_search(frame, Interleaving(first, second), config))
        ),
        threading.Thread(
            target=lambda: results.update(b=run_search(frame, Interleaving(second, first), other))
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert np.array_equal(genotypes(results['a']), alone)
    assert np.array_equal(genotypes(results['b']), genotypes(run_search(frame, ImageStatsBackend(), other)))


def test_source_prediction_is_computed_once_and_repeated_compositions_are_cached(frame):
    # Only CLAHE, clip limit pinned at 1.0: every active composition is the same follow-up frame.
    space = SearchSpace.from_options(
        enabled=['histogram_equalization'], ranges={'histogram_equalization': (1.0, 1.0)}
    )
    backend = ImageStatsBackend()
    result = run_search(
        frame, backend, SearchConfig(algorithm='random', population=10, evaluations=60, space=space)
    )
    active = [ev for ev in result.evaluations if ev.composition.order == 1]
    assert len(active) > 10
    assert result.frames_judged == 2  # the source and the one distinct follow-up
    assert sum(ev.cached for ev in active) == len(active) - 1
    # Every copy has the same objectives: none dominates another, all are on the front.
    assert result.pareto == [ev.index for ev in active]
    # MR3 at its nominal clip limit costs nothing yet still changes the image.
    assert all(ev.f_trans == 0 for ev in active)


def test_ties_on_the_front_are_all_kept_and_share_one_png(tmp_path, frame):
    space = SearchSpace.from_options(
        enabled=['histogram_equalization'], ranges={'histogram_equalization': (1.5, 1.5)}
    )
    config = SearchConfig(algorithm='nsga2', population=10, evaluations=30, space=space, seed=1)
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, ImageStatsBackend(), config, image_id='f', store=store)
    active = [ev.index for ev in result.evaluations if ev.composition.order == 1]
    assert len(active) > 1 and result.pareto == active
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    assert [p['index'] for p in pareto] == active
    assert len({p['frame'] for p in pareto}) == 1
    assert len(list((tmp_path / 'out' / 'frames').iterdir())) == 1


@pytest.mark.parametrize('warp', ['fused', 'sequential'])
def test_the_warp_setting_decides_how_follow_ups_are_resampled(warp, frame):
    judged = []

    class Spy(ImageStatsBackend):
        def predict(self, frames):
            judged.extend(frames)
            return super().predict(frames)

    config = SearchConfig(algorithm='random', population=10, evaluations=20, seed=3, warp=warp)
    result = run_search(frame, Spy(), config)
    assert result.warp == warp
    fresh = [ev for ev in result.evaluations if not ev.cached]
    assert len(judged) == 1 + len(fresh)
    fused_differs = 0
    for ev, followup in zip(fresh, judged[1:], strict=True):
        assert np.array_equal(followup, apply_composition(frame, ev.composition, fuse=warp == 'fused'))
        fused_differs += not np.array_equal(
            apply_composition(frame, ev.composition, fuse=True),
            apply_composition(frame, ev.composition, fuse=False),
        )
    assert fused_differs > 0  # the setting matters for some of these compositions


def test_each_evaluation_hands_over_the_pixels_it_judged_during_its_callback_only(frame):
    judged = []
    handed = {}

    class Spy(ImageStatsBackend):
        def predict(self, frames):
            judged.extend(frames)
            return super().predict(frames)

    def on_evaluation(ev, result):
        if ev.followup_frame is not None:
            handed[ev.index] = ev.followup_frame

    config = SearchConfig(algorithm='random', population=10, evaluations=20, seed=3, warp='sequential')
    prepared = prepare_frame(frame, config)
    result = run_search(prepared, Spy(), config, on_evaluation=on_evaluation)
    fresh = [ev for ev in result.evaluations if not ev.cached]
    # The same objects the model was given, one per evaluation that paid for a follow-up.
    assert len(judged) == 1 + len(fresh)
    assert all(handed[ev.index] is followup for ev, followup in zip(fresh, judged[1:], strict=True))
    assert set(handed) == {ev.index for ev in fresh}
    # Released once handed over: a search keeps no follow-up beyond its batch.
    assert all(ev.followup_frame is None for ev in result.evaluations)
    assert result.source_size == (frame.shape[1], frame.shape[0])


def test_a_prepared_frame_is_searched_as_it_is(frame):
    config = SearchConfig(algorithm='random', population=4, evaluations=4, working_size=32)
    prepared = prepare_frame(frame, config)
    assert max(prepared.rgb.shape[:2]) == 32
    assert prepared.source_size == (frame.shape[1], frame.shape[0])
    shapes = []

    class Spy(ImageStatsBackend):
        def predict(self, frames):
            shapes.extend(f.shape for f in frames)
            return super().predict(frames)

    result = run_search(prepared, Spy(), config)
    # Not brought to the working size a second time, and the size it came in with is recorded.
    assert set(shapes) == {prepared.rgb.shape}
    assert result.source_size == prepared.source_size and result.working_size == 32


def test_order_zero_is_never_a_violation(frame):
    space = SearchSpace.from_options(enabled=['rotation'])
    result = run_search(
        frame,
        ImageStatsBackend(),
        SearchConfig(algorithm='nsga2', population=10, evaluations=50, space=space),
    )
    identity = [ev for ev in result.evaluations if ev.composition.order == 0]
    assert identity, 'half the initial flags should be off'
    assert all(not any(ev.violation.values()) and ev.f_pred == 0 for ev in identity)


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_search_with_underwater_relations_has_their_genes_and_records_them(algorithm, frame):
    space = SearchSpace.from_options(enabled=['turbidity', 'marine_snow', 'rotation'])
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=60, seed=5, space=space)
    result = run_search(frame, ImageStatsBackend(), config)
    assert result.relations == ('rotation', 'turbidity', 'marine_snow')
    labels = set()
    for ev in result.evaluations:
        assert ev.genotype.shape == (6,)
        assert decode(ev.genotype, space) == ev.composition
        assert set(ev.composition.parameters) <= {'rotation', 'turbidity', 'marine_snow'}
        labels.add(ev.composition.label)
    assert {'{8}', '{9}'} & labels  # turbidity is MR8, marine snow MR9
    # f_trans reaches 3 with three relations: the hypervolume divides it by 3, not by 6.
    ft = np.array([ev.f_trans for ev in result.evaluations])
    fp = np.array([ev.f_pred for ev in result.evaluations])
    assert result.hypervolume == pytest.approx(hypervolume(ft, fp, 4, 3))
    assert summary_record(result)['relations'] == ['rotation', 'turbidity', 'marine_snow']


def test_failed_predictions_are_recorded_and_the_search_goes_on(frame):
    backend = ImageStatsBackend(fail_every=4)
    result = run_search(frame, backend, SearchConfig(algorithm='nsga2', population=10, evaluations=40))
    failed = [ev for ev in result.evaluations if ev.failed]
    assert failed and len(result.evaluations) == 40
    assert all(ev.f_pred == 0 and not any(ev.violation.values()) for ev in failed)
    assert all(i not in {ev.index for ev in failed} for i in result.pareto)


def test_objectives_and_front_are_consistent(frame):
    result = run_search(
        frame, ImageStatsBackend(), SearchConfig(algorithm='random', population=20, evaluations=100)
    )
    ft = np.array([ev.f_trans for ev in result.evaluations])
    fp = np.array([ev.f_pred for ev in result.evaluations])
    assert result.hypervolume == pytest.approx(hypervolume(ft, fp, 4))
    front = set(non_dominated(ft, fp))
    assert set(result.pareto) <= front
    for i in result.pareto:
        ev = result.evaluations[i]
        # No evaluation is strictly better on both objectives.
        assert not np.any((ft < ev.f_trans) & (fp > ev.f_pred))


def test_count_models_use_count_violations(frame):
    result = run_search(
        frame, BlackCountBackend(), SearchConfig(algorithm='nsga2', population=10, evaluations=60)
    )
    assert set(result.evaluations[0].violation) == {'count'}
    violating = [ev for ev in result.evaluations if ev.violation['count']]
    assert violating, 'rotation/shear/translation fill must change the black-pixel count'
    for ev in violating:
        d = abs(ev.followup.values['animal'] - result.source.values['animal'])
        assert ev.f_pred == pytest.approx(d / (d + 1))
        assert ev.strength['count'] == pytest.approx(d)


def test_resumed_search_writes_each_record_once(tmp_path, frame):
    config = SearchConfig(algorithm='nsga2', population=10, evaluations=50, seed=2)
    with ResultsStore(tmp_path / 'full') as store:
        run_search(frame, ImageStatsBackend(), config, image_id='f', store=store)
    generations = iter(range(100))
    with ResultsStore(tmp_path / 'cut') as store:
        cut = run_search(
            frame,
            ImageStatsBackend(),
            config,
            image_id='f',
            store=store,
            should_stop=lambda: next(generations) >= 2,
        )
    assert cut.stopped and len(read_jsonl(tmp_path / 'cut' / 'evaluations.jsonl')) == 20
    with ResultsStore(tmp_path / 'cut', resume=True) as store:
        run_search(frame, ImageStatsBackend(), config, image_id='f', store=store)
    # Record for record (the resumed store writes its search's header line again).
    assert read_jsonl(tmp_path / 'cut' / 'evaluations.jsonl') == read_jsonl(
        tmp_path / 'full' / 'evaluations.jsonl'
    )


def test_a_disk_reserve_larger_than_the_free_space_keeps_records_but_skips_pngs(tmp_path, frame):
    free = free_disk_bytes(tmp_path / 'not' / 'yet' / 'made')  # measured on the nearest existing parent
    assert abs(free - shutil.disk_usage(tmp_path).free) < 2**26  # other writers may move it a little
    config = SearchConfig(algorithm='nsga2', population=10, evaluations=30, seed=1, pareto_pngs='all')
    with ResultsStore(tmp_path / 'out', reserve_bytes=free * 1000) as store:
        result = run_search(frame, ImageStatsBackend(), config, image_id='f', store=store)
        assert store.low_on_space()
    assert result.pareto
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    # Every member's PNG and the source frame were skipped.
    assert len(pareto) + 1 == len(result.pareto) + 1 == store.frames_skipped
    assert all(p['frame'] is None for p in pareto)
    assert not (tmp_path / 'out' / 'frames').exists() and not (tmp_path / 'out' / 'sources').exists()
    assert 'source_frame' not in read_jsonl(tmp_path / 'out' / 'summary.jsonl')[0]
    assert len(read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')) == 30
    with ResultsStore(tmp_path / 'off', reserve_bytes=0) as store:
        assert not store.low_on_space()
        assert store.save_frame('x', frame).is_file()


def test_working_size_shrinks_the_frame_first():
    frame = make_frame(320, 200)
    seen = []

    class Spy(ImageStatsBackend):
        def predict(self, frames):
            seen.extend(f.shape for f in frames)
            return super().predict(frames)

    run_search(frame, Spy(), SearchConfig(algorithm='random', population=5, evaluations=10, working_size=80))
    assert set(seen) == {(50, 80, 3)}


def test_auto_working_size_follows_the_model_and_is_recorded(tmp_path):
    frame = make_frame(640, 360)
    seen = []

    class Spy(ImageStatsBackend):
        input_size = 100

        def predict(self, frames):
            seen.extend(f.shape for f in frames)
            return super().predict(frames)

    config = SearchConfig(algorithm='random', population=5, evaluations=10, working_size='auto')
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, Spy(), config, store=store)
    assert set(seen) == {(112, 200, 3)}
    assert result.working_size == 200 and result.source_size == (640, 360)
    records = read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')
    assert {r['working_size'] for r in records} == {200}
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['working_size'] == 200 and summary['source_size'] == [640, 360]
    # Full resolution stays available, and says so.
    full = run_search(frame, Spy(), SearchConfig(algorithm='random', population=5, evaluations=5))
    assert full.working_size == 640 and (360, 640, 3) in seen


@pytest.mark.parametrize(
    ('config', 'message'),
    [
        (SearchConfig(evaluations=0), 'evaluations'),
        (SearchConfig(evaluations=-5), 'evaluations'),
        (SearchConfig(population=1), 'population'),
        (SearchConfig(algorithm='tabu'), 'algorithm'),
        (SearchConfig(thresholds=(0.0,)), 'thresholds'),
        (SearchConfig(warp='bicubic'), 'warp'),
        (SearchConfig(working_size=-3), 'working size'),
        (SearchConfig(working_size='huge'), 'working size'),
    ],
)
def test_bad_configs_are_refused(config, message, frame):
    with pytest.raises(ParameterError, match=message):
        run_search(frame, ImageStatsBackend(), config)


@pytest.mark.parametrize('bad', [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.uint16), 'frame'])
def test_bad_frames_are_refused(bad):
    with pytest.raises(InputError):
        run_search(bad, ImageStatsBackend(), SearchConfig(evaluations=5, population=5))


def test_tiny_clip_search_end_to_end(tiny_clip_dir, frame):
    from metavlm_ros.models.vlm import create_backend

    backend = create_backend('clip', str(tiny_clip_dir), device='cpu')
    result = run_search(frame, backend, SearchConfig(algorithm='nsga2', population=8, evaluations=24, seed=0))
    assert len(result.evaluations) == 24
    assert result.source.kind == 'confidence' and set(result.source.values) == set(backend.classes)
    assert 0.0 <= result.hypervolume <= 1.0


class _InterruptedAt(ImageStatsBackend):
    """Raises SearchInterrupted on its n-th model call, as a node's probe endpoint does at shutdown."""

    def __init__(self, call: int):
        super().__init__()
        self.call = call

    def predict(self, frames):
        if len(self.calls) + 1 == self.call:
            raise SearchInterrupted('shutting down')
        return super().predict(frames)


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_an_interrupted_generation_is_dropped_and_the_search_finished(algorithm, tmp_path, frame):
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=100, seed=4)
    # call 1: the source; calls 2, 3: generations 0 and 1; call 4 (generation 2) is interrupted
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, _InterruptedAt(4), config, image_id='f', store=store)
    assert result.stopped
    assert len(result.evaluations) == 20
    assert len(read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')) == 20
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['stopped'] is True and summary['evaluations'] == 20
    assert len(read_jsonl(tmp_path / 'out' / 'pareto.jsonl')) == len(result.pareto) > 0


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_seeded_search_with_motion_blur_varies_its_angle_and_reproduces(algorithm, tmp_path, frame):
    space = SearchSpace.from_options(enabled=['rotation', 'motion_blur'])
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=60, seed=5, space=space)
    store = ResultsStore(tmp_path / 'r')
    result = run_search(frame, ImageStatsBackend(), config, store=store)
    blurred = [ev for ev in result.evaluations if ev.composition.active[9]]  # MR10
    angles = [ev.composition.parameters['motion_blur_angle'] for ev in blurred]
    assert len(blurred) >= 10 and len(set(angles)) >= 10
    assert min(angles) < -30 and max(angles) > 30  # both ways over [-90, 90]
    for ev in result.evaluations:
        assert ev.genotype.shape == (5,) and decode(ev.genotype, space) == ev.composition
    stored = read_jsonl(store.directory / 'evaluations.jsonl')
    assert [
        r['parameters'].get('motion_blur_angle') for r in stored if 'motion_blur' in r['parameters']
    ] == angles
    again = run_search(frame, ImageStatsBackend(), config)
    assert np.array_equal(
        np.array([ev.genotype for ev in result.evaluations]),
        np.array([ev.genotype for ev in again.evaluations]),
    )
    other = SearchConfig(algorithm=algorithm, population=10, evaluations=60, seed=6, space=space)
    assert [ev.composition for ev in run_search(frame, ImageStatsBackend(), other).evaluations] != [
        ev.composition for ev in result.evaluations
    ]


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_fixed_angle_range_holds_every_blur_of_the_search_and_is_its_identity(algorithm, frame):
    heave = SearchSpace.from_options(
        enabled=['motion_blur', 'turbidity'], ranges={'motion_blur_angle': (90, 90)}
    )
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=40, seed=2, space=heave)
    result = run_search(frame, ImageStatsBackend(), config)
    angles = {ev.composition.parameters.get('motion_blur_angle') for ev in result.evaluations}
    assert angles - {None} == {90.0}
    roaming = SearchSpace.from_options(enabled=['motion_blur', 'turbidity'])
    assert config.identity()['relations']['extras'] == {'motion_blur_angle': [90.0, 90.0]}
    assert SearchConfig(space=roaming).identity()['relations']['extras'] == {
        'motion_blur_angle': [-90.0, 90.0]
    }


def test_a_source_frame_whose_answer_does_not_parse_is_not_searched_and_says_why(tmp_path, frame):
    from metavlm_ros.common.results import ResultsStore, read_jsonl

    backend = UnreadableEvery(1000, source_unreadable=True)
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, backend, SearchConfig(population=6, evaluations=30, seed=3), store=store)
    assert result.evaluations == [] and backend.served == 1  # no evaluation spent on it
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['source_error'] == 'unparseable answer: not JSON' and summary['evaluations'] == 0
