"""Tests of the genotype encoding: decoding, labels, keys, search spaces and user-built compositions."""

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import N_VAR, Composition, SearchSpace, decode, encode
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID, RELATION_GROUPS, RELATIONS


def genotype(**genes: tuple[float, float]) -> np.ndarray:
    """A genotype with every flag 0 except the named relations: name=(flag, value)."""
    order = ['rotation', 'scaling', 'histogram_equalization', 'downsampling', 'shear', 'translation']
    x = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    for name, (flag, value) in genes.items():
        i = order.index(name)
        x[2 * i], x[2 * i + 1] = flag, value
    return x


def test_decode_reads_interleaved_flags_and_values():
    x = np.array([0.9, -2.5, 0.1, 1.2, 0.7, 1.5, 0.2, 0.95, 0.51, 0.1, 0.0, 0.02])
    composition = decode(x)
    assert composition.active[:6] == (True, False, True, False, True, False)
    assert not any(composition.active[6:])  # the opt-in relations are not in the default space
    assert composition.order == 3
    assert composition.label == '{1,3,5}'
    assert composition.parameters == {'rotation': -2.5, 'histogram_equalization': 1.5, 'shear': 0.1}
    # Inactive relations carry their nominal value.
    assert composition.values[:6] == (-2.5, 1.0, 1.5, 1.0, 0.1, 0.0)


def test_flag_is_active_strictly_above_one_half():
    assert decode(genotype(scaling=(0.5, 1.2))).order == 0
    assert decode(genotype(scaling=(0.5000001, 1.2))).label == '{2}'


def test_decode_clips_values_into_the_range():
    composition = decode(genotype(rotation=(1.0, 7.0), downsampling=(1.0, 0.5)))
    assert composition.parameters == {'rotation': 5.0, 'downsampling': 0.9}


def test_identity_and_labels():
    identity = Composition.identity()
    assert identity.order == 0 and identity.label == '{}' and identity.parameters == {}
    assert decode(np.zeros(N_VAR)) == identity
    assert Composition.from_parameters({'scaling': 1.1, 'histogram_equalization': 1.0}).label == '{2,3}'
    everything = decode(np.array([1, 1, 1, 1.2, 1, 1.5, 1, 0.95, 1, 0.1, 1, 0.02], dtype=float))
    assert everything.label == '{1,2,3,4,5,6}' and everything.order == 6


def test_encode_decode_round_trip():
    composition = Composition.from_parameters({'angle': -4.0, 'downsampling': 0.92, 'translation': -0.01})
    x = encode(composition)
    assert x.tolist() == [1.0, -4.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.92, 0.0, 0.0, 1.0, -0.01]
    assert decode(x) == composition
    assert decode(encode(decode(x))) == composition


def test_key_ignores_float_noise_and_inactive_values():
    a = decode(genotype(shear=(1.0, 0.1), translation=(0.2, 0.02)))
    b = decode(genotype(shear=(0.8, 0.1 + 1e-15), translation=(0.0, -0.03)))
    assert a.key == b.key and hash(a.key) == hash(b.key)
    assert a.key == ((5, 0.1),)
    assert decode(genotype(shear=(1.0, 0.1001))).key != a.key
    # The same values on different relations are different compositions.
    assert (
        Composition.from_parameters({'rotation': 1.0}).key != Composition.from_parameters({'shear': 0.1}).key
    )
    # Negative zero and zero transform alike.
    assert (
        Composition.from_parameters({'rotation': -0.0}).key
        == Composition.from_parameters({'rotation': 0.0}).key
    )


def test_from_parameters_accepts_ids_parameter_names_and_numbers():
    by_id = Composition.from_parameters({'rotation': 2.0, 'histogram_equalization': 1.5})
    assert Composition.from_parameters({'angle': 2.0, 'clip_limit': 1.5}) == by_id
    assert Composition.from_parameters({'MR1': 2.0, '3': 1.5}) == by_id


@pytest.mark.parametrize(
    ('parameters', 'message'),
    [
        ({'rotation': 6.0}, r'MR1 rotation angle 6.0 is outside the allowed range \[-5, 5\]'),
        ({'scaling': 0.5}, r'MR2 scaling zoom 0.5 is outside the allowed range \[0.7, 1.3\]'),
        ({'blur': 1.0}, r"unknown relation 'blur'"),
        ({'rotation': 'left'}, 'must be a number'),
        ({'rotation': 1.0, 'angle': 2.0}, 'more than once'),
    ],
)
def test_from_parameters_rejects_bad_input(parameters, message):
    with pytest.raises(ParameterError, match=message):
        Composition.from_parameters(parameters)


def test_default_space_bounds():
    xl, xu = SearchSpace.default().bounds()
    assert xl.tolist() == [0, -5, 0, 0.7, 0, 1.0, 0, 0.9, 0, -0.15, 0, -0.03]
    assert xu.tolist() == [1, 5, 1, 1.3, 1, 2.0, 1, 1.0, 1, 0.15, 1, 0.03]


def test_narrowed_space_has_genes_for_its_relations_only_and_clips():
    space = SearchSpace.from_options(enabled=['rotation', 'shear'], ranges={'rotation': (-2.0, 3.0)})
    assert space.enabled_ids == ('rotation', 'shear') and space.n_var == 4
    xl, xu = space.bounds()
    assert (xl.tolist(), xu.tolist()) == ([0, -2, 0, -0.15], [1, 3, 1, 0.15])
    # Values clip to the narrowed range; a disabled relation has no gene, so it is never active.
    composition = decode(np.array([1.0, 4.5, 1.0, -0.05]), space)
    assert composition.parameters == {'rotation': 3.0, 'shear': -0.05}
    with pytest.raises(ParameterError, match='4 variables, got 12'):
        decode(genotype(rotation=(1.0, 1.0)), space)


def test_enabled_can_be_a_comma_separated_string():
    assert SearchSpace.from_options(enabled='rotation, mr6').enabled_ids == ('rotation', 'translation')


def test_default_space_is_the_papers_six_and_the_genotype_grows_with_the_chosen_relations():
    assert (
        SearchSpace.default().enabled_ids == DEFAULT_RELATIONS and SearchSpace.default().n_var == N_VAR == 12
    )
    assert SearchSpace.from_options(enabled=None) == SearchSpace.default()
    assert SearchSpace.from_options(enabled=['paper']) == SearchSpace.default()
    wider = SearchSpace.from_options(enabled=['paper', 'turbidity', 'marine_snow'])
    assert wider.n_var == 16
    assert wider.enabled_ids == (*DEFAULT_RELATIONS, 'turbidity', 'marine_snow')
    xl, xu = wider.bounds()
    assert (xl[12:].tolist(), xu[12:].tolist()) == ([0, 0, 0, 0], [1, 5, 1, 600])
    underwater = SearchSpace.from_options(enabled='underwater')
    # A flag and a value per relation, then MR10's angle (docs/method.md §2).
    assert underwater.enabled_ids == RELATION_GROUPS['underwater'] and underwater.n_var == 11
    # 'all' is every relation that keeps the answer: insertion (§13) is named on its own.
    kept = [RELATION_BY_ID[rid] for rid in RELATION_GROUPS['all']]
    assert [r.id for r in RELATIONS if r not in kept] == ['insertion']
    extras = sum(len(relation.extras) for relation in kept)
    assert SearchSpace.from_options(enabled=['all']).n_var == 2 * len(kept) + extras == 31


def test_opt_in_relations_decode_encode_and_label_after_the_papers_six():
    space = SearchSpace.from_options(enabled=['rotation', 'turbidity', 'marine_snow'])
    composition = decode(np.array([1.0, 2.0, 0.9, 2.5, 0.2, 300.0]), space)
    assert composition.parameters == {'rotation': 2.0, 'turbidity': 2.5}
    number = RELATION_BY_ID['turbidity'].number
    assert number > 6 and composition.label == f'{{1,{number}}}'
    assert decode(encode(composition, space), space) == composition
    assert Composition.from_parameters({'turbidity': 2.5, 'rotation': 2.0}) == composition
    with pytest.raises(ParameterError, match='does not enable'):
        encode(composition)  # the default space has no turbidity gene


def test_the_stored_space_of_a_paper_search_is_what_it_was_before_the_opt_in_relations():
    record = SearchSpace.from_options(enabled=['rotation', 'shear']).as_record()
    assert record == {
        'enabled': [True, False, False, False, True, False],
        'low': [-5.0, 0.7, 1.0, 0.9, -0.15, -0.03],
        'high': [5.0, 1.3, 2.0, 1.0, 0.15, 0.03],
    }
    # The lists stop at the last relation enabled: an underwater search records what it did before
    # the optics relations came after it.
    assert len(SearchSpace.from_options(enabled=['low_light']).as_record()['enabled']) == 11
    assert len(SearchSpace.from_options(enabled=['water']).as_record()['enabled']) == 12
    assert len(SearchSpace.from_options(enabled=['insertion']).as_record()['enabled']) == len(RELATIONS)


def test_unknown_relations_name_the_groups_too():
    with pytest.raises(
        ParameterError, match=r"unknown relation 'fog'.*turbidity.*groups paper, underwater, optics, all"
    ):
        SearchSpace.from_options(enabled=['fog'])


@pytest.mark.parametrize(
    ('kwargs', 'message'),
    [
        ({'ranges': {'rotation': (-7.0, 2.0)}}, r'MR1 rotation .*\[-5, 5\]'),
        ({'ranges': {'translation': (0.0, 0.05)}}, r'MR6 translation .*\[-0.03, 0.03\]'),
        ({'ranges': {'shear': (0.1, -0.1)}}, r'MR5 shear range .* low <= high'),
        ({'ranges': {'shear': 0.1}}, 'pair'),
        ({'enabled': ['rotation', 'warp']}, "unknown relation 'warp'"),
        ({'enabled': []}, 'at least one relation'),
    ],
)
def test_bad_search_spaces_raise_parameter_error(kwargs, message):
    with pytest.raises(ParameterError, match=message):
        SearchSpace.from_options(**kwargs)


@pytest.mark.parametrize('x', [np.zeros(11), np.zeros((2, 12)), np.array([np.nan] + [0.0] * 11)])
def test_bad_genotypes_raise_parameter_error(x):
    with pytest.raises(ParameterError, match='genotype'):
        decode(x)


def test_decode_is_vectorisable_by_rows(rng):
    space = SearchSpace.default()
    xl, xu = space.bounds()
    population = rng.uniform(xl, xu, size=(50, N_VAR))
    compositions = [decode(row, space) for row in population]
    orders = [c.order for c in compositions]
    assert orders == (population[:, 0::2] > 0.5).sum(axis=1).tolist()


def test_motion_blur_angle_is_a_gene_after_the_flags_and_values_and_round_trips():
    space = SearchSpace.from_options(enabled=['rotation', 'motion_blur'])
    # rotation flag, value, motion_blur flag, length, then its angle (docs/method.md §2).
    assert space.n_var == 5
    xl, xu = space.bounds()
    assert (xl.tolist(), xu.tolist()) == ([0.0, -5.0, 0.0, 0.0, -90.0], [1.0, 5.0, 1.0, 0.01, 90.0])
    composition = decode(np.array([1.0, 2.0, 1.0, 0.006, 35.0]), space)
    assert composition.parameters == {'rotation': 2.0, 'motion_blur': 0.006, 'motion_blur_angle': 35.0}
    assert str(composition) == '{1,10} (rotation=2, motion_blur=0.006, motion_blur_angle=35)'
    assert encode(composition, space).tolist() == [1.0, 2.0, 1.0, 0.006, 35.0]
    assert decode(encode(composition, space), space) == composition
    assert Composition.from_parameters(composition.parameters) == composition
    # Clipped into its range like a value.
    assert decode(np.array([0.0, 0.0, 1.0, 0.006, 135.0]), space).parameters['motion_blur_angle'] == 90.0


def test_the_angle_tells_compositions_apart_only_while_motion_blur_is_active():
    space = SearchSpace.from_options(enabled=['rotation', 'motion_blur'])
    at_35 = decode(np.array([1.0, 2.0, 1.0, 0.006, 35.0]), space)
    at_80 = decode(np.array([1.0, 2.0, 1.0, 0.006, 80.0]), space)
    assert at_35 != at_80 and at_35.key != at_80.key
    # Inactive: nominal length and angle, so the two behave alike and compare equal.
    off_35 = decode(np.array([1.0, 2.0, 0.0, 0.006, 35.0]), space)
    off_80 = decode(np.array([1.0, 2.0, 0.0, 0.004, 80.0]), space)
    assert off_35 == off_80 and off_35.key == off_80.key
    assert off_35.extras == Composition.identity().extras
    assert off_35.parameters == {'rotation': 2.0}


def test_a_record_without_the_angle_reads_as_a_horizontal_blur_and_bad_angles_are_refused():
    old = Composition.from_parameters({'motion_blur': 0.005})
    assert old.parameters == {'motion_blur': 0.005, 'motion_blur_angle': 0.0}
    with pytest.raises(ParameterError, match='motion_blur_angle is given without motion_blur'):
        Composition.from_parameters({'rotation': 1.0, 'motion_blur_angle': 30.0})
    with pytest.raises(
        ParameterError, match=r'^MR10 motion_blur angle 95 is outside the allowed range \[-90, 90\]$'
    ):
        Composition.from_parameters({'motion_blur': 0.005, 'motion_blur_angle': 95})
    with pytest.raises(ParameterError, match="MR10 motion_blur angle must be a number, got 'up'"):
        Composition.from_parameters({'motion_blur': 0.005, 'motion_blur_angle': 'up'})


def test_the_angle_range_narrows_like_any_range_and_a_bad_one_is_one_line():
    heave = SearchSpace.from_options(enabled=['motion_blur'], ranges={'motion_blur_angle': (90, 90)})
    assert heave.extra_bounds()[0].tolist() == [90.0] and heave.extra_bounds()[1].tolist() == [90.0]
    assert decode(np.array([1.0, 0.005, -40.0]), heave).parameters['motion_blur_angle'] == 90.0
    for bounds, message in [
        ((-100, 0), r'MR10 motion_blur angle -100.0 is outside the allowed range \[-90, 90\]'),
        ((30, 10), r'MR10 motion_blur angle range \(30, 10\) must be low <= high inside \[-90, 90\]'),
        (('a', 'b'), r"MR10 motion_blur angle range must be numbers inside \[-90, 90\], got \('a', 'b'\)"),
        (5, r'MR10 motion_blur angle range must be a pair \(low, high\), got 5'),
    ]:
        with pytest.raises(ParameterError, match=message) as refused:
            SearchSpace.from_options(enabled=['motion_blur'], ranges={'motion_blur_angle': bounds})
        assert '\n' not in str(refused.value)
    with pytest.raises(ParameterError, match=r"unknown relation 'motion_blur_direction'.*motion_blur_angle"):
        SearchSpace.from_options(ranges={'motion_blur_direction': (0, 1)})


def test_the_stored_space_records_the_angle_range_only_where_motion_blur_is_searched():
    def record(**options):
        return SearchSpace.from_options(**options).as_record()

    assert record(enabled=['motion_blur'])['extras'] == {'motion_blur_angle': [-90.0, 90.0]}
    narrowed = record(enabled=['motion_blur'], ranges={'motion_blur_angle': (0, 45)})
    assert narrowed['extras'] == {'motion_blur_angle': [0.0, 45.0]}
    # Without motion blur the record is what it was before the angle was searched.
    assert 'extras' not in record(enabled=['paper', 'turbidity', 'low_light'])
    assert 'extras' not in record(enabled=['paper'], ranges={'motion_blur_angle': (0, 45)})
