"""Tests of f_trans (Eq. 1) and f_pred (Eqs. 2, 3) on hand-computed cases."""

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.objectives import f_pred, f_trans


@dataclass(frozen=True)
class Pred:
    """Stands in for metavlm_ros.models.vlm.Prediction: the objectives read only kind and values."""

    kind: str
    values: dict[str, float] = field(default_factory=dict)


def counts(animal, vegetation, obj, trash):
    return Pred('count', {'animal': animal, 'vegetation': vegetation, 'object': obj, 'trash': trash})


def confidences(animal, vegetation, obj, trash):
    return Pred('confidence', {'animal': animal, 'vegetation': vegetation, 'object': obj, 'trash': trash})


@pytest.mark.parametrize(
    ('parameters', 'expected'),
    [
        ({}, 0.0),
        ({'rotation': 2.5}, 0.5),
        ({'rotation': -2.5}, 0.5),
        ({'histogram_equalization': 1.0}, 0.0),  # MR3 active at nominal costs nothing
        ({'histogram_equalization': 1.25}, 0.25),
        ({'rotation': 1.0, 'scaling': 0.85, 'downsampling': 0.95}, 0.2 + 0.5 + 0.5),
        ({'shear': -0.075, 'translation': 0.03}, 0.5 + 1.0),
        (
            {
                'rotation': -5.0,
                'scaling': 1.3,
                'histogram_equalization': 2.0,
                'downsampling': 0.9,
                'shear': 0.15,
                'translation': -0.03,
            },
            6.0,
        ),
    ],
)
def test_f_trans(parameters, expected):
    assert f_trans(Composition.from_parameters(parameters)) == pytest.approx(expected, abs=1e-12)


def test_mr3_at_clip_one_is_an_active_order_one_composition_at_zero_cost():
    composition = Composition.from_parameters({'histogram_equalization': 1.0})
    assert composition.order == 1 and f_trans(composition) == 0.0


def test_f_pred_counts_eq2():
    # d = (2, 0, 3, 1): 2/3 + 0 + 3/4 + 1/2 = 23/12.
    assert f_pred(counts(2, 0, 1, 0), counts(0, 0, 4, 1)) == pytest.approx(23 / 12)
    assert f_pred(counts(2, 0, 1, 0), counts(2, 0, 1, 0)) == 0.0
    # f_pred of counts stays below the number of classes however large the difference.
    assert f_pred(counts(0, 0, 0, 0), counts(999, 999, 999, 999)) == pytest.approx(4 * 999 / 1000)


def test_f_pred_confidences_eq3():
    # |diff| = (0.04, 0, 0.05, 0.01): 0.10.
    assert f_pred(confidences(0.30, 0.20, 0.25, 0.25), confidences(0.26, 0.20, 0.30, 0.24)) == pytest.approx(
        0.10
    )


def test_f_pred_is_symmetric():
    a, b = counts(1, 2, 3, 4), counts(4, 3, 2, 1)
    assert f_pred(a, b) == f_pred(b, a) == pytest.approx(2 * 3 / 4 + 2 * 1 / 2)


@pytest.mark.parametrize(
    ('source', 'followup', 'message'),
    [
        (counts(1, 0, 0, 0), Pred('count', {'animal': 1, 'vegetation': 0, 'object': 0}), 'different classes'),
        (counts(1, 0, 0, 0), confidences(0.1, 0.2, 0.3, 0.4), 'differ in kind'),
        (Pred('caption', {'animal': 1}), Pred('caption', {'animal': 1}), "unknown prediction kind 'caption'"),
    ],
)
def test_mismatched_predictions_raise_parameter_error(source, followup, message):
    with pytest.raises(ParameterError, match=message):
        f_pred(source, followup)


def test_objectives_accept_the_vlm_prediction_type():
    from metavlm_ros.method.prediction import Prediction

    source = Prediction('count', {'animal': 1.0, 'trash': 0.0}, 'Animals: 1 fish')
    followup = Prediction('count', {'animal': 3.0, 'trash': 0.0}, 'Animals: 3 fish')
    assert f_pred(source, followup) == pytest.approx(2 / 3)


def test_the_method_modules_import_neither_torch_nor_rclpy():
    code = (
        'import sys\n'
        'import metavlm_ros.method.relations, metavlm_ros.method.encoding, metavlm_ros.method.objectives\n'
        'import metavlm_ros.method.metrics, metavlm_ros.method.stats\n'
        "print(sorted(m for m in ('torch', 'rclpy', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == '[]'


def test_f_trans_counts_the_blur_length_and_not_its_angle():
    # A direction has no magnitude (docs/method.md §12): every angle costs what the length costs.
    costs = [
        f_trans(Composition.from_parameters({'motion_blur': 0.005, 'motion_blur_angle': angle}))
        for angle in (-90.0, -30.0, 0.0, 45.0, 90.0)
    ]
    assert costs == [f_trans(Composition.from_parameters({'motion_blur': 0.005}))] * 5
    assert costs[0] == pytest.approx(0.5)
    assert f_trans(Composition.from_parameters({'motion_blur': 0.0, 'motion_blur_angle': 60.0})) == 0.0
