"""The sample-efficient search (method/mobo.py): z-space, improvement, moves, budget, seed, quality."""

import numpy as np
import pytest

from metavlm_ros.common.results import ResultsStore
from metavlm_ros.method import mobo
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.metrics import hypervolume, non_dominated
from metavlm_ros.method.mobo import ZSpace, ehvi
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.method.surrogate import GaussianProcess
from test.conftest import make_frame
from test.fakes import BlackCountBackend, ImageStatsBackend, UnreadableEvery


@pytest.mark.parametrize('relations', ['paper', 'paper underwater'])
def test_z_space_gives_eq1_exactly_and_round_trips_through_decode(relations):
    space = SearchSpace.from_options(relations.split(), ranges={'rotation': (1.0, 4.0)})
    zs = ZSpace(space)
    rng = np.random.default_rng(0)
    low, high = space.bounds()
    genotypes = low + (high - low) * rng.random((200, space.n_var))
    active, z, extras = zs.split(genotypes)
    expected = [f_trans(decode(x, space)) for x in genotypes]
    assert np.allclose(zs.f_trans(active, z), expected, atol=1e-12)
    again = zs.join(active, z, extras)
    for x, y in zip(genotypes, again, strict=True):
        assert decode(x, space).key == decode(y, space).key  # equal to float noise: the same follow-up
    # A relation off is z 0; only CLAHE keeps a flag of its own (it changes a frame at its nominal).
    assert np.all(z[~active] == 0.0)
    assert list(zs.flagged) == [r == 'histogram_equalization' for r in space.enabled_ids]


def test_z_space_clips_into_a_range_that_narrows_away_from_nominal():
    space = SearchSpace.from_options(['rotation', 'scaling'], ranges={'rotation': (1.0, 4.0)})
    zs = ZSpace(space)
    x = zs.join(np.array([[True, True]]), np.array([[0.0, -2.0]]), np.empty((1, 0)))
    assert decode(x[0], space).parameters == {'rotation': 1.0, 'scaling': 0.7}


def test_z_space_sees_the_blur_direction_on_a_circle():
    # MR10's blur along -90 and along 90 degrees is the same blur: the surrogate's features agree;
    # along 0 degrees it differs, and at length 0 (the identity) no direction counts.
    space = SearchSpace.from_options(['paper', 'underwater'])
    zs = ZSpace(space)
    blur = space.enabled_ids.index('motion_blur')
    active = np.zeros((4, zs.n), dtype=bool)
    active[:, blur] = True
    z = np.zeros((4, zs.n))
    z[:3, blur] = 0.5
    features = zs.features(active, z, np.array([[-90.0], [90.0], [0.0], [45.0]]))
    assert np.allclose(features[0], features[1], atol=1e-12)
    assert not np.allclose(features[0], features[2])
    assert np.allclose(features[3], 0.0)
    # A move that drops the blur keeps its length: the row is then no blur at all, as judged.
    assert np.allclose(zs.features(np.zeros_like(active[:1]), z[:1], np.array([[30.0]])), 0.0)


def test_ehvi_is_the_exact_improvement_when_f_pred_is_known():
    rng = np.random.default_rng(1)
    t, p = rng.random(30) * 6, rng.random(30) * 2
    keep = non_dominated(t, p)
    front = np.column_stack([t[keep], p[keep]])
    candidates_t, candidates_p = rng.random(50) * 6, rng.random(50) * 2.5
    got = ehvi(candidates_t, candidates_p, np.full(50, 1e-12), front, 6.0)
    base = hypervolume(t, p, 3, 6)
    for ct, cp, g in zip(candidates_t, candidates_p, got, strict=True):
        # hypervolume() divides f_trans by 6 and f_pred by 3: in raw units the improvement is 18 times larger.
        want = 18.0 * (hypervolume(np.append(t, ct), np.append(p, cp), 3, 6) - base)
        assert g == pytest.approx(want, abs=1e-9)


def test_ehvi_rewards_uncertainty_where_the_mean_covers_nothing():
    front = np.array([[1.0, 1.0]])
    sure, unsure = ehvi(np.array([2.0, 2.0]), np.array([0.5, 0.5]), np.array([1e-9, 0.5]), front, 6.0)
    assert sure == pytest.approx(0.0, abs=1e-9) and unsure > 0.1


@pytest.mark.parametrize('evaluations', [95, 60])
def test_budget_batches_and_seed_as_every_algorithm(evaluations):
    def run(seed):
        backend = ImageStatsBackend()
        config = SearchConfig(algorithm='mobo', population=10, evaluations=evaluations, seed=seed)
        return backend, run_search(make_frame(48, 36), backend, config)

    backend, first = run(3)
    _, again = run(3)
    _, other = run(4)
    assert len(first.evaluations) == evaluations
    # One model call per batch of the population, the last cut to what is left; the source first.
    assert backend.calls[0] == 1 and all(n <= 10 for n in backend.calls[1:])
    assert [ev.generation for ev in first.evaluations] == [i // 10 for i in range(evaluations)]
    genotypes = np.array([ev.genotype for ev in first.evaluations])
    assert np.array_equal(genotypes, [ev.genotype for ev in again.evaluations])
    assert not np.array_equal(genotypes, [ev.genotype for ev in other.evaluations])
    low, high = SearchSpace.default().bounds()
    assert np.all(genotypes >= low - 1e-9) and np.all(genotypes <= high + 1e-9)
    # No proposal is the identity (f_pred 0 for sure).
    assert all(ev.composition.order > 0 for ev in first.evaluations)
    # Half the first batch is relations alone, first at the ends of their ranges; the rest Rand.
    assert [ev.composition.parameters for ev in first.evaluations[:5]] == [
        {'rotation': -5.0},
        {'rotation': 5.0},
        {'scaling': 0.7},
        {'scaling': 1.3},
        {'histogram_equalization': 2.0},
    ]


def test_records_and_identity_as_the_other_algorithms(tmp_path):
    from metavlm_ros.common.results import read_jsonl

    records = {}
    for algorithm in ('mobo', 'nsga2'):
        config = SearchConfig(algorithm=algorithm, population=10, evaluations=40, seed=0)
        with ResultsStore(tmp_path / algorithm) as store:
            run_search(make_frame(48, 36), BlackCountBackend(), config, store=store)
        records[algorithm] = read_jsonl(tmp_path / algorithm / 'evaluations.jsonl')
        assert config.identity()['algorithm'] == algorithm
    assert len(records['mobo']) == 40
    # The same record, field for field; only what the algorithm chose differs.
    assert {tuple(sorted(r)) for r in records['mobo']} == {tuple(sorted(r)) for r in records['nsga2']}
    assert {r['algorithm'] for r in records['mobo']} == {'mobo'}


def test_underwater_relations_with_extras_are_searched():
    space = SearchSpace.from_options(['paper', 'underwater'])
    config = SearchConfig(algorithm='mobo', population=10, evaluations=50, seed=1, space=space)
    result = run_search(make_frame(48, 36), ImageStatsBackend(), config)
    assert len(result.evaluations) == 50
    assert any(
        set(ev.composition.parameters) - {r for r in space.enabled_ids[:6]} for ev in result.evaluations
    )


def test_training_set_is_bounded_and_keeps_the_front(monkeypatch):
    monkeypatch.setattr(mobo, 'MAX_TRAINING', 20)
    algorithm = mobo.MOBO(SearchSpace.default(), 10)
    rng = np.random.default_rng(2)
    x = rng.random((100, 12))
    active, z, extras = algorithm.z.split(x)
    f_pred = rng.random(100)
    rows = algorithm._training(active, z, extras, f_pred)
    assert len(rows) == 20
    front = non_dominated(algorithm.z.f_trans(active, z), f_pred)
    assert len(front) <= 10 and set(front) <= set(rows.tolist())
    assert set(range(90, 100)) <= set(rows.tolist())  # the latest evaluations


def test_mobo_at_a_tenth_of_the_budget_matches_nsga2():
    # Only black fill and colour statistics move the fake model; 300 evaluations of mobo reach what
    # NSGA-II reaches in 1,500 (and beat NSGA-II at 300) on every seed.
    frame = make_frame(96, 72, seed=5)
    for seed in range(2):
        found = {}
        for algorithm, evaluations in (('mobo', 300), ('nsga2', 300), ('nsga2', 1500)):
            config = SearchConfig(algorithm=algorithm, evaluations=evaluations, seed=seed)
            found[algorithm, evaluations] = run_search(frame, ImageStatsBackend(), config).hypervolume
        assert found['mobo', 300] > found['nsga2', 300]
        assert found['mobo', 300] >= 0.995 * found['nsga2', 1500]


def _fits(monkeypatch, optimised: list[bool] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every (features, f_pred) the surrogate is fitted on, in order (and in `optimised`, whether
    each fit optimised the hyperparameters)."""
    fits = []
    fit = GaussianProcess.fit

    def recording(self, X, y, optimise=True):
        before = self.n_optimised_
        fits.append((X.copy(), y.copy()))
        found = fit(self, X, y, optimise=optimise)
        if optimised is not None:
            optimised.append(self.n_optimised_ > before)
        return found

    monkeypatch.setattr(GaussianProcess, 'fit', recording)
    return fits


def test_hyperparameters_are_refitted_every_batch_then_every_third(monkeypatch):
    # 300 evaluations at population 30 refit every batch (what every quality figure measured); a
    # longer search refits every third batch after the tenth, and conditions on every batch.
    optimised: list[bool] = []
    fits = _fits(monkeypatch, optimised)
    config = SearchConfig(algorithm='mobo', population=10, evaluations=200, seed=0)
    result = run_search(make_frame(48, 36), ImageStatsBackend(), config)
    assert len(result.evaluations) == 200 and len(fits) == 19
    assert optimised == [True] * 10 + [batch % 3 == 0 for batch in range(11, 20)]
    assert [len(y) for _, y in fits] == [10 * batch for batch in range(1, 20)]


def test_failed_evaluations_are_recorded_but_never_learnt(monkeypatch):
    # Every third follow-up's answer does not parse: the search records it (failed, f_pred 0) and
    # the surrogate is fitted on the answers that parsed only, not on a failure read as "no change".
    fits = _fits(monkeypatch)
    config = SearchConfig(algorithm='mobo', population=10, evaluations=60, seed=0)
    result = run_search(make_frame(48, 36), UnreadableEvery(3), config)
    failed = np.array([ev.failed for ev in result.evaluations])
    assert len(result.evaluations) == 60 and 0 < failed.sum() < 60
    assert all(ev.f_pred == 0.0 for ev in result.evaluations if ev.failed)
    assert len(fits) == 5  # before each batch after the first
    zs = ZSpace(config.space)
    for batch, (x, y) in enumerate(fits, start=1):
        judged = result.evaluations[: 10 * batch]
        parsed = [ev for ev in judged if not ev.failed]
        assert len(y) == len(parsed) < len(judged)
        assert np.allclose(y, [ev.f_pred for ev in parsed])
        assert np.allclose(x, zs.features(*zs.split(np.array([ev.genotype for ev in parsed]))))


def test_a_search_whose_every_answer_fails_goes_on_with_rand(monkeypatch):
    fits = _fits(monkeypatch)
    config = SearchConfig(algorithm='mobo', population=10, evaluations=30, seed=0)
    result = run_search(make_frame(48, 36), UnreadableEvery(1), config)
    assert len(result.evaluations) == 30 and all(ev.failed for ev in result.evaluations)
    assert fits == [] and result.pareto == [] and result.hypervolume == 0.0


@pytest.mark.parametrize('relations', ['paper', 'paper underwater'])
def test_initial_design_holds_every_relation_alone_at_each_end_then_inside(relations):
    space = SearchSpace.from_options(relations.split())
    algorithm = mobo.MOBO(space, 40)
    algorithm.random_state = np.random.default_rng(0)
    zs = algorithm.z
    active, z, _ = zs.split(algorithm.one_at_a_time(40))
    assert np.all(active.sum(axis=1) == 1)
    ends = {(k, e) for k in range(zs.n) for e in (zs.z_low[k], zs.z_high[k]) if e != 0.0}
    n_ends = len(ends)  # 10 for the paper's six (CLAHE and downsampling go one way), 15 with underwater
    assert n_ends == (10 if relations == 'paper' else 15)
    first = {(int(np.flatnonzero(a)[0]), float(z[i, a][0])) for i, a in enumerate(active[:n_ends])}
    assert first == {(k, float(e)) for k, e in ends}
    # Then inside the ranges, every relation in turn.
    inside = z[n_ends:][active[n_ends:]]
    assert list(np.argmax(active[n_ends:], axis=1)) == [i % zs.n for i in range(40 - n_ends)]
    assert np.all(np.abs(inside) < 1.0)


def test_candidates_merge_two_members_of_the_front():
    # A slight zoom-out alone and rotation alone on the front: their union, each at its own
    # deviation, is a candidate (effects that add up are reached in one move).
    algorithm = mobo.MOBO(SearchSpace.default(), 10)
    algorithm.random_state = np.random.default_rng(0)
    active = np.zeros((2, 6), dtype=bool)
    active[0, 0] = active[1, 1] = True
    z = np.zeros((2, 6))
    z[0, 0], z[1, 1] = 0.3, -0.05
    ca, cz, _ = algorithm._candidates(active, z, np.empty((2, 0)), np.array([0, 1]))
    union = np.all(ca == [True, True, False, False, False, False], axis=1)
    assert np.any(union & np.all(np.isclose(cz, [0.3, -0.05, 0, 0, 0, 0]), axis=1))


@pytest.mark.parametrize('move', mobo.MOVES, ids=lambda move: move.__name__)
def test_each_move_changes_the_rows_it_is_given_only(move):
    space = SearchSpace.from_options(['paper', 'underwater'])
    zs = ZSpace(space)
    rng = np.random.default_rng(0)
    low, high = space.bounds()
    judged = zs.split(low + (high - low) * rng.random((20, space.n_var)))
    front_rows = np.array([0, 3, 7])
    base = rng.choice(front_rows, size=60)
    copies = (part[base].copy() for part in judged)
    moved = mobo.Neighbours(*copies, rng.integers(0, zs.n, 60), zs, rng, judged, front_rows)
    rows = rng.random(60) < 0.5
    before = moved.active.copy(), moved.z.copy(), moved.extras.copy()
    move(moved, rows)
    after = moved.active, moved.z, moved.extras
    assert all(np.array_equal(a[~rows], b[~rows]) for a, b in zip(after, before, strict=True))
    assert any(not np.array_equal(a[rows], b[rows]) for a, b in zip(after, before, strict=True))
