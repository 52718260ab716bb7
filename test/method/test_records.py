"""The stored forms of a search (method/records.py): evaluation and summary records, the Pareto PNG budget."""

from pathlib import Path

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import ResultsStore, read_jsonl
from metavlm_ros.method.records import pareto_png_members, parse_pareto_pngs, summary_record
from metavlm_ros.method.relations import DEFAULT_RELATIONS
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import ImageStatsBackend, UnreadableEvery


def test_a_default_search_uses_the_papers_six_and_its_summary_is_what_it_was(frame):
    result = run_search(frame, ImageStatsBackend(), SearchConfig(population=6, evaluations=12, seed=1))
    assert result.relations == DEFAULT_RELATIONS
    # No new field in a paper search's summary: absence means the paper's six, as in older results.
    assert 'relations' not in summary_record(result)
    assert all(ev.genotype.shape == (12,) for ev in result.evaluations)


def test_store_records_every_evaluation_and_the_front(tmp_path, frame):
    store = ResultsStore(tmp_path / 'out')
    config = SearchConfig(algorithm='nsga2', population=10, evaluations=30, seed=1, pareto_pngs='all')
    with store:
        result = run_search(
            frame, ImageStatsBackend(), config, image_id='f1', store=store, extra_fields={'model': 'm'}
        )
    records = read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')
    assert len(records) == 30
    first = records[0]
    for field in (
        'image',
        'genotype',
        'composition',
        'order',
        'parameters',
        'f_trans',
        'f_pred',
        'source',
        'followup',
        'source_text',
        'followup_text',
        'violation',
        'strength',
        'failed',
        'model',
    ):
        assert field in first
    assert set(first['violation']) == {'0.01', '0.03', '0.05'}
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    assert [p['index'] for p in pareto] == [result.evaluations[i].index for i in result.pareto]
    for p in pareto:
        assert (tmp_path / 'out' / p['frame']).is_file()
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['evaluations'] == 30 and summary['hypervolume'] == pytest.approx(result.hypervolume)


def test_parse_failures_are_failed_evaluations_recorded_with_their_answer(tmp_path, frame):
    from metavlm_ros.common.results import ResultsStore, read_jsonl

    config = SearchConfig(population=6, evaluations=30, seed=3)
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, UnreadableEvery(4), config, store=store)
    failed = [ev for ev in result.evaluations if ev.failed]
    assert failed and all(ev.f_pred == 0.0 and not any(ev.violation.values()) for ev in failed)
    records = read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')
    unreadable = [r for r in records if 'parse_error' in r]
    assert unreadable and all(r['failed'] and r['followup'] is None for r in unreadable)
    assert {r['followup_text'] for r in unreadable} == {'There are some fish.'}
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['parse_failures'] == len(unreadable) == summary['failed']
    # Failed evaluations neither count towards violation rates nor enter the front.
    assert all(not result.evaluations[i].failed for i in result.pareto)
    assert sum(total for _, total in result.violations_by_order['count'].values()) == 30 - len(failed) - sum(
        ev.composition.order == 0 for ev in result.evaluations
    )


def _search(out, frame, *, pareto_pngs, seed, backend, budget):
    config = SearchConfig(population=10, evaluations=budget, seed=seed, pareto_pngs=pareto_pngs)
    with ResultsStore(out) as store:
        return run_search(frame, backend, config, image_id='f', store=store)


def test_the_pareto_png_budget_keeps_both_ends_and_spreads_the_rest(tmp_path):
    # A confidence model's front whose smallest-f_trans members violate no threshold.
    frame, options = make_frame(seed=3), {'seed': 3, 'backend': ImageStatsBackend(), 'budget': 100}
    full = _search(tmp_path / 'all', frame, pareto_pngs='all', **options)
    distinct = pareto_png_members(full, None)
    assert len(distinct) >= 5, 'too small a front to check a budget of 3'
    front = [full.evaluations[i] for i in full.pareto]
    assert not any(front[0].violation.values()), (
        'the front starts with a violation: the test checks too little'
    )
    _search(tmp_path / 'k3', frame, pareto_pngs=3, **options)
    written = [p for p in read_jsonl(tmp_path / 'k3' / 'pareto.jsonl') if p['frame']]
    assert len({p['frame'] for p in written}) == 3 == len(list((tmp_path / 'k3' / 'frames').iterdir()))
    smallest_violation = min((ev for ev in front if any(ev.violation.values())), key=lambda ev: ev.f_trans)
    largest = max(front, key=lambda ev: ev.f_pred)
    # Each PNG is named after the first member of its composition: the chosen one.
    chosen = {int(Path(p['frame']).stem.rsplit('_e', 1)[1]) for p in written}
    assert smallest_violation.index in chosen and largest.index in chosen
    # The third is neither end: the middle of the front.
    assert len(chosen - {smallest_violation.index, largest.index}) == 1
    # The budget changes which PNGs exist, never a record.
    assert read_jsonl(tmp_path / 'k3' / 'evaluations.jsonl') == read_jsonl(
        tmp_path / 'all' / 'evaluations.jsonl'
    )
    none = _search(tmp_path / 'k0', frame, pareto_pngs=0, **options)
    assert none.pareto and not (tmp_path / 'k0' / 'frames').exists()
    assert all(p['frame'] is None for p in read_jsonl(tmp_path / 'k0' / 'pareto.jsonl'))


@pytest.mark.parametrize(
    ('value', 'expected'), [('all', None), (None, None), (-1, None), ('0', 0), (3, 3), ('12', 12)]
)
def test_pareto_png_budgets_parse(value, expected):
    assert parse_pareto_pngs(value) == expected


@pytest.mark.parametrize('value', ['some', -2, 1.5, True, '3.0'])
def test_bad_pareto_png_budgets_are_refused(value):
    with pytest.raises(ParameterError, match='pareto PNGs must be a count'):
        parse_pareto_pngs(value)
