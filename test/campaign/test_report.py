"""build_report (campaign/report.py): its inputs, the pairs it compares, the relations it names."""

import shutil
from pathlib import Path

import pytest

from metavlm_ros.campaign.report import build_report, render_markdown, write_report
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.results import read_jsonl
from test.campaign.campaign_results import FIXTURE


def test_bad_input(tmp_path):
    with pytest.raises(InputError, match='not a campaign results directory'):
        build_report(tmp_path)
    with pytest.raises(ParameterError, match='unknown solution set "best"'):
        build_report(FIXTURE, solutions='best')
    with pytest.raises(ParameterError, match='unknown report format'):
        write_report(build_report(FIXTURE), tmp_path, fmt='pdf')


def _three_algorithms(tmp_path: Path, baseline: str | None = None) -> Path:
    """The fixture with a third algorithm, 'nsga3': MetaVLM's solutions, hypervolumes 0.3 higher."""
    import json

    three = tmp_path / 'three'
    shutil.copytree(FIXTURE, three)
    for cell in sorted((three / 'cells').glob('m*-nsga2-*')):
        copy = cell.parent / cell.name.replace('nsga2', 'nsga3')
        shutil.copytree(cell, copy)
        info = json.loads((copy / 'cell.json').read_text())
        (copy / 'cell.json').write_text(json.dumps({**info, 'id': copy.name, 'algorithm': 'nsga3'}))
        summary = json.loads((copy / 'summary.jsonl').read_text())
        summary.update(algorithm='nsga3', hypervolume=summary['hypervolume'] + 0.3)
        (copy / 'summary.jsonl').write_text(json.dumps(summary) + '\n')
        records = read_jsonl(copy / 'evaluations.jsonl')
        lines = [json.dumps({**r, 'algorithm': 'nsga3', 'cell': copy.name}) + '\n' for r in records]
        (copy / 'evaluations.jsonl').write_text(''.join(lines))
    campaign = json.loads((three / 'campaign.json').read_text())
    campaign['config']['algorithms'] = ['nsga2', 'nsga3', 'random']
    if baseline is not None:
        campaign['config']['baseline'] = baseline
    campaign['cells'] = 48
    (three / 'campaign.json').write_text(json.dumps(campaign))
    return three


def test_a_campaign_with_three_algorithms_reports_every_pair_against_the_baseline(tmp_path, report):
    three = build_report(_three_algorithms(tmp_path))
    keys = [t.key for t in three.tables]
    # MetaVLM vs Rand keeps the paper's tables, byte for byte; NSGA-III vs Rand gets its own.
    for key in ('rq1', 'table4', 'rq1-totals'):
        assert three.table(key).rows == report.table(key).rows
        assert three.table(key).title == report.table(key).title
    for key in ('rq1-nsga3-vs-random', 'table4-nsga3-vs-random', 'rq1-totals-nsga3-vs-random'):
        assert key in keys
    pair = three.table('rq1-nsga3-vs-random')
    assert pair.title == 'RQ1 (Table 4): hypervolume of NSGA-III vs Rand across runs'
    assert pair.cell('HV NSGA-III (mean)', model='clip:tiny', image='reef') == pytest.approx(0.95)
    assert pair.cell('HV Rand (mean)', model='clip:tiny', image='reef') == pytest.approx(0.25)
    assert pair.cell('better', model='clip:tiny', image='reef') == 'NSGA-III'
    # wreck, CLIP: not significant for MetaVLM; 0.3 higher, NSGA-III's four runs all beat Rand's.
    assert pair.cell('A12', model='clip:tiny', image='wreck') == pytest.approx(1.0)
    assert three.table('rq1-totals-nsga3-vs-random').row(model='all models')[1:] == [3, 0, 1]
    assert 'Comparisons (RQ1, RQ3): MetaVLM vs Rand; NSGA-III vs Rand' in ' '.join(three.notes)
    # RQ3: one test per pair, the columns named by the pair.
    rq3 = three.table('rq3-clip_tiny-0_01')
    assert rq3.columns[10:] == [
        f'{column} {pair} vs Rand' for pair in ('MetaVLM', 'NSGA-III') for column in ('p', 'A12', 'magnitude')
    ]
    two = report.table('rq3-clip_tiny-0_01')
    assert rq3.row(order=2)[10:13] == two.row(order=2)[7:10]
    # NSGA-III judged MetaVLM's solutions: its strengths equal MetaVLM's.
    assert rq3.row(order=2)[13:16] == two.row(order=2)[7:10]


def test_the_baseline_is_chosen_by_the_campaign_or_the_report(tmp_path):
    by_campaign = build_report(_three_algorithms(tmp_path, baseline='nsga2'))
    keys = {t.key for t in by_campaign.tables}
    assert {'rq1-nsga3-vs-nsga2', 'rq1-random-vs-nsga2'} <= keys and 'rq1' not in keys
    every = build_report(tmp_path / 'three', baseline='all')
    keys = [t.key for t in every.tables if t.key.startswith('rq1-totals')]
    assert keys == ['rq1-totals-nsga2-vs-nsga3', 'rq1-totals', 'rq1-totals-nsga3-vs-random']
    with pytest.raises(ParameterError, match='baseline "moead" is not one of the campaign'):
        build_report(tmp_path / 'three', baseline='moead')


def test_a_campaign_with_underwater_relations_lists_their_orders_and_names_them(tmp_path, report):
    import json

    wider = tmp_path / 'wider'
    shutil.copytree(FIXTURE, wider)
    relations = ['rotation', 'scaling', 'histogram_equalization', 'downsampling', 'shear', 'translation',
                 'turbidity', 'marine_snow']  # fmt: skip
    for summary_path in (wider / 'cells').glob('*/summary.jsonl'):
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, 'relations': relations}) + '\n')
    wide = build_report(wider)
    assert wide.table('rq2_1-clip_tiny').column('order') == [1, 2, 3, 4, 5, 6, 7, 8]
    assert wide.table('rq3-clip_tiny-0_01').column('order') == [1, 2, 3, 4, 5, 6, 7, 8]
    assert wide.table('rq2_1-clip_tiny').rows[:6] == report.table('rq2_1-clip_tiny').rows
    text = render_markdown(wide)
    assert '- Relations: MR1 rotation, MR2 scaling' in text and 'MR8 turbidity, MR9 marine_snow' in text
    assert 'Solutions of order 1-8' in text
    assert '- Relations:' not in render_markdown(report)  # the paper's six: the header is the paper's
    # MR3's note explains MR3 in the tables: a campaign without it does not get it.
    assert any(note.startswith('MR3 (histogram equalisation)') for note in wide.notes)
    for summary_path in (wider / 'cells').glob('*/summary.jsonl'):
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps({**summary, 'relations': ['turbidity', 'marine_snow']}) + '\n')
    assert not any(note.startswith('MR3') for note in build_report(wider).notes)
