"""The boundary search of method/envelope.py and the boundaries read back from records; the `uniform`
sampler of a region."""

import math

import numpy as np
import pytest

from metavlm_ros.method.algorithms import uniform_genotypes
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.envelope import Bracket, EnvelopeSearch, boundaries, directions
from metavlm_ros.method.records import evaluation_record
from metavlm_ros.method.relations import RELATION_BY_ID
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import BlackCountBackend, ImageStatsBackend


def test_the_paper_space_has_ten_directions_with_their_range_ends():
    found = {d.name: d.end for d in directions(SearchSpace.default())}
    expected = {
        'rotation-': 5, 'rotation+': 5, 'scaling-': 0.3, 'scaling+': 0.3, 'histogram_equalization+': 1,
        'downsampling-': 0.1, 'shear-': 0.15, 'shear+': 0.15, 'translation-': 0.03, 'translation+': 0.03,
    }  # fmt: skip
    assert list(found) == list(expected)
    assert all(math.isclose(found[name], end) for name, end in expected.items())


def _drive(search: EnvelopeSearch, truth: dict[str, float], rounds: int) -> int:
    """Tell the search, for `rounds` rounds, whether each asked magnitude is past the direction's true
    boundary; returns the evaluations spent."""
    spent = 0
    space = search.space
    for _ in range(rounds):
        genotypes = search.ask(10_000)
        if not len(genotypes):
            break
        answers = []
        for x in genotypes:
            ((relation, value),) = decode(x, space).parameters.items()
            nominal = RELATION_BY_ID[relation].nominal
            name = f'{relation}{"+" if value > nominal else "-"}'
            answers.append(abs(value - nominal) >= truth[name])
        search.tell(answers)
        spent += len(genotypes)
    return spent


def test_k_section_brackets_each_boundary_to_its_stated_width_and_closes_censored_directions():
    space = SearchSpace.default()
    ends = {d.name: d.end for d in directions(space)}
    rng = np.random.default_rng(3)
    # Half of the directions break inside their range, the other half hold past its end.
    truth = {
        name: end * (rng.uniform(0.05, 0.95) if i % 2 else 1.5) for i, (name, end) in enumerate(ends.items())
    }
    points, rounds = 8, 3
    search = EnvelopeSearch(space, points=points)
    spent = _drive(search, truth, rounds)
    # Round 1 tries every direction; the later ones only those that broke inside their range.
    assert spent == points * len(ends) + points * (rounds - 1) * len(ends) // 2
    states = {s.direction.name: s for s in (*search.closed, *search._open)}
    for name, end in ends.items():
        state = states[name]
        if truth[name] > end:
            assert state.bracket == Bracket(end, None)  # holds up to the range's end
        else:
            assert state.bracket.clean < truth[name] <= state.bracket.violating
            width = state.bracket.violating - state.bracket.clean
            assert width <= end / points / (points + 1) ** (rounds - 1) * (1 + 1e-9)


def test_the_search_ends_once_every_boundary_is_bracketed_to_its_resolution_within_the_budget():
    config = SearchConfig(algorithm='envelope', seed=1)  # population 30, 3000 evaluations
    result = run_search(make_frame(32, 24), ImageStatsBackend(), config)
    rounds = max(ev.generation for ev in result.evaluations) + 1
    assert len(result.evaluations) < 3000 and rounds < 100
    found = boundaries([evaluation_record(ev, result) for ev in result.evaluations], '0.01')
    for b in found:
        end = {d.name: d.end for d in directions(config.space)}[b.direction]
        assert b.reached_end if b.censored else b.violating - b.clean <= 1e-9 * end


def test_a_round_costs_points_per_open_direction_and_the_budget_is_exact():
    search = EnvelopeSearch(SearchSpace.default(), points=4)
    assert search.ask(1000).shape == (40, 12)
    search.tell([False] * 40)  # nothing breaks anywhere: every direction holds to its end
    assert search.done
    search = EnvelopeSearch(SearchSpace.default(), points=4)
    assert search.ask(7).shape == (7, 12)


def test_a_non_monotone_model_gets_the_smallest_violating_magnitude_found():
    space = SearchSpace.from_options(['rotation'])
    # Breaks only between 1 and 2 degrees (either side), holds elsewhere.
    search = EnvelopeSearch(space, points=5)
    spent = 0
    while not search.done and spent < 200:
        genotypes = search.ask(200 - spent)
        values = [decode(x, space).parameters['rotation'] for x in genotypes]
        search.tell([1 <= abs(v) <= 2 for v in values])
        spent += len(genotypes)
    for state in search.closed:
        assert not state.bracket.censored and state.bracket.clean < 1 <= state.bracket.violating <= 2


@pytest.mark.parametrize('backend', [ImageStatsBackend(), BlackCountBackend()], ids=['confidence', 'count'])
def test_an_envelope_search_judges_single_relations_in_batches_and_its_records_give_the_boundaries(backend):
    config = SearchConfig(algorithm='envelope', population=16, evaluations=150, seed=0)
    frame = make_frame(96, 64, seed=2)
    calls_before = len(getattr(backend, 'calls', []))
    result = run_search(frame, backend, config, image_id='f')
    assert len(result.evaluations) <= 150 and all(ev.composition.order == 1 for ev in result.evaluations)
    # One call for the source, at most one a generation of 16 (one of magnitudes rounded alike is cached).
    generations = max(ev.generation for ev in result.evaluations) + 1
    assert result.model_calls <= 1 + generations
    assert [sum(ev.generation == g for ev in result.evaluations) for g in range(5)] == [16] * 5
    if hasattr(backend, 'calls'):
        assert len(backend.calls) - calls_before == result.model_calls
    records = [evaluation_record(ev, result) for ev in result.evaluations]
    key = 'count' if backend.kind == 'count' else '0.01'
    found = {b.direction: b for b in boundaries(records, key)}
    assert set(found) == {d.name for d in directions(config.space)}
    for boundary in found.values():
        assert boundary.image == 'f'
        if boundary.censored:
            assert boundary.reached_end or len(result.evaluations) == 150
        else:
            assert boundary.clean < boundary.violating
    # Both stand-ins see black fill: rotation's corners move the confidence one by 0.01 inside its
    # range; zooming out to 0.7 pads half the frame black, five 'animals' more for the count one.
    broken = ('rotation+', 'rotation-') if backend.kind == 'confidence' else ('scaling-',)
    assert not any(found[name].censored for name in broken)


def test_boundaries_read_from_any_search_use_its_single_relation_evaluations():
    config = SearchConfig(algorithm='nsga2', population=10, evaluations=200, seed=1)
    result = run_search(make_frame(96, 64, seed=2), ImageStatsBackend(), config, image_id='g')
    records = [evaluation_record(ev, result) for ev in result.evaluations]
    singles = [r for r in records if r['order'] == 1 and not r['failed']]
    found = boundaries(records, '0.01')
    assert sum(b.evaluations for b in found) <= len(singles)
    for b in found:
        relation = b.direction[:-1]
        sign = 1 if b.direction.endswith('+') else -1
        nominal = RELATION_BY_ID[relation].nominal
        mine = [
            r
            for r in singles
            if relation in r['parameters'] and sign * (r['parameters'][relation] - nominal) > 0
        ]
        bad = [abs(r['parameters'][relation] - nominal) for r in mine if r['violation']['0.01']]
        assert b.violating == (pytest.approx(min(bad)) if bad else None)


def test_uniform_samples_activate_every_relation_of_the_region_inside_its_ranges():
    space = SearchSpace.from_options(['rotation', 'turbidity'], {'rotation': (-2, 2), 'turbidity': (0, 0.3)})
    genotypes = uniform_genotypes(space, 500, np.random.default_rng(0))
    compositions = [decode(x, space) for x in genotypes]
    assert all(c.parameters.keys() >= {'rotation', 'turbidity'} for c in compositions)
    rotations = np.array([c.parameters['rotation'] for c in compositions])
    assert rotations.min() >= -2 and rotations.max() <= 2 and rotations.std() > 0.9  # uniform: 4/sqrt(12)
    config = SearchConfig(algorithm='uniform', population=10, evaluations=30, seed=4, space=space)
    first = run_search(make_frame(64, 48), ImageStatsBackend(), config)
    again = run_search(make_frame(64, 48), ImageStatsBackend(), config)
    assert [ev.genotype.tolist() for ev in first.evaluations] == [
        ev.genotype.tolist() for ev in again.evaluations
    ]
    assert all(ev.composition.order == 2 for ev in first.evaluations)


def test_each_class_has_its_boundary_and_the_smallest_is_the_answers():
    config = SearchConfig(algorithm='envelope', population=16, evaluations=200, seed=0)
    result = run_search(make_frame(96, 64, seed=2), ImageStatsBackend(), config, image_id='f')
    records = [evaluation_record(ev, result) for ev in result.evaluations]
    whole = {b.direction: b for b in boundaries(records, '0.01')}
    classes = ImageStatsBackend.classes
    per = {c: {b.direction: b for b in boundaries(records, '0.01', cls=c)} for c in classes}
    broken = 0
    for direction, boundary in whole.items():
        found = [per[c][direction].violating for c in classes if per[c][direction].violating is not None]
        # The answer changes where its first class does (Eq. 5: some class moved by the threshold).
        assert boundary.violating == (min(found) if found else None), direction
        broken += bool(found)
    assert broken >= 2
