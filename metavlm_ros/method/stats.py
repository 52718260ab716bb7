"""Statistics across repeated runs (docs/method.md §6): Mann-Whitney U, Vargha-Delaney A12, magnitudes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as _scipy_stats

from metavlm_ros.common.errors import ParameterError

__all__ = [
    'MAGNITUDES',
    'Comparison',
    'a12',
    'a12_magnitude',
    'compare',
    'mann_whitney_p',
    'significant_a12',
]

MAGNITUDES = ('negligible', 'small', 'medium', 'large')

# A12 values are rounded to this many decimals before they meet the band edges, so 14/25 computed
# through ranks (0.5599999...) falls in the same band as the decimal 0.56 it stands for.
_BAND_DECIMALS = 12


def _sample(values: ArrayLike, name: str) -> np.ndarray:
    sample = np.asarray(values, dtype=float).reshape(-1)
    if sample.size == 0:
        raise ParameterError(f'sample {name} is empty')
    if not np.all(np.isfinite(sample)):
        raise ParameterError(f'sample {name} holds a value that is not a finite number')
    return sample


def mann_whitney_p(a: ArrayLike, b: ArrayLike) -> float:
    """Two-sided Mann-Whitney U p-value of samples a and b (scipy.stats.mannwhitneyu).

    Samples whose values are all one and the same number cannot differ: p is 1.

    Raises:
        ParameterError: when a sample is empty or holds a non-finite value.
    """
    x, y = _sample(a, 'a'), _sample(b, 'b')
    if np.all(x == x[0]) and np.all(y == x[0]):
        return 1.0
    p = float(_scipy_stats.mannwhitneyu(x, y, alternative='two-sided').pvalue)
    return 1.0 if math.isnan(p) else min(p, 1.0)


def a12(a: ArrayLike, b: ArrayLike) -> float:
    """Vargha-Delaney A12: P(a > b) + 0.5 * P(a == b) over all pairs, computed from joint ranks.

    Raises:
        ParameterError: when a sample is empty or holds a non-finite value.
    """
    x, y = _sample(a, 'a'), _sample(b, 'b')
    m, n = x.size, y.size
    ranks = _scipy_stats.rankdata(np.concatenate((x, y)))  # ties share their mean rank
    return float((ranks[:m].sum() / m - (m + 1) / 2.0) / n)


def a12_magnitude(value: float) -> str:
    """The paper's magnitude of an A12 value.

    negligible (0.44, 0.56); small (0.34, 0.44] or [0.56, 0.64); medium (0.29, 0.34] or
    [0.64, 0.71); large [0, 0.29] or [0.71, 1].

    Raises:
        ParameterError: when the value is not a number in [0, 1].
    """
    try:
        v = round(float(value), _BAND_DECIMALS)
    except (TypeError, ValueError):
        raise ParameterError(f'an A12 value must be a number in [0, 1], got {value!r}') from None
    if not 0.0 <= v <= 1.0:
        raise ParameterError(f'an A12 value must be a number in [0, 1], got {value!r}')
    if 0.44 < v < 0.56:
        return 'negligible'
    if 0.34 < v <= 0.44 or 0.56 <= v < 0.64:
        return 'small'
    if 0.29 < v <= 0.34 or 0.64 <= v < 0.71:
        return 'medium'
    return 'large'


def _check_alpha(alpha: float) -> None:
    if not 0.0 < float(alpha) < 1.0:
        raise ParameterError(f'the significance level must lie in (0, 1), got {alpha!r}')


def significant_a12(m: int, n: int, alpha: float = 0.05) -> float | None:
    """The smallest A12 (>= 0.5) at which `mann_whitney_p` can call m runs against n significant.

    The two-sided test of untied samples depends on U = A12 * m * n alone, so the value is found by
    asking `mann_whitney_p` of samples built for each U in turn; by symmetry 1 minus it is the
    largest A12 significant the other way. With 5 runs against 5 it is 0.92 (p 0.032; 0.88 gives
    0.056): a frame where one approach wins 22 of the 25 pairs of runs is not significant. None
    when no outcome of that many runs can reach p < alpha (2 runs against 2). Tied values change
    the test (scipy then uses the normal approximation with a tie correction) and can make a
    smaller A12 significant: 5 equal values against 4 lower and 1 equal, A12 0.9, give p 0.02.

    Raises:
        ParameterError: when m or n is not a positive integer or alpha is not in (0, 1).
    """
    _check_alpha(alpha)
    for name, size in (('m', m), ('n', n)):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ParameterError(f'{name} must be a positive number of runs, got {size!r}')
    theirs = np.arange(n, dtype=float)
    found = None
    for u in range(m * n, (m * n - 1) // 2, -1):
        # Run i of the first sample sits above `above[i]` runs of the second; no value is shared.
        above = [min(n, max(0, u - n * i)) for i in range(m)]
        ours = np.asarray(above, float) - 0.5 + np.arange(m) / (2.0 * m)
        if mann_whitney_p(ours, theirs) >= alpha:
            break
        found = u / (m * n)
    return found


@dataclass
class Comparison:
    """The outcome of comparing two samples of repeated runs."""

    p: float
    a12: float
    magnitude: str
    significant: bool
    better: str  # 'first', 'second' or 'none'


def compare(
    a: Sequence[float] | ArrayLike,
    b: Sequence[float] | ArrayLike,
    alpha: float = 0.05,
    higher_is_better: bool = True,
) -> Comparison:
    """Compare two samples: Mann-Whitney p, A12 of a over b, its magnitude and which sample is better.

    A sample is better only when the difference is significant (p < alpha): with ``higher_is_better``
    (hypervolume, violation rate) 'first' when A12 > 0.5 and 'second' when A12 < 0.5; the other way
    round for objectives to minimise.

    Raises:
        ParameterError: when a sample is empty or not finite, or alpha is not in (0, 1).
    """
    _check_alpha(alpha)
    p = mann_whitney_p(a, b)
    effect = a12(a, b)
    significant = p < alpha
    better = 'none'
    if significant and effect != 0.5:
        first_higher = effect > 0.5
        better = 'first' if first_higher == higher_is_better else 'second'
    return Comparison(
        p=p, a12=effect, magnitude=a12_magnitude(effect), significant=significant, better=better
    )
