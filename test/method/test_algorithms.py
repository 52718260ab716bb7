"""The optimiser registry (method/algorithms.py): every algorithm, the paper's Rand, NSGA-II against Rand."""

from collections import Counter

import numpy as np
import pytest

from metavlm_ros.method.algorithms import ALGORITHMS, ENVELOPE, rand_genotypes
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.method.stats import a12
from test.conftest import make_frame
from test.fakes import ImageStatsBackend


def test_every_algorithm_is_registered_and_runs_the_papers_budget_by_default():
    assert ALGORITHMS[:2] == ('nsga2', 'random') and {'nsga3', 'smsemoa', 'moead', 'mobo'} <= set(ALGORITHMS)
    for algorithm in ALGORITHMS:
        if algorithm == ENVELOPE:
            continue  # it ends once every boundary is bracketed (test/method/test_envelope.py)
        if algorithm == 'mobo':
            continue  # made for budgets of hundreds; its exact budget is test/method/test_mobo.py's
        backend = ImageStatsBackend()
        result = run_search(make_frame(32, 24), backend, SearchConfig(algorithm=algorithm, seed=1))
        # Population 30, 3000 evaluations: 100 generations, one model call each at most.
        assert len(result.evaluations) == 3000, algorithm
        assert max(ev.generation for ev in result.evaluations) == 99
        assert len(backend.calls) <= 101


def test_rand_draws_each_order_about_equally_and_never_the_identity():
    # The paper's Rand (Table 5: about 16.7% per order): k uniform in 1..6, then a k-subset.
    genotypes = rand_genotypes(SearchSpace.default(), 60_000, np.random.default_rng(0))
    orders = np.array([decode(x).order for x in genotypes])
    share = np.bincount(orders, minlength=7) / orders.size
    assert share[0] == 0
    assert np.all(np.abs(share[1:] - 1 / 6) < 0.01), share
    # Within an order every subset is equally likely: the 15 pairs of order 2 share it evenly.
    pairs = Counter(decode(x).label for x, k in zip(genotypes, orders, strict=True) if k == 2)
    assert len(pairs) == 15
    assert max(pairs.values()) / min(pairs.values()) < 1.25
    # Parameters are uniform in their ranges: rotation angles of active MR1 fill [-5, 5] evenly.
    angles = genotypes[genotypes[:, 0] > 0.5, 1]
    assert np.histogram(angles, bins=5, range=(-5, 5))[0].min() > 0.18 * angles.size


def test_rand_as_run_by_the_search_never_judges_the_identity():
    result = run_search(
        make_frame(32, 24),
        ImageStatsBackend(),
        SearchConfig(algorithm='random', population=30, evaluations=600, seed=4),
    )
    orders = Counter(ev.composition.order for ev in result.evaluations)
    assert 0 not in orders and set(orders) == {1, 2, 3, 4, 5, 6}
    assert min(orders.values()) > 60  # about 100 each; a binomial draw gives order 6 about 9


def test_rand_orders_follow_the_enabled_relations():
    space = SearchSpace.from_options(enabled=['rotation', 'shear', 'translation'])
    genotypes = rand_genotypes(space, 3000, np.random.default_rng(1))
    compositions = [decode(x, space) for x in genotypes]
    share = np.bincount([c.order for c in compositions], minlength=4) / len(compositions)
    assert share[0] == 0 and np.all(np.abs(share[1:] - 1 / 3) < 0.03)
    assert all(not (c.active[1] or c.active[2] or c.active[3]) for c in compositions)


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_nsga2_and_rand_search_the_same_space(algorithm):
    # Both hand the same genotypes (a flag and a value per enabled relation) to the same decode().
    space = SearchSpace.from_options(
        enabled=['rotation', 'histogram_equalization', 'shear'], ranges={'rotation': (-2.0, 3.0)}
    )
    xl, xu = space.bounds()
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=60, seed=2, space=space)
    result = run_search(make_frame(32, 24), ImageStatsBackend(), config)
    for ev in result.evaluations:
        assert np.all(ev.genotype >= xl - 1e-9) and np.all(ev.genotype <= xu + 1e-9)
        assert decode(ev.genotype, space) == ev.composition
        assert set(ev.composition.parameters) <= {'rotation', 'histogram_equalization', 'shear'}
        assert -2.0 <= ev.composition.values[0] <= 3.0


def test_nsga2_beats_random_search_where_it_must():
    # Only black fill moves the fake model: cheap geometric changes exist, and Rand spends five
    # sixths of its budget on compositions of order 2-6. Given 600 evaluations NSGA-II refines the
    # cheap end of the front that Rand only samples (at 300 Rand still wins one seed in six).
    frame = make_frame(96, 72, seed=5)
    hv = {'nsga2': [], 'random': []}
    for seed in range(6):
        for algorithm in hv:
            config = SearchConfig(algorithm=algorithm, population=20, evaluations=600, seed=seed)
            hv[algorithm].append(run_search(frame, ImageStatsBackend(), config).hypervolume)
    assert np.mean(hv['nsga2']) > np.mean(hv['random'])
    assert a12(hv['nsga2'], hv['random']) >= 0.75
