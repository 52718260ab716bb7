"""The follow-ups hardening trains on: drawn inside the criteria's regions and sizes, or replaying the
changes that broke the model with their size jittered, reproducibly from a seed."""

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.relations import RELATION_BY_ID
from metavlm_ros.training.followups import FollowupPlan, TrainingRegion, scaled

ROLL = TrainingRegion('roll', SearchSpace.from_options(enabled=['rotation'], ranges={'rotation': (-2, 2)}))
SMALL = TrainingRegion('small', SearchSpace.default(), f_trans_max=0.2)


def test_region_draws_stay_in_the_region_and_below_its_size():
    rng = np.random.default_rng(0)
    rolls = [ROLL.draw(rng) for _ in range(200)]
    assert all(set(c.parameters) == {'rotation'} and -2 <= c.parameters['rotation'] <= 2 for c in rolls)
    sizes = [f_trans(SMALL.draw(rng)) for _ in range(300)]
    assert max(sizes) <= 0.2 + 1e-9
    # Shrunk to a uniform size, not piled up at the bound: the sizes spread over [0, 0.2].
    assert np.quantile(sizes, 0.25) < 0.08 < np.quantile(sizes, 0.75)


def test_breaking_changes_are_replayed_with_their_size_jittered():
    broken = Composition.from_parameters({'rotation': 4.0, 'histogram_equalization': 1.5})
    plan = FollowupPlan.of([], [broken, broken])
    assert plan.broken == (broken,)  # duplicates kept once
    rng = np.random.default_rng(1)
    for change in (plan.draw(rng) for _ in range(100)):
        assert set(change.parameters) == {'rotation', 'histogram_equalization'}
        rotation = change.parameters['rotation'] / 4.0  # below the range's end at any jitter
        clahe = (change.parameters['histogram_equalization'] - 1.0) / 0.5
        assert 0.75 - 1e-9 <= rotation <= 1.25 + 1e-9
        assert clahe == pytest.approx(rotation)  # one factor for the whole change


def test_plans_mix_regions_and_breaking_changes_and_repeat_from_a_seed():
    broken = Composition.from_parameters({'translation': 0.02})
    plan = FollowupPlan.of([ROLL], [broken], broken_share=0.5)
    first = [plan.draw(np.random.default_rng(7)).key for _ in range(1)]
    draws = [plan.draw(rng) for rng in [np.random.default_rng(7)] for _ in range(400)]
    replayed = sum('translation' in c.parameters for c in draws)
    assert 150 < replayed < 250
    assert plan.draw(np.random.default_rng(7)).key == first[0]
    assert plan.as_record()['regions'][0] == {
        'label': 'roll',
        'relations': {'rotation': [-2.0, 2.0]},
        'f_trans_max': None,
    }


def test_scaling_keeps_a_change_inside_its_relations_ranges():
    change = scaled(Composition.from_parameters({'rotation': 4.0}), 2.0)
    assert change.parameters['rotation'] == RELATION_BY_ID['rotation'].high


def test_a_plan_with_nothing_to_train_on_is_refused():
    with pytest.raises(ParameterError, match='nothing to train on'):
        FollowupPlan.of([], [])
    with pytest.raises(ParameterError, match='broken_share'):
        FollowupPlan.of([ROLL], broken_share=1.5)
