"""Statistics of assurance: exact bounds on violation rates and quantiles, paired tests, Holm's correction."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS
from metavlm_ros.method.envelope import Bracket

__all__ = [
    'MAX_SAMPLES',
    'EnvelopeBounds',
    'EnvelopeJudgement',
    'envelope_bounds',
    'holm',
    'judge_envelope',
    'judge_rate',
    'mcnemar_exact',
    'quantile_bounds',
    'rate_bounds',
    'samples_to_decide',
    'wilcoxon_paired',
]

#: The most samples in all `samples_to_decide` considers; a claim that needs more is called undecidable.
MAX_SAMPLES = 10**9


def _count(value: int, name: str) -> int:
    try:
        count = operator.index(value)
    except TypeError:
        raise ValueError(f'{name} must be a whole number, got {value!r}') from None
    if count < 0:
        raise ValueError(f'{name} must be >= 0, got {count}')
    return count


def _open_unit(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ValueError(f'{name} must lie strictly between 0 and 1, got {value!r}')
    return value


def _rate_args(violations: int, samples: int, confidence: float) -> tuple[int, int, float]:
    k, n = _count(violations, 'violations'), _count(samples, 'samples')
    if n < 1:
        raise ValueError('samples must be >= 1: no sample bounds no rate')
    if k > n:
        raise ValueError(f'violations ({k}) cannot exceed samples ({n})')
    return k, n, _open_unit(confidence, 'confidence')


def _limit(limit: float) -> float:
    limit = float(limit)
    if not 0.0 <= limit <= 1.0:
        raise ValueError(f'limit must lie in [0, 1] (a rate), got {limit!r}')
    return limit


def _bounds(k: float, n: float, confidence: float) -> tuple[float, float]:
    # Beta quantiles accept a real count k, which samples_to_decide relies on; at whole k these are
    # the Clopper-Pearson bounds.
    lower = 0.0 if k <= 0 else float(_scipy_stats.beta.ppf(1.0 - confidence, k, n - k + 1))
    upper = 1.0 if k >= n else float(_scipy_stats.beta.ppf(confidence, k + 1, n - k))
    return lower, upper


def _judge(lower: float, upper: float, limit: float) -> str:
    if upper <= limit:
        return PASS
    if lower > limit:
        return FAIL
    return INCONCLUSIVE


def rate_bounds(violations: int, samples: int, confidence: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) one-sided confidence bounds on a violation rate.

    Each bound holds on its own at `confidence` (two one-sided bounds, not one two-sided interval):
    lower = Beta.ppf(1 - confidence; k, n - k + 1), 0 when k == 0; upper = Beta.ppf(confidence;
    k + 1, n - k), 1 when k == n.

    Args:
        violations: k, the violating samples.
        samples: n, the samples drawn uniformly from the population the claim is about.
        confidence: The level of each bound, in (0, 1).

    Returns:
        (lower, upper).

    Raises:
        ValueError: when k < 0, k > n, n < 1 or confidence is not in (0, 1).
    """
    k, n, confidence = _rate_args(violations, samples, confidence)
    return _bounds(k, n, confidence)


def judge_rate(violations: int, samples: int, limit: float, confidence: float) -> str:
    """Judge the claim "the violation rate is <= limit".

    Returns:
        'PASS' when the upper bound is <= limit, 'FAIL' when the lower bound is > limit, else
        'INCONCLUSIVE' (bounds of `rate_bounds` at `confidence`).

    Raises:
        ValueError: as `rate_bounds`, or when limit is not in [0, 1].
    """
    k, n, confidence = _rate_args(violations, samples, confidence)
    return _judge(*_bounds(k, n, confidence), _limit(limit))


def samples_to_decide(violations: int, samples: int, limit: float, confidence: float) -> int | None:
    """How many more uniform samples would decide an inconclusive rate claim, if the observed rate held.

    With p = k / n observed, a total of N samples is taken to hold exactly p * N violations, a real
    number, put into the Clopper-Pearson Beta quantiles of `rate_bounds` as they stand (at whole
    p * N these are the exact bounds; at k == 0 it is 0 violations, the "rule of three": 0 of 299
    decides a 1 % limit at 95 %). Both bounds then close in on p monotonically as N grows (unlike
    round(p * N), whose steps make the verdict flicker), so doubling N from n and bisecting finds the
    smallest deciding N exactly.

    Args:
        violations: k, the violations observed so far.
        samples: n, the samples so far.
        limit: The claim's limit on the rate, in [0, 1].
        confidence: The level of each bound, in (0, 1).

    Returns:
        The smallest N minus n; 0 when the claim is already decided; None when p equals the limit
        (to 1e-12 relative: no number of samples decides) or when no N up to `MAX_SAMPLES` decides.

    Raises:
        ValueError: as `judge_rate`.
    """
    k, n, confidence = _rate_args(violations, samples, confidence)
    limit = _limit(limit)
    if _judge(*_bounds(k, n, confidence), limit) != INCONCLUSIVE:
        return 0
    rate = k / n
    if math.isclose(rate, limit, rel_tol=1e-12, abs_tol=0.0) or n >= MAX_SAMPLES:
        return None

    def decided(total: int) -> bool:
        return _judge(*_bounds(rate * total, total, confidence), limit) != INCONCLUSIVE

    undecided, deciding = n, min(2 * n, MAX_SAMPLES)
    while not decided(deciding):
        if deciding >= MAX_SAMPLES:
            return None
        undecided, deciding = deciding, min(2 * deciding, MAX_SAMPLES)
    while deciding - undecided > 1:
        middle = (undecided + deciding) // 2
        if decided(middle):
            deciding = middle
        else:
            undecided = middle
    return deciding - n


@functools.lru_cache(maxsize=256)
def _ranks(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """(r, s): the order statistics' ranks (1-based) of `quantile_bounds`, None where none gives one."""
    if n == 0:
        return None, None
    below = np.arange(n)  # r - 1 and s - 1 for r, s = 1..n
    # P(Binomial(n, q) >= r) falls as r grows; P(Binomial(n, q) <= s - 1) rises as s grows.
    lower_ok = np.flatnonzero(_scipy_stats.binom.sf(below, n, q) >= confidence)
    upper_ok = np.flatnonzero(_scipy_stats.binom.cdf(below, n, q) >= confidence)
    r = int(lower_ok[-1]) + 1 if lower_ok.size else None
    s = int(upper_ok[0]) + 1 if upper_ok.size else None
    return r, s


def _sample(values: Sequence[float], censored: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=float).reshape(-1)
    cut = np.asarray(censored, dtype=bool).reshape(-1)
    if x.shape != cut.shape:
        raise ValueError(f'{x.size} values but {cut.size} censoring flags: one flag per value')
    if not np.all(np.isfinite(x)):
        raise ValueError('values must be finite numbers')
    return x, cut


def quantile_bounds(
    values: Sequence[float], censored: Sequence[bool], q: float, confidence: float
) -> tuple[float | None, float | None]:
    """Distribution-free one-sided confidence bounds on the q-quantile xi_q, from order statistics.

    `values` are n independent draws of T, except that where `censored[i]` only T_i >= values[i] is
    known (right-censored: no violation up to the range's end). T_(j) is the j-th smallest true value.
    Lower: #{T_i <= xi_q} ~ Binomial(n, F(xi_q)), F(xi_q) >= q, so P(T_(r) <= xi_q) >= P(Bin(n, q) >= r);
    r is the largest rank with that >= confidence; the r-th smallest value, censored or not, is <= T_(r).
    Upper: #{T_i < xi_q} ~ Binomial(n, F(xi_q-)), F(xi_q-) <= q, so P(T_(s) >= xi_q) >= P(Bin(n, q) <= s-1);
    s is the smallest such rank; the s-th smallest uncensored value is >= T_(s), a censored one never is.

    Args:
        values: The observed values (censored ones at the point of censoring).
        censored: One flag per value: True where the true value is >= the value given.
        q: The quantile, in (0, 1).
        confidence: The level of each bound, in (0, 1).

    Returns:
        (lower, upper), each None when no order statistic gives it at `confidence` (too few values),
        and the upper one also when fewer than s values are uncensored.

    Raises:
        ValueError: when the lengths differ, a value is not finite, or q or confidence is not in (0, 1).
    """
    lower, upper, _ = _quantile_bounds(values, censored, q, confidence)
    return lower, upper


def _quantile_bounds(
    values: Sequence[float], censored: Sequence[bool], q: float, confidence: float
) -> tuple[float | None, float | None, dict]:
    x, cut = _sample(values, censored)
    r, s = _ranks(x.size, _open_unit(q, 'q'), _open_unit(confidence, 'confidence'))
    lower = float(np.partition(x, r - 1)[r - 1]) if r is not None else None
    exact = x[~cut]
    upper = float(np.partition(exact, s - 1)[s - 1]) if s is not None and s <= exact.size else None
    return lower, upper, {'lower_rank': r, 'upper_rank': s, 'n': int(x.size), 'censored': int(cut.sum())}


@dataclass(frozen=True)
class EnvelopeBounds:
    """Confidence bounds on a quantile of the boundary over frames, from the frames' brackets.

    `lower` / `upper`: the bounds (None where no order statistic gives one); `lower_rank`: r, among all
    frames' clean ends; `upper_rank`: s, among the uncensored frames' violating ends; `n`: frames;
    `censored`: how many of them held to where they were searched.
    """

    lower: float | None
    upper: float | None
    lower_rank: int | None
    upper_rank: int | None
    n: int
    censored: int


@dataclass(frozen=True)
class EnvelopeJudgement:
    """The status of an envelope claim and the bounds it rests on (`judge_envelope`)."""

    status: str
    bounds: EnvelopeBounds


def envelope_bounds(brackets: Sequence[Bracket], q: float, confidence: float) -> EnvelopeBounds:
    """Bounds on the q-quantile of a boundary over frames, each frame's boundary known by its bracket.

    Frame i's boundary T_i lies in (clean_i, violating_i], violating_i infinite where censored. As
    clean_i < T_i for every i, the r-th smallest clean end is <= T_(r): the lower bound of
    `quantile_bounds` on the clean ends (censored frames kept) is a lower bound of xi_q. As
    violating_i >= T_i, the s-th smallest violating end is >= T_(s): its upper bound on the violating
    ends (a censored frame never gives one) is an upper bound of xi_q. docs/assurance.md derives it.

    Args:
        brackets: One bracket per frame (a frame without evidence: Bracket(0.0, None)).
        q: The quantile, in [0, 1); 0 is a statement about these frames only, no population: the
            smallest clean end and the smallest violating end.
        confidence: The level of each bound, in (0, 1) (unused at q == 0).

    Raises:
        ValueError: A bracket's end is not finite, or q or confidence is out of range.
    """
    cleans = [b.clean for b in brackets]
    censored = [b.violating is None for b in brackets]
    violating = [b.point for b in brackets]
    if float(q) == 0.0:  # about these frames only: their smallest ends, no population to bound
        _sample(cleans, censored), _sample(violating, censored)  # the same checks as below
        lower = min(cleans, default=None)
        upper = min((v for v, c in zip(violating, censored, strict=True) if not c), default=None)
        ranks = (None if lower is None else 1, None if upper is None else 1)
        return EnvelopeBounds(lower, upper, *ranks, len(cleans), sum(censored))
    lower, _, counts = _quantile_bounds(cleans, censored, q, confidence)
    _, upper, _ = _quantile_bounds(violating, censored, q, confidence)
    return EnvelopeBounds(
        lower, upper, counts['lower_rank'], counts['upper_rank'], counts['n'], counts['censored']
    )


def judge_envelope(
    brackets: Sequence[Bracket], q: float, at_least: float, confidence: float
) -> EnvelopeJudgement:
    """Judge the claim "the boundary is >= at_least on >= (1 - q) of frames", i.e. xi_q >= at_least.

    Args:
        brackets: Each frame's bracket of its boundary (how far it goes before the first violation).
        q: The share of frames the claim may miss, in [0, 1) (0: every one of these frames).
        at_least: The boundary the claim promises.
        confidence: The level of each bound, in (0, 1).

    Returns:
        'PASS' when the lower bound of `envelope_bounds` is >= at_least, 'FAIL' when its upper bound
        is < at_least, else 'INCONCLUSIVE' (a missing bound decides nothing), with the bounds.

    Raises:
        ValueError: as `envelope_bounds`, or when at_least is not finite.
    """
    if not math.isfinite(float(at_least)):
        raise ValueError(f'at_least must be a finite number, got {at_least!r}')
    bounds = envelope_bounds(brackets, q, confidence)
    if bounds.lower is not None and bounds.lower >= at_least:
        status = PASS
    elif bounds.upper is not None and bounds.upper < at_least:
        status = FAIL
    else:
        status = INCONCLUSIVE
    return EnvelopeJudgement(status, bounds)


def _paired(base: Sequence[float], candidate: Sequence[float]) -> np.ndarray:
    a = np.asarray(base, dtype=float).reshape(-1)
    b = np.asarray(candidate, dtype=float).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f'paired samples differ in length: {a.size} base, {b.size} candidate')
    if a.size == 0:
        raise ValueError('paired samples are empty')
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError('paired samples must hold finite numbers')
    return b - a


def wilcoxon_paired(base: Sequence[float], candidate: Sequence[float]) -> tuple[float, float]:
    """Wilcoxon signed-rank test of paired values (scipy.stats.wilcoxon), two-sided.

    Zero differences are dropped (zero_method 'wilcox', scipy's default, named so a change of default
    does not move our p-values); method 'auto': exact without ties or zeros up to 50 pairs, all sign
    flips with them up to 13 pairs, else the normal approximation with continuity correction.

    Args:
        base: One value per item (image, cell) for the base model.
        candidate: The same items' values for the candidate model, in the same order.

    Returns:
        (statistic, p): the statistic min(R+, R-) and the two-sided p-value; (0.0, 1.0) when every
        difference is zero (nothing to rank: scipy would not answer).

    Raises:
        ValueError: when the lengths differ, the samples are empty or hold a non-finite value.
    """
    d = _paired(base, candidate)
    if not np.any(d):
        return 0.0, 1.0
    result = _scipy_stats.wilcoxon(d, zero_method='wilcox', alternative='two-sided', method='auto')
    return float(result.statistic), min(float(result.pvalue), 1.0)


def mcnemar_exact(base_only: int, candidate_only: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pairs.

    Args:
        base_only: b, the pairs where only the base model has the outcome (say, a violation).
        candidate_only: c, the pairs where only the candidate has it.

    Returns:
        The two-sided binomial test p-value of b successes in b + c trials at p = 0.5
        (scipy.stats.binomtest); 1.0 when b + c == 0.

    Raises:
        ValueError: when b or c is negative or not a whole number.
    """
    b, c = _count(base_only, 'base_only'), _count(candidate_only, 'candidate_only')
    if b + c == 0:
        return 1.0
    return min(float(_scipy_stats.binomtest(b, b + c, 0.5, alternative='two-sided').pvalue), 1.0)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order.

    The i-th smallest of m p-values becomes max over j <= i of (m - j + 1) * p_(j), capped at 1, so
    adjusted values keep the raw values' order; rejecting where adjusted <= alpha controls the
    family-wise error rate at alpha.

    Raises:
        ValueError: when a p-value is not a number in [0, 1].
    """
    p = np.asarray(p_values, dtype=float).reshape(-1)
    if np.any(np.isnan(p)) or np.any((p < 0.0) | (p > 1.0)):
        raise ValueError('p-values must be numbers in [0, 1]')
    m = p.size
    order = np.argsort(p, kind='stable')
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]
