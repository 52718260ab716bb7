"""Claims in the water's own terms (MR12, docs/underwater.md): Jerlov types by name in criteria, searched
inside their waters, judged like any other claim, and the verdict saying for which waters it holds."""

from pathlib import Path

import pytest
import yaml

from metavlm_ros.assurance.criteria import load_criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.gather import gather, plan
from metavlm_ros.assurance.judge import judge
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.method.envelope import boundaries
from metavlm_ros.models.identity import answered_model_identity
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

ROOT = Path(__file__).resolve().parents[2]
COASTAL = ROOT / 'config' / 'criteria' / 'coastal_water.yaml'
HARBOUR = 'Jerlov II to 5C, up to 4 m, 0-40 m deep'


def _load(tmp_path, *criteria):
    path = tmp_path / 'criteria.yaml'
    path.write_text(yaml.safe_dump({'format': 1, 'name': 'n', 'criteria': [dict(c) for c in criteria]}))
    return load_criteria(path)


def test_water_types_by_name_or_index_make_one_region_of_those_waters(tmp_path):
    by_name, by_index = _load(
        tmp_path,
        {'id': 'a', 'kind': 'rate', 'within': {'water_type': ['II', '5c'], 'water': [0, 4]}, 'limit': 0.05},
        {'id': 'b', 'kind': 'rate', 'within': {'water': [0, 4], 'water_type': [3, 7]}, 'limit': 0.05},
    ).criteria
    assert by_name.within == by_index.within and by_name.within.conditions == (('water_type', 3.0, 7.0),)
    assert by_name.claim == f'violation rate <= 0.05 within water: {HARBOUR}, 95% confidence'
    assert by_name.within.space().as_record()['extras']['water_type'] == [3.0, 7.0]
    region = by_name.within
    assert region.holds({'water': 3.9, 'water_type': 7.0, 'water_depth': 40.0})
    assert not region.holds({'water': 3.9, 'water_type': 7.5})
    # A record without the type was in Jerlov I (its nominal value): not in these waters.
    assert not region.holds({'water': 1.0})
    # The priors not named are the region's too: constant range, no lamps.
    assert not region.holds({'water': 1.0, 'water_type': 5.0, 'water_tilt': 30.0})


@pytest.mark.parametrize(
    'within, where',
    [
        ({'water': [0, 4], 'water_type': ['II', 'XI']}, "within.water_type: unknown Jerlov water type 'XI'"),
        ({'water': [0, 4], 'water_type': [3, 12]}, 'within.water_type: must lie in [I, 9C], got 12'),
        ({'water': [0, 4], 'water_type': ['5C', 'II']}, 'within.water_type: low 5C is above high II'),
        ({'rotation': [-1, 1], 'water_type': ['II', '5C']},
         'within.water_type: is a condition of water, which the region does not name'),
        ({'water': [0, 4], 'water_kind': [0, 1]}, 'within.water_kind: unknown relation'),
    ],
)  # fmt: skip
def test_a_bad_water_names_its_key_in_one_line(tmp_path, within, where):
    with pytest.raises(ParameterError) as caught:
        _load(tmp_path, {'id': 'c', 'kind': 'existence', 'within': within})
    assert where in str(caught.value) and '\n' not in str(caught.value), str(caught.value)


def test_an_envelope_names_only_its_own_conditions_and_few_of_them(tmp_path):
    envelope = {'id': 'e', 'kind': 'envelope', 'relation': 'water', 'at_least': 1, 'frames': 0.8}
    with pytest.raises(ParameterError, match=r'\(e\).within.rotation: not a condition of water'):
        _load(tmp_path, {**envelope, 'within': {'rotation': [0, 1]}})
    with pytest.raises(ParameterError, match=r'\(e\).within: 40 conditions to measure.*at most 24'):
        _load(tmp_path, {**envelope, 'within': {'water_type': ['I', '9C'], 'water_depth': [0, 40],
                                                'water_lamp_power': [0, 1]}})  # fmt: skip
    (plain,) = _load(tmp_path, envelope).criteria
    # Unnamed, MR12's conditions are its nominal ones, which the shared boundary search measures.
    assert plain.points == [(0.0, 0.0, 0.0, 2.0, 0.0, 60.0)] and not plain.own_searches
    assert plain.claim.endswith('(Jerlov I, at the surface)') and plain.direction_names == ['water+']


@pytest.fixture(scope='module')
def coastal(tmp_path_factory):
    """The shipped coastal example searched as `metavlm verify` does, on small budgets and frames."""
    criteria = load_criteria(COASTAL)
    planned = plan(criteria, population=8, evaluations=40, seed=0, working_size=None, envelope_rounds=2)
    backend = ImageStatsBackend()
    model = answered_model_identity(backend.model_id, backend.classes, backend=backend.name)
    frames = [Frame(name, make_frame(64, 48, seed=i)) for i, name in enumerate('abc')]
    root = tmp_path_factory.mktemp('coastal')
    gather(planned, frames, backend, model, root, log=lambda message: None)
    evidence = load_evidence(root)
    return criteria, planned, evidence, judge(criteria, evidence)


def test_the_coastal_example_is_searched_in_its_waters(coastal):
    criteria, planned, evidence, _ = coastal
    assert [p.name for p in planned] == [
        'existence-night-survey',
        'rate-harbour-water',
        'envelope-coastal-envelope-type1C',
        'envelope-coastal-envelope-type3C',
        'envelope-coastal-envelope-type5C',
    ]
    runs = {run.directory.name: run for run in evidence.runs}
    samples = [r['parameters'] for r in runs['rate-harbour-water'].records]
    assert len(samples) == 150 and all(0 <= p['water'] <= 4 and 3 <= p['water_type'] <= 7 for p in samples)
    assert {p['water_tilt'] for p in samples} == {0.0}
    searched = [r['parameters'] for r in runs['existence-night-survey'].records]
    night = {
        (p['water_type'], p['water_depth'], p['water_lamp_power'], p['water_tilt'])
        for p in searched
        if 'water' in p
    }
    assert night == {(8.0, 20.0, 4.0, 30.0)}
    for name, index in (('type1C', 5.0), ('type3C', 6.0), ('type5C', 7.0)):
        tried = {r['parameters']['water_type'] for r in runs[f'envelope-coastal-envelope-{name}'].records}
        assert tried == {index}


def test_the_coastal_example_is_judged_and_says_for_which_waters(coastal):
    criteria, _, evidence, (harbour, night, envelope) = coastal
    runs = {run.directory.name: run for run in evidence.runs}
    # The rate: exactly its uniform samples, and the waters in the verdict.
    samples = runs['rate-harbour-water'].records
    assert harbour.figures['samples'] == len(samples)
    assert harbour.figures['violations'] == sum(r['violation']['0.05'] for r in samples)
    assert harbour.reason.endswith(f'; in {HARBOUR}') and harbour.figures['waters'] == HARBOUR
    # The existence claim: the evaluations in its waters only (none of the rate's samples), whichever
    # search made them; a counterexample is one of them.
    inside = [r for _, r in evidence.evaluations() if r['order'] and criteria.criteria[1].holds_record(r)]
    assert night.figures['evaluations_in_region'] == len(inside) > 0
    assert all(r in runs['existence-night-survey'].records for r in inside)
    assert night.status == 'FAIL' and night.counterexample['parameters']['water_type'] == 8.0
    assert night.counterexample['parameters']['water_tilt'] == 30.0
    assert (
        'Jerlov 7C, up to 1 m, 20 m deep, lamps 4 (scene 2 m away), seabed 30 degrees below' in night.reason
    )
    # The envelope: per frame, the smallest boundary over Jerlov 1C, 3C and 5C, from their searches alone
    # (the rate's samples are water alone too, at other types: they do not count).
    per_condition = [
        {b.image: b for b in boundaries(runs[f'envelope-coastal-envelope-{n}'].records, '0.05')}
        for n in ('type1C', 'type3C', 'type5C')
    ]
    breaks = sorted(min(found[image].point for found in per_condition) for image in 'abc')
    assert envelope.figures['conditions'] == 3 and envelope.figures['frames_with_evidence'] == 3
    assert envelope.figures['upper'] == breaks[-1]
    assert set(envelope.figures['median_boundary_by_condition']) == {
        'Jerlov 1C, at the surface',
        'Jerlov 3C, at the surface',
        'Jerlov 5C, at the surface',
    }
    # The most turbid water takes the answer soonest.
    assert envelope.figures['weakest_condition'] == 'Jerlov 5C, at the surface'
    assert envelope.reason.endswith('; in Jerlov 1C to 5C, at the surface')
