"""The optimisers of the search (docs/method.md §7): NSGA-II (MetaVLM), the paper's Rand, pymoo's, mobo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from pymoo.algorithms.moo.moead import ParallelMOEAD
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.algorithms.moo.nsga3 import NSGA3
from pymoo.algorithms.moo.sms import SMSEMOA
from pymoo.algorithms.soo.nonconvex.random_search import RandomSearch
from pymoo.core.algorithm import Algorithm
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.sampling.rnd import FloatRandomSampling
from pymoo.util.display.multi import MultiObjectiveOutput
from pymoo.util.ref_dirs import get_reference_directions

from metavlm_ros.method.encoding import N_VAR, SearchSpace
from metavlm_ros.method.sampling import RandSampling, UniformSampling, rand_genotypes, uniform_genotypes

__all__ = [
    'ALGORITHM_FACTORIES',
    'ALGORITHMS',
    'ENVELOPE',
    'UniformSampling',
    'uniform_genotypes',
    'SearchSettings',
    'RandSampling',
    'rand_genotypes',
]


class SearchSettings(Protocol):
    """What an optimiser's factory reads of the search's configuration (a `SearchConfig`)."""

    population: int
    space: SearchSpace


# The authors' NSGA-II operator settings (docs/method.md §7): mutation touches one variable in
# n_var on average, 1/12 for the paper's six relations.
SBX_PROB, SBX_ETA = 0.9, 15
PM_PROB_VAR, PM_ETA = 1 / N_VAR, 10


def _nsga2(config: SearchSettings) -> Algorithm:
    return NSGA2(
        pop_size=config.population,
        sampling=FloatRandomSampling(),
        crossover=SBX(prob=SBX_PROB, eta=SBX_ETA),
        mutation=PM(prob=1.0, prob_var=1 / config.space.n_var, eta=PM_ETA),
        eliminate_duplicates=True,
    )


def _rand(config: SearchSettings) -> Algorithm:
    return RandomSearch(
        n_points_per_iteration=config.population,
        sampling=RandSampling(config.space),
        output=MultiObjectiveOutput(),
    )


def _uniform(config: SearchSettings) -> Algorithm:
    return RandomSearch(
        n_points_per_iteration=config.population,
        sampling=UniformSampling(config.space),
        output=MultiObjectiveOutput(),
    )


def _operators(config: SearchSettings) -> dict:
    """The paper's variation operators (those of its NSGA-II), shared by the other genetic algorithms."""
    return {
        'sampling': FloatRandomSampling(),
        'crossover': SBX(prob=SBX_PROB, eta=SBX_ETA),
        'mutation': PM(prob=1.0, prob_var=1 / config.space.n_var, eta=PM_ETA),
    }


def _directions(config: SearchSettings) -> np.ndarray:
    """One reference direction per individual, evenly spread over the two objectives (Das-Dennis)."""
    return get_reference_directions('das-dennis', 2, n_partitions=config.population - 1)


def _nsga3(config: SearchSettings) -> Algorithm:
    return NSGA3(
        ref_dirs=_directions(config),
        pop_size=config.population,
        eliminate_duplicates=True,
        **_operators(config),
    )


def _smsemoa(config: SearchSettings) -> Algorithm:
    # pymoo's SMS-EMOA makes a population of offspring per generation (one model call each) and
    # drops the least hypervolume contributors one by one: the (mu + mu) form of the steady state.
    return SMSEMOA(pop_size=config.population, eliminate_duplicates=True, **_operators(config))


def _moead(config: SearchSettings) -> Algorithm:
    # The parallel form asks for one offspring per subproblem at once: one model call a generation.
    # Neighbourhoods of a fifth of the population (20 of pymoo's 100 by default), at least 2.
    return ParallelMOEAD(
        _directions(config), n_neighbors=max(2, config.population // 5), **_operators(config)
    )


def _mobo(config: SearchSettings) -> Algorithm:
    # Imported here: mobo.py draws its first batch with this module's Rand.
    from metavlm_ros.method.mobo import MOBO

    return MOBO(config.space, config.population)


# One registry of algorithms: every caller reads it, one loop (_drive) runs them all. The paper's
# two come first; the others are pymoo's, with the same budget, population, operators and seed.
ALGORITHM_FACTORIES: dict[str, Callable[[SearchSettings], Algorithm]] = {
    'nsga2': _nsga2,
    'random': _rand,
    'nsga3': _nsga3,
    'smsemoa': _smsemoa,
    'moead': _moead,
    # Sample-efficient, for models whose every call is expensive (docs/method.md §7): a surrogate of
    # f_pred, f_trans exact, batches of `population`.
    'mobo': _mobo,
    # For acceptance criteria (assurance/): uniform samples of a region, and the boundary search of
    # method/envelope.py, which method/search.py drives itself (it needs each violation, not only
    # the objectives a pymoo algorithm is told).
    'uniform': _uniform,
}
ENVELOPE = 'envelope'
ALGORITHMS = (*ALGORITHM_FACTORIES, ENVELOPE)
