"""Tests of the run statistics: Mann-Whitney p-values, A12 and the paper's magnitude bands."""

import math

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.stats import a12, a12_magnitude, compare, mann_whitney_p, significant_a12


def test_mann_whitney_exact_p_values_by_hand():
    # Fully separated samples of 5: only 2 of the C(10, 5) = 252 rank splits are as extreme.
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    # Of 3: 2 of C(6, 3) = 20.
    assert mann_whitney_p([4, 5, 6], [1, 2, 3]) == pytest.approx(0.1)
    # Interleaved 3 vs 3: U = 3 and P(U <= 3) = (1 + 1 + 2 + 3) / 20, doubled.
    assert mann_whitney_p([1, 3, 5], [2, 4, 6]) == pytest.approx(0.7)


def test_identical_constant_samples_give_p_one_without_a_crash():
    assert mann_whitney_p([0.4] * 10, [0.4] * 7) == 1.0
    result = compare([0.4] * 10, [0.4] * 10)
    assert (result.p, result.a12, result.magnitude, result.significant, result.better) == (
        1.0,
        0.5,
        'negligible',
        False,
        'none',
    )


def test_a12_by_hand():
    assert a12([1, 3, 5], [2, 4, 6]) == pytest.approx(3 / 9)  # wins: 3>2, 5>2, 5>4
    assert a12([1, 2, 3], [2, 2, 2]) == pytest.approx(3 / 9 + 0.5 * 3 / 9)
    assert a12([2, 2], [1, 2]) == pytest.approx(0.75)
    assert a12([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == 1.0
    assert a12([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == 0.0


def test_a12_matches_the_pairwise_definition(rng):
    a = rng.integers(0, 8, 23).astype(float)
    b = rng.integers(0, 8, 17).astype(float)
    pairwise = sum((x > y) + 0.5 * (x == y) for x in a for y in b) / (a.size * b.size)
    assert a12(a, b) == pytest.approx(pairwise, abs=1e-12)
    assert a12(a, b) + a12(b, a) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ('value', 'magnitude'),
    [
        (0.5, 'negligible'),
        (0.4400001, 'negligible'),
        (0.5599999, 'negligible'),
        (0.44, 'small'),
        (0.56, 'small'),
        (0.3400001, 'small'),
        (0.6399999, 'small'),
        (0.34, 'medium'),
        (0.64, 'medium'),
        (0.2900001, 'medium'),
        (0.7099999, 'medium'),
        (0.29, 'large'),
        (0.71, 'large'),
        (0.0, 'large'),
        (1.0, 'large'),
    ],
)
def test_a12_magnitude_bands_and_edges(value, magnitude):
    assert a12_magnitude(value) == magnitude


def test_band_edges_hold_for_computed_a12_values():
    b = [1, 2, 4, 5, 6]
    # 10 beats all five, each 3 beats 1 and 2, 4.5 beats 1, 2 and 4: 5 + 6 + 3 = 14 wins of 25 -> 0.56.
    a = [10, 3, 3, 3, 4.5]
    assert a12(a, b) == pytest.approx(0.56) and a12_magnitude(a12(a, b)) == 'small'
    assert a12(b, a) == pytest.approx(0.44) and a12_magnitude(a12(b, a)) == 'small'
    # 5 + 5 + 2 + 2 + 2 = 16 wins -> 0.64 (medium); the other way round 0.36 (small).
    a = [10, 10, 3, 3, 3]
    assert a12(a, b) == pytest.approx(0.64) and a12_magnitude(a12(a, b)) == 'medium'
    assert a12(b, a) == pytest.approx(0.36) and a12_magnitude(a12(b, a)) == 'small'


@pytest.mark.parametrize('value', [-0.1, 1.1, float('nan'), 'big'])
def test_a12_magnitude_rejects_values_outside_0_1(value):
    with pytest.raises(ParameterError, match='A12'):
        a12_magnitude(value)


def test_compare_significant_difference():
    higher, lower = [6, 7, 8, 9, 10], [1, 2, 3, 4, 5]
    result = compare(higher, lower)
    assert result.p == pytest.approx(2 / 252)
    assert (result.a12, result.magnitude, result.significant, result.better) == (1.0, 'large', True, 'first')
    assert compare(lower, higher).better == 'second'
    # For an objective to minimise, the lower sample is the better one.
    assert compare(higher, lower, higher_is_better=False).better == 'second'


def test_compare_without_significance_names_no_winner():
    result = compare([4, 5, 6], [1, 2, 3])  # A12 = 1 but p = 0.1
    assert (result.a12, result.magnitude, result.significant, result.better) == (1.0, 'large', False, 'none')
    result = compare([4, 5, 6], [1, 2, 3], alpha=0.2)
    assert result.significant and result.better == 'first'


@pytest.mark.parametrize(
    ('a', 'b'), [([], [1.0]), ([1.0], []), ([1.0, math.inf], [1.0]), ([1.0], [math.nan])]
)
def test_bad_samples_raise_parameter_error(a, b):
    with pytest.raises(ParameterError, match='sample'):
        compare(a, b)


def test_bad_alpha_raises_parameter_error():
    with pytest.raises(ParameterError, match='significance level'):
        compare([1.0], [2.0], alpha=1.5)


def test_significant_a12_by_hand():
    # 5 against 5: U = 23 of 25 has 4 of the 252 rank splits at least as extreme on each side
    # (U = 25, 24, 23: 1 + 1 + 2 splits), p = 8/252 = 0.032; U = 22 adds 3 splits: p = 14/252 = 0.056.
    assert significant_a12(5, 5) == pytest.approx(23 / 25)
    ours, theirs = [5, 6, 7, 3.5, 2.5], [0, 1, 2, 3, 4]  # above 5, 5, 5, 4 and 3 of theirs: U = 22
    assert a12(ours, theirs) == pytest.approx(22 / 25)
    assert mann_whitney_p(ours, theirs) == pytest.approx(14 / 252)
    assert mann_whitney_p([5, 6, 7, 4.5, 2.5], theirs) == pytest.approx(8 / 252)  # U = 23
    # 4 against 4: only full separation (p = 2/70) is significant; 15 of 16 gives 4/70.
    assert significant_a12(4, 4) == 1.0
    # 3 against 3 cannot reach 0.05 at all (the most extreme split has p = 2/20).
    assert significant_a12(3, 3) is None
    assert significant_a12(3, 3, alpha=0.2) == 1.0
    # The bound is for untied values: with ties scipy's tie-corrected approximation can go lower.
    assert mann_whitney_p([1, 1, 1, 1, 1], [0, 0, 0, 0, 1]) < 0.05
    assert a12([1, 1, 1, 1, 1], [0, 0, 0, 0, 1]) == pytest.approx(0.9)
    assert significant_a12(5, 5) > 0.9


@pytest.mark.parametrize('m, n', [(5, 5), (4, 6), (7, 3), (10, 10), (12, 9)])
def test_significant_a12_agrees_with_the_test_on_random_samples(rng, m, n):
    # Whatever the samples, the test is significant exactly when A12 reaches the bound either way.
    needed = significant_a12(m, n)
    for _ in range(300):
        ours, theirs = rng.normal(rng.uniform(-2, 2), 1, m), rng.normal(0, 1, n)
        effect = a12(ours, theirs)
        significant = mann_whitney_p(ours, theirs) < 0.05
        reaches = needed is not None and (effect >= needed - 1e-12 or effect <= 1 - needed + 1e-12)
        assert significant == reaches, (effect, needed)


@pytest.mark.parametrize(
    'm, n, alpha', [(0, 5, 0.05), (5, -1, 0.05), (2.5, 5, 0.05), (True, 5, 0.05), (5, 5, 1.0)]
)
def test_significant_a12_rejects_bad_arguments(m, n, alpha):
    with pytest.raises(ParameterError):
        significant_a12(m, n, alpha)
