"""Tests of violations, violation rate and strength, non-dominated sets, hypervolume (docs/method.md §4-5)."""

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.metrics import (
    DEFAULT_THRESHOLDS,
    class_differences,
    hypervolume,
    is_violation,
    non_dominated,
    violation_flags,
    violation_rate,
    violation_strength,
    violation_strength_of,
)


@dataclass(frozen=True)
class Pred:
    """Stands in for metavlm_ros.models.vlm.Prediction: the metrics read only kind and values."""

    kind: str
    values: dict[str, float] = field(default_factory=dict)


def counts(*values):
    return Pred('count', dict(zip(('animal', 'vegetation', 'object', 'trash'), values, strict=True)))


def confidences(*values):
    return Pred('confidence', dict(zip(('animal', 'vegetation', 'object', 'trash'), values, strict=True)))


def test_class_differences():
    diff = class_differences(counts(2, 0, 1, 0), counts(0, 0, 4, 1))
    assert diff == {'animal': 2.0, 'vegetation': 0.0, 'object': 3.0, 'trash': 1.0}


def test_count_violation_eq4_ignores_the_threshold():
    assert is_violation(counts(2, 0, 1, 0), counts(2, 0, 1, 1))
    assert is_violation(counts(2, 0, 1, 0), counts(2, 0, 1, 1), threshold=5.0)
    assert not is_violation(counts(2, 0, 1, 0), counts(2, 0, 1, 0))
    assert violation_flags(counts(2, 0, 1, 0), counts(3, 0, 1, 0)) == {'count': True}
    assert violation_flags(counts(2, 0, 1, 0), counts(2, 0, 1, 0)) == {'count': False}


def test_confidence_violation_eq5_per_threshold():
    source = confidences(0.30, 0.20, 0.25, 0.25)
    # |diff| = (0.04, 0, 0.05, 0.01): violates at every threshold (0.05 >= 0.05).
    assert violation_flags(source, confidences(0.26, 0.20, 0.30, 0.24)) == {
        '0.01': True,
        '0.03': True,
        '0.05': True,
    }
    # |diff| = (0.02, 0, 0, 0.02): only at 0.01.
    assert violation_flags(source, confidences(0.32, 0.20, 0.25, 0.23)) == {
        '0.01': True,
        '0.03': False,
        '0.05': False,
    }
    assert violation_flags(source, source) == dict.fromkeys(('0.01', '0.03', '0.05'), False)
    assert DEFAULT_THRESHOLDS == (0.01, 0.03, 0.05)


def test_a_difference_equal_to_the_threshold_violates_despite_binary_rounding():
    # 0.30 - 0.27 is 0.0299999... in binary; in the paper's decimal terms it equals Th = 0.03.
    assert is_violation(confidences(0.30, 0, 0, 0), confidences(0.27, 0, 0, 0), threshold=0.03)
    assert not is_violation(confidences(0.30, 0, 0, 0), confidences(0.2701, 0, 0, 0), threshold=0.03)


def test_violation_strength_of_sums_the_violating_classes_only():
    source = confidences(0.30, 0.20, 0.25, 0.25)
    followup = confidences(0.26, 0.20, 0.30, 0.24)
    assert violation_strength_of(source, followup, 0.01) == pytest.approx(0.10)
    assert violation_strength_of(source, followup, 0.03) == pytest.approx(0.09)
    assert violation_strength_of(source, followup, 0.05) == pytest.approx(0.05)
    assert violation_strength_of(source, confidences(0.32, 0.20, 0.25, 0.23), 0.03) is None
    assert violation_strength_of(counts(2, 0, 1, 0), counts(0, 0, 4, 1)) == 6.0
    assert violation_strength_of(counts(2, 0, 1, 0), counts(2, 0, 1, 0)) is None


def test_violation_rate_eq6():
    assert violation_rate([True, False, False, True]) == 0.5
    assert violation_rate([False] * 3) == 0.0
    assert violation_rate(np.array([True, True, True, False])) == 0.75
    assert math.isnan(violation_rate([]))


def test_violation_strength_eqs_7_8():
    assert violation_strength([2.0, None, 4.0]) == 3.0
    assert violation_strength([0.05, 0.09, 0.10]) == pytest.approx(0.08)
    assert math.isnan(violation_strength([]))
    assert math.isnan(violation_strength([None, None]))


@pytest.mark.parametrize('threshold', [0.0, -0.01, float('nan'), 'high'])
def test_bad_thresholds_raise_parameter_error(threshold):
    with pytest.raises(ParameterError, match='threshold'):
        is_violation(confidences(0.3, 0, 0, 0), confidences(0.2, 0, 0, 0), threshold=threshold)


def test_mismatched_predictions_raise_parameter_error():
    with pytest.raises(ParameterError, match='different classes'):
        is_violation(counts(1, 0, 0, 0), Pred('count', {'animal': 1.0}))
    with pytest.raises(ParameterError, match='differ in kind'):
        violation_flags(counts(1, 0, 0, 0), confidences(0.1, 0.2, 0.3, 0.4))


def test_non_dominated_by_hand():
    # (f_trans, f_pred): 0 (1, 2) and 1 (1, 2) are duplicates dominated by 4 (0.5, 2);
    # 2 (0, 0), 3 (2, 3), 4 and 5 (1, 2.5) trade off; 6 (2, 2.9) is dominated by 3; 7 is nan (failed).
    f_trans = [1, 1, 0, 2, 0.5, 1, 2, np.nan]
    f_pred = [2, 2, 0, 3, 2, 2.5, 2.9, 5]
    assert non_dominated(f_trans, f_pred).tolist() == [2, 3, 4, 5]


def test_non_dominated_keeps_every_one_of_exact_duplicates():
    # Ties dominate nothing among themselves: all three (0.5, 1.0) stay, (1.0, 1.0) and (0.5, 0.2) go.
    assert non_dominated([1.0, 0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 0.2, 1.0]).tolist() == [1, 2, 4]
    assert hypervolume([0.5, 0.5], [1.0, 1.0], 4) == hypervolume([0.5], [1.0], 4)
    assert non_dominated([], []).tolist() == []
    assert non_dominated([3.0], [0.0]).tolist() == [0]


def test_non_dominated_matches_pairwise_definition(rng):
    t = rng.integers(0, 6, 200).astype(float)
    p = rng.integers(0, 6, 200).astype(float)
    expected = []
    for i in range(200):
        dominated = np.any((t <= t[i]) & (p >= p[i]) & ((t < t[i]) | (p > p[i])))
        if not dominated:
            expected.append(i)
    assert len(expected) > len(set(zip(t[expected], p[expected], strict=True)))  # ties are in the test
    assert non_dominated(t, p).tolist() == expected


def test_hypervolume_by_hand():
    # One point: f_trans_n = 1.5 / 6 = 0.25, f_pred_n = 2 / 4 = 0.5 -> (1 - 0.25) * 0.5.
    assert hypervolume([1.5], [2.0], 4) == pytest.approx(0.375)
    # Adding (3, 4) -> (0.5, 1.0) adds (1 - 0.5) * (1 - 0.5) = 0.25.
    assert hypervolume([1.5, 3.0], [2.0, 4.0], 4) == pytest.approx(0.625)
    # A dominated point and a duplicate change nothing; neither does a failed (nan) evaluation.
    assert hypervolume([1.5, 3.0, 4.0, 1.5, np.nan], [2.0, 4.0, 1.0, 2.0, 3.0], 4) == pytest.approx(0.625)
    # f_pred above |C| is clipped: the best possible point (0, |C|) gives 1.
    assert hypervolume([0.0], [10.0], 4) == pytest.approx(1.0)
    # Confidence f_pred with two classes: (0.6 / 6, 0.5 / 2) -> 0.9 * 0.25.
    assert hypervolume([0.6], [0.5], 2) == pytest.approx(0.225)


def test_hypervolume_of_empty_or_useless_sets_is_zero():
    assert hypervolume([], [], 4) == 0.0
    assert hypervolume([0.0, 1.0], [0.0, 0.0], 4) == 0.0  # nothing changed the prediction
    assert hypervolume([6.0], [4.0], 4) == 0.0  # at the reference f_trans
    assert hypervolume([np.nan], [np.nan], 4) == 0.0


@pytest.mark.parametrize('n_classes', [0, -1, 2.5])
def test_hypervolume_rejects_bad_class_counts(n_classes):
    with pytest.raises(ParameterError, match='number of classes'):
        hypervolume([1.0], [1.0], n_classes)


def test_objective_arrays_must_match_in_length():
    with pytest.raises(ParameterError, match='same length'):
        non_dominated([1.0, 2.0], [1.0])
    with pytest.raises(ParameterError, match='same length'):
        hypervolume([1.0, 2.0], [1.0], 4)


def test_anytime_hypervolume_is_the_hypervolume_of_each_prefix():
    from metavlm_ros.method.metrics import anytime_hypervolume

    rng = np.random.default_rng(3)
    t, p = rng.random(400) * 7, rng.random(400) * 5  # some beyond the reference and the clip
    t[:3], p[10] = 0.0, np.nan  # active-but-nominal points, a failed evaluation
    at = [0, 1, 3, 11, 50, 399, 400]
    got = anytime_hypervolume(t, p, 4, 6, at)
    assert got == pytest.approx([hypervolume(t[:k], p[:k], 4, 6) if k else 0.0 for k in at], abs=1e-12)
    assert np.all(np.diff(got) >= 0)  # never lost: a prefix's front only grows
