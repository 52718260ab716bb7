"""Tests of assurance statistics: rate bounds, samples to decide, quantile bounds, paired tests, Holm."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from metavlm_ros.assurance.stats import (
    MAX_SAMPLES,
    EnvelopeBounds,
    envelope_bounds,
    holm,
    judge_envelope,
    judge_rate,
    mcnemar_exact,
    quantile_bounds,
    rate_bounds,
    samples_to_decide,
    wilcoxon_paired,
)
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS
from metavlm_ros.method.envelope import Bracket

# --- rate_bounds, judge_rate --------------------------------------------------------------------------


def test_rule_of_three_bounds_straddle_one_percent():
    # Published: 0 violations in 299 samples bound the rate below 1 % at 95 %, 298 do not.
    assert rate_bounds(0, 299, 0.95)[1] < 0.01
    assert rate_bounds(0, 298, 0.95)[1] > 0.01


def test_zero_violations_upper_bound_is_closed_form():
    lower, upper = rate_bounds(0, 10, 0.95)
    assert lower == 0.0
    assert upper == pytest.approx(1 - 0.05 ** (1 / 10), rel=1e-12)


def test_all_violations_lower_bound_is_closed_form():
    lower, upper = rate_bounds(10, 10, 0.95)
    assert upper == 1.0
    assert lower == pytest.approx(0.05 ** (1 / 10), rel=1e-12)


def test_bounds_match_published_and_beta_quantiles():
    # One-sided 95 % Clopper-Pearson upper bound for 1 of 10, as in binomial tables: 0.3942.
    assert rate_bounds(1, 10, 0.95)[1] == pytest.approx(0.3942, abs=5e-5)
    lower, upper = rate_bounds(3, 50, 0.9)
    assert lower == pytest.approx(scipy_stats.beta.ppf(0.1, 3, 48), rel=1e-12)
    assert upper == pytest.approx(scipy_stats.beta.ppf(0.9, 4, 47), rel=1e-12)
    assert lower < 3 / 50 < upper


def test_judge_rate_statuses():
    assert judge_rate(0, 299, 0.01, 0.95) == PASS
    assert judge_rate(0, 298, 0.01, 0.95) == INCONCLUSIVE
    # lower bound of 10 / 100 at 95 %: Beta.ppf(0.05; 10, 91) = 0.0553 > 5 %.
    assert scipy_stats.beta.ppf(0.05, 10, 91) > 0.05
    assert judge_rate(10, 100, 0.05, 0.95) == FAIL
    assert judge_rate(9, 100, 0.05, 0.95) == INCONCLUSIVE


def test_judge_rate_passes_when_upper_bound_equals_limit():
    upper = rate_bounds(2, 40, 0.95)[1]
    assert judge_rate(2, 40, upper, 0.95) == PASS
    assert judge_rate(2, 40, math.nextafter(upper, 0.0), 0.95) == INCONCLUSIVE


@pytest.mark.parametrize(
    ('violations', 'samples', 'confidence', 'message'),
    [
        (-1, 10, 0.95, 'violations must be >= 0'),
        (11, 10, 0.95, 'cannot exceed samples'),
        (0, 0, 0.95, 'samples must be >= 1'),
        (1.5, 10, 0.95, 'whole number'),
        (1, 10, 0.0, 'confidence'),
        (1, 10, 1.0, 'confidence'),
    ],
)
def test_rate_arguments_are_checked(violations, samples, confidence, message):
    with pytest.raises(ValueError, match=message):
        rate_bounds(violations, samples, confidence)


def test_judge_rate_checks_limit():
    with pytest.raises(ValueError, match='limit'):
        judge_rate(0, 10, 1.5, 0.95)


# --- samples_to_decide ----------------------------------------------------------------------------


def _upper(rate: float, total: int, confidence: float) -> float:
    return scipy_stats.beta.ppf(confidence, rate * total + 1, total - rate * total)


def _lower(rate: float, total: int, confidence: float) -> float:
    return scipy_stats.beta.ppf(1 - confidence, rate * total, total - rate * total + 1)


def test_rule_of_three_samples_to_decide():
    assert samples_to_decide(0, 100, 0.01, 0.95) == 199
    assert samples_to_decide(0, 1, 0.01, 0.95) == 298
    assert samples_to_decide(0, 299, 0.01, 0.95) == 0


def test_samples_to_decide_towards_pass_with_violations():
    more = samples_to_decide(2, 100, 0.05, 0.95)
    assert judge_rate(2, 100, 0.05, 0.95) == INCONCLUSIVE
    total = 100 + more
    # The smallest total at which 2 % of it as violations puts the upper bound under 5 %.
    assert _upper(0.02, total, 0.95) <= 0.05 < _upper(0.02, total - 1, 0.95)
    # At a whole count near that total the integer bound agrees: 3 of 150 is still open, 4 of 200 passes.
    assert 150 < total <= 200
    assert judge_rate(3, 150, 0.05, 0.95) == INCONCLUSIVE
    assert judge_rate(4, 200, 0.05, 0.95) == PASS


def test_samples_to_decide_towards_fail():
    more = samples_to_decide(8, 100, 0.05, 0.95)
    total = 100 + more
    assert more > 0
    assert _lower(0.08, total, 0.95) > 0.05 >= _lower(0.08, total - 1, 0.95)


def test_samples_to_decide_when_decided_or_undecidable():
    assert samples_to_decide(20, 100, 0.05, 0.95) == 0  # already FAIL
    assert samples_to_decide(5, 100, 0.05, 0.95) is None  # the rate is the limit
    assert samples_to_decide(0, 10, 0.0, 0.95) is None
    # 0.0001 % below the limit would need about 7e11 samples, beyond the cap.
    assert samples_to_decide(499_999, 1_000_000, 0.5, 0.95) is None
    assert MAX_SAMPLES == 10**9


# --- quantile_bounds, envelope_bounds, judge_envelope ---------------------------------------------


def test_median_bounds_of_thirty_are_the_textbook_order_statistics():
    # n = 30, median, 95 % one-sided: P(Bin(30, .5) >= 11) = 0.9506, P(Bin(30, .5) <= 19) = 0.9506,
    # and one rank further each falls below 0.95: x_(11) and x_(20).
    assert scipy_stats.binom.sf(10, 30, 0.5) >= 0.95 > scipy_stats.binom.sf(11, 30, 0.5)
    values = np.arange(1.0, 31.0)[::-1]  # order of the input must not matter
    assert quantile_bounds(values, [False] * 30, 0.5, 0.95) == (11.0, 20.0)


def test_too_few_frames_give_no_lower_bound():
    # 6 frames: P(some frame falls below the 5 % quantile) = 1 - 0.95**6 = 0.26 < 0.95.
    lower, upper = quantile_bounds([1.0] * 6, [False] * 6, 0.05, 0.95)
    assert lower is None
    assert upper == 1.0
    assert quantile_bounds([], [], 0.5, 0.95) == (None, None)


def test_lower_bound_covers_at_confidence_monte_carlo(rng):
    # 20,000 samples of 30 standard normal draws: the 20 % quantile's lower bound at 90 % must lie
    # below the true quantile in >= 90 % of them, less 4 standard errors of the estimate (0.0085).
    n, q, confidence, reps = 30, 0.2, 0.9, 20_000
    xi = scipy_stats.norm.ppf(q)
    draws = rng.standard_normal((reps, n))
    flags = [False] * n
    bounds = np.array([quantile_bounds(row, flags, q, confidence) for row in draws], dtype=float)
    lower_cover = np.mean(bounds[:, 0] <= xi)
    upper_cover = np.mean(bounds[:, 1] >= xi)
    tolerance = 4 * math.sqrt(confidence * (1 - confidence) / reps)
    assert lower_cover >= confidence - tolerance
    assert upper_cover >= confidence - tolerance
    # The bounds are the tightest the ranks allow: their coverage is the exact binomial figure.
    r = int(np.sum(np.sort(draws, axis=1) <= bounds[:, :1], axis=1)[0])
    assert lower_cover == pytest.approx(scipy_stats.binom.sf(r - 1, n, q), abs=tolerance)
    assert scipy_stats.binom.sf(r, n, q) < confidence


def test_censored_bounds_cover_monte_carlo(rng):
    # True boundaries normal, observed only up to the range's end 0.5 (about 31 % censored).
    n, q, confidence, reps, end = 30, 0.5, 0.9, 5_000, 0.5
    truth = rng.standard_normal((reps, n))
    seen, cut = np.minimum(truth, end), truth > end
    bounds = [quantile_bounds(row, flags, q, confidence) for row, flags in zip(seen, cut, strict=True)]
    lower = np.array([b[0] for b in bounds])
    uppers = [b[1] for b in bounds]
    tolerance = 4 * math.sqrt(confidence * (1 - confidence) / reps)
    assert np.mean(lower <= 0.0) >= confidence - tolerance
    assert np.mean([u is None or u >= 0.0 for u in uppers]) >= confidence - tolerance
    assert all(u is None or u < end for u in uppers)  # never the censored range end


def test_censored_value_never_becomes_the_upper_bound():
    # n = 10, median, 90 %: r = 3 (P(Bin >= 3) = 0.945) and s = 8 (P(Bin <= 7) = 0.945).
    values = np.arange(1.0, 11.0)
    flags = np.zeros(10, bool)
    assert quantile_bounds(values, flags, 0.5, 0.9) == (3.0, 8.0)
    flags[7] = True  # the 8th smallest is censored: the 8th smallest uncensored value is 9
    assert quantile_bounds(values, flags, 0.5, 0.9) == (3.0, 9.0)
    flags[8:] = True  # 7 uncensored values cannot give the 8th
    assert quantile_bounds(values, flags, 0.5, 0.9) == (3.0, None)


def test_censored_value_below_others_still_gives_a_lower_bound():
    # A censored 0.5 (true value >= 0.5) counts as an observation for the lower bound only.
    values = [0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    flags = [True] + [False] * 9
    assert quantile_bounds(values, flags, 0.5, 0.9) == (2.0, 8.0)


def test_quantile_arguments_are_checked():
    with pytest.raises(ValueError, match='one flag per value'):
        quantile_bounds([1.0, 2.0], [False], 0.5, 0.9)
    with pytest.raises(ValueError, match='finite'):
        quantile_bounds([1.0, math.nan], [False, False], 0.5, 0.9)
    with pytest.raises(ValueError, match='q must'):
        quantile_bounds([1.0], [False], 1.0, 0.9)
    with pytest.raises(ValueError, match='at_least'):
        judge_envelope([Bracket(1.0, None)], 0.5, math.inf, 0.9)
    with pytest.raises(ValueError, match='finite'):
        envelope_bounds([Bracket(math.nan, 1.0)], 0.5, 0.9)


def _points(values, censored):
    """Frames whose boundaries are known exactly (a degenerate bracket), or censored at the value."""
    return [Bracket(v, None if c else v) for v, c in zip(values, censored, strict=True)]


def test_judge_envelope_pass_fail_inconclusive():
    # 100 frames, q = 5 %, 95 %: r = 2 (P(Bin(100, .05) >= 2) = 0.963), s = 10 (P(Bin <= 9) = 0.972).
    values = np.linspace(0.1, 1.0, 100)
    frames = _points(values, [False] * 100)
    judged = judge_envelope(frames, 0.05, 0.1, 0.95)
    assert judged.status == PASS
    assert judged.bounds == EnvelopeBounds(
        lower=pytest.approx(values[1]), upper=pytest.approx(values[9]), lower_rank=2, upper_rank=10, n=100,
        censored=0,
    )  # fmt: skip
    assert judge_envelope(frames, 0.05, values[1], 0.95).status == PASS
    assert judge_envelope(frames, 0.05, values[2], 0.95).status == INCONCLUSIVE
    assert judge_envelope(frames, 0.05, values[9], 0.95).status == INCONCLUSIVE
    assert judge_envelope(frames, 0.05, values[10], 0.95).status == FAIL


def test_judge_envelope_of_six_frames_is_never_pass():
    # Six frames with no violation up to the range's end: too few for a 5 % quantile at 95 %.
    judged = judge_envelope([Bracket(1.0, None)] * 6, 0.05, 0.1, 0.95)
    assert judged.status == INCONCLUSIVE
    assert judged.bounds.lower is None and judged.bounds.upper is None
    assert (judged.bounds.n, judged.bounds.censored) == (6, 6)
    assert judge_envelope([Bracket(1.0, 1.0)] * 6, 0.05, 0.1, 0.95).status == INCONCLUSIVE


def test_judge_envelope_never_fails_on_censored_values():
    # Every frame censored at 0.1: the truth may be anywhere above, so the claim "0.5" is open.
    judged = judge_envelope([Bracket(0.1, None)] * 100, 0.05, 0.5, 0.95)
    assert judged.status == INCONCLUSIVE
    assert judged.bounds.upper is None and judged.bounds.censored == 100
    assert judge_envelope([Bracket(0.1, 0.1)] * 100, 0.05, 0.5, 0.95).status == FAIL


def test_envelope_bounds_take_the_lower_from_clean_ends_and_the_upper_from_violating_ends():
    # n = 10, median, 90 %: r = 3, s = 8. Each frame's boundary lies in (clean, violating]: the 3rd
    # smallest clean end and the 8th smallest violating end, whichever frames they come from.
    cleans = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    violating = [1.5, 1.4, 1.3, 1.2, 1.1, 1.05, 0.95, 0.85, 0.92, None]  # the last frame held
    frames = [Bracket(c, v) for c, v in zip(cleans, violating, strict=True)]
    bounds = envelope_bounds(frames, 0.5, 0.9)
    assert (bounds.lower, bounds.upper) == (0.3, 1.4)  # the 8th of 0.85 ... 1.5 (9 uncensored)
    assert (bounds.lower_rank, bounds.upper_rank, bounds.n, bounds.censored) == (3, 8, 10, 1)
    assert judge_envelope(frames, 0.5, 0.3, 0.9).status == PASS
    assert judge_envelope(frames, 0.5, 1.41, 0.9).status == FAIL
    assert judge_envelope(frames, 0.5, 1.0, 0.9).status == INCONCLUSIVE
    # q = 0, "on every one of these frames": the smallest ends, no confidence involved.
    every = envelope_bounds(frames, 0.0, 0.9)
    assert (every.lower, every.upper, every.lower_rank, every.upper_rank) == (0.1, 0.85, 1, 1)
    assert envelope_bounds([], 0.0, 0.9) == EnvelopeBounds(None, None, None, None, 0, 0)


def test_envelope_bounds_cover_interval_censored_boundaries_monte_carlo(rng):
    # True boundaries normal, seen only through brackets of a grid of step 0.25 (clean the grid point
    # below, violating the one above) and censored above 0.5: both bounds still cover at confidence.
    n, q, confidence, reps, end = 30, 0.5, 0.9, 5_000, 0.5
    truth = rng.standard_normal((reps, n))
    below = np.floor(truth / 0.25) * 0.25
    lower_cover = upper_cover = 0
    for row, low in zip(truth, below, strict=True):
        frames = [Bracket(min(c, end), None if t > end else c + 0.25) for t, c in zip(row, low, strict=True)]
        bounds = envelope_bounds(frames, q, confidence)
        lower_cover += bounds.lower is not None and bounds.lower <= 0.0
        upper_cover += bounds.upper is None or bounds.upper >= 0.0
    tolerance = 4 * math.sqrt(confidence * (1 - confidence) / reps)
    assert lower_cover / reps >= confidence - tolerance
    assert upper_cover / reps >= confidence - tolerance


# --- wilcoxon_paired, mcnemar_exact, holm --------------------------------------------------------


def test_wilcoxon_hand_computed():
    # All 5 differences positive: the exact two-sided p is 2 / 2**5.
    assert wilcoxon_paired([1, 2, 3, 4, 5], [2, 3, 4, 5, 7]) == (0.0, 0.0625)
    # Differences 1, -2, 3, 4, 5: R- = 2; sign patterns with R- <= 2: {}, {1}, {2}: p = 2 * 3 / 32.
    statistic, p = wilcoxon_paired([0, 0, 0, 0, 0], [1, -2, 3, 4, 5])
    assert statistic == 2.0
    assert p == pytest.approx(0.1875, abs=1e-12)


def test_wilcoxon_drops_zero_differences():
    # Two zero differences beside five positive ones: the same p as the five alone.
    assert wilcoxon_paired([3, 3, 1, 2, 3, 4, 5], [3, 3, 2, 3, 4, 5, 7]) == pytest.approx((0.0, 0.0625))


def test_wilcoxon_against_scipy(rng):
    base = rng.normal(size=60)
    candidate = base + rng.normal(0.3, 1.0, size=60)
    expected = scipy_stats.wilcoxon(candidate, base)
    statistic, p = wilcoxon_paired(base, candidate)
    assert statistic == pytest.approx(float(expected.statistic))
    assert p == pytest.approx(float(expected.pvalue), rel=1e-12)
    assert p < 0.05
    assert wilcoxon_paired(candidate, base) == pytest.approx((statistic, p))


def test_wilcoxon_all_zero_and_bad_input():
    assert wilcoxon_paired([0.2, 0.4], [0.2, 0.4]) == (0.0, 1.0)
    with pytest.raises(ValueError, match='length'):
        wilcoxon_paired([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match='empty'):
        wilcoxon_paired([], [])


def test_mcnemar_hand_computed():
    assert mcnemar_exact(0, 6) == pytest.approx(2 * 0.5**6, abs=1e-15)
    assert mcnemar_exact(6, 0) == pytest.approx(0.03125, abs=1e-15)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 1024, abs=1e-15)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0


def test_mcnemar_against_scipy():
    assert mcnemar_exact(7, 19) == pytest.approx(scipy_stats.binomtest(7, 26, 0.5).pvalue, rel=1e-12)
    with pytest.raises(ValueError, match='base_only'):
        mcnemar_exact(-1, 3)


def test_holm_hand_computed():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, 0.011]) == pytest.approx([0.02, 0.02])  # monotone
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped
    assert holm([0.2]) == [0.2]
    assert holm([]) == []
    with pytest.raises(ValueError, match='p-values'):
        holm([0.1, 1.2])
