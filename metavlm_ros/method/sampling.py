"""Random genotypes of a search space: the paper's Rand, and uniform samples of a region."""

from __future__ import annotations

import numpy as np
from pymoo.core.sampling import Sampling

from metavlm_ros.method.encoding import SearchSpace

__all__ = ['RandSampling', 'UniformSampling', 'rand_genotypes', 'uniform_genotypes']


class RandSampling(Sampling):
    """The paper's Rand: order k uniform in 1..n, a uniformly random k-subset, uniform parameters.

    n is the number of relations the search space enables (6 by default), so every order gets
    about 1/n of the budget and the identity is never drawn. Genotypes are ordinary genotypes of
    the space (flags 1.0 / 0.0, parameters and extras uniform in the space's ranges): `decode` turns
    them into compositions applied in the fixed relation order, exactly as for NSGA-II.
    """

    def __init__(self, space: SearchSpace):
        super().__init__()
        self.space = space

    def _do(self, problem, n_samples, *args, random_state=None, **kwargs) -> np.ndarray:
        return rand_genotypes(self.space, int(n_samples), random_state)


def rand_genotypes(space: SearchSpace, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` genotypes of the paper's Rand (docs/method.md §7) drawn with `rng`."""
    enabled = space.indices
    orders = rng.integers(1, enabled.size + 1, size=n)
    # A uniformly random k-subset: the k enabled relations with the smallest random keys.
    keys = rng.random((n, enabled.size))
    rank = np.argsort(np.argsort(keys, axis=1), axis=1)
    low, high = np.asarray(space.low, float)[enabled], np.asarray(space.high, float)[enabled]
    genotypes = np.empty((n, space.n_var))
    m = 2 * enabled.size
    genotypes[:, 0:m:2] = rank < orders[:, None]
    genotypes[:, 1:m:2] = low + (high - low) * rng.random((n, enabled.size))
    if m < space.n_var:
        # The extras (MR10's angle), uniform in their ranges; drawn last, so a space without them
        # draws exactly what it drew before there were any.
        extra_low, extra_high = space.extra_bounds()
        genotypes[:, m:] = extra_low + (extra_high - extra_low) * rng.random((n, space.n_var - m))
    return genotypes


class UniformSampling(Sampling):
    """Uniform samples of a region: every relation the space enables active, each parameter (and
    extra) uniform in the space's range. With the relations and ranges of an acceptance criterion's
    region, the rate of violations among them estimates that region's violation rate without bias (a
    search's records do not: it goes where violations are)."""

    def __init__(self, space: SearchSpace):
        super().__init__()
        self.space = space

    def _do(self, problem, n_samples, *args, random_state=None, **kwargs) -> np.ndarray:
        return uniform_genotypes(self.space, int(n_samples), random_state)


def uniform_genotypes(space: SearchSpace, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` genotypes of `UniformSampling` drawn with `rng`."""
    low, high = space.bounds()
    genotypes = low + (high - low) * rng.random((n, space.n_var))
    genotypes[:, 0 : 2 * space.indices.size : 2] = 1.0
    return genotypes
