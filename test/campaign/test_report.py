"""Tests of the campaign report on the fixed fixture (test/fixtures/campaign_results), values by hand.

Per cell, the fixture's solutions are (see make_fixture.py), with order-0 and failed ones left out:
CLIP MetaVLM: {1} o1 v(1%), {2,3} o2 v(1,3%), {2,3} o2 v(1,3,5%), {1,2,5} o3 v(1,3%);
CLIP Rand: {1} o1 -, {1,3} o2 v(1%), {1..6} o6 v(1,3,5%), {2,3} o2 v(1%);
BLIP MetaVLM: {3} o1 v, {3,4} o2 -, {3} o1 v; BLIP Rand: {5} o1 -, {2,6} o2 v, {1,2,4} o3 -, {3} o1 -.
Every model and algorithm has 8 cells (2 images x 4 runs), so counts are 8 times the per-cell ones.
"""

import csv
import io
import shutil
from pathlib import Path

import pytest
from scipy.stats import mannwhitneyu

from metavlm_ros.campaign.report import build_report, render_csv, render_markdown, write_report
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.results import read_jsonl

FIXTURE = Path(__file__).resolve().parent.parent / 'fixtures' / 'campaign_results'


@pytest.fixture(scope='module')
def report():
    return build_report(FIXTURE)


def test_rq1_per_image_comparison(report):
    table = report.table('rq1')
    assert len(table.rows) == 4
    # reef, CLIP: MetaVLM's four runs all above Rand's: A12 = 16/16; exact two-sided p = 2 / C(8, 4) = 2/70.
    assert table.cell('HV MetaVLM (mean)', model='clip:tiny', image='reef') == pytest.approx(0.65)
    assert table.cell('HV Rand (mean)', model='clip:tiny', image='reef') == pytest.approx(0.25)
    assert table.cell('A12', model='clip:tiny', image='reef') == pytest.approx(1.0)
    assert table.cell('p', model='clip:tiny', image='reef') == pytest.approx(2 / 70)
    assert table.cell('magnitude', model='clip:tiny', image='reef') == 'large'
    assert table.cell('better', model='clip:tiny', image='reef') == 'MetaVLM'
    # wreck, CLIP: MetaVLM wins 2+4+1+3 = 10 of 16 pairs: A12 0.625 (small); U = 10, and of the 70
    # equally likely splits 24 have U <= 6, so the two-sided p is 48/70: no significant difference,
    # which the paper prints as the equivalence sign, not as a magnitude.
    assert table.cell('A12', model='clip:tiny', image='wreck') == pytest.approx(0.625)
    assert table.cell('magnitude', model='clip:tiny', image='wreck') == '≡'
    assert table.cell('p', model='clip:tiny', image='wreck') == pytest.approx(48 / 70)
    assert table.cell('better', model='clip:tiny', image='wreck') == 'no significant difference'
    # reef, BLIP: the mirror image of CLIP's reef: Rand better.
    assert table.cell('A12', model='blip:tiny', image='reef') == pytest.approx(0.0)
    assert table.cell('better', model='blip:tiny', image='reef') == 'Rand'
    # wreck, BLIP: identical samples.
    assert table.cell('p', model='blip:tiny', image='wreck') == pytest.approx(1.0)
    assert table.cell('A12', model='blip:tiny', image='wreck') == pytest.approx(0.5)
    assert table.cell('magnitude', model='blip:tiny', image='wreck') == '≡'
    # With 4 runs against 4 only full separation (p = 2/70) is significant; 15 of 16 pairs gives
    # p = 4/70: the note says so, so a reader does not take 0.94 for a result the runs could show.
    assert 'with 4 runs against 4, p < 0.05 needs A12 >= 1.000 or <= 0.000' in table.note
    assert table.note.count('What the runs can show') == 1 and '  ' not in table.note


def test_rq1_note_says_nothing_of_detectable_effects_when_nothing_was_compared():
    from metavlm_ros.campaign.tables import _detectable

    assert _detectable(set(), 0.05) == ''


def test_table4_view_one_row_per_image_models_side_by_side(report):
    table = report.table('table4')
    assert table.columns == ['image', 'clip:tiny p', 'clip:tiny A12', 'clip:tiny best', 'blip:tiny p',
                             'blip:tiny A12', 'blip:tiny best']  # fmt: skip
    # The same tests as the RQ1 table: reef is decided both ways, wreck is not significant for either.
    assert table.row(image='reef') == ['reef', pytest.approx(2 / 70), 'large', 'MetaVLM',
                                       pytest.approx(2 / 70), 'large', 'Rand']  # fmt: skip
    assert table.row(image='wreck') == ['wreck', pytest.approx(48 / 70), '≡', '≡', 1.0, '≡', '≡']
    assert '| wreck | 0.6857 | ≡ | ≡ | 1.0000 | ≡ | ≡ |' in render_markdown(report)


def test_rq1_totals(report):
    totals = report.table('rq1-totals')
    assert totals.row(model='clip:tiny')[1:] == [1, 0, 1]
    assert totals.row(model='blip:tiny')[1:] == [0, 1, 1]
    assert totals.row(model='all models')[1:] == [1, 1, 2]


def test_rq21_confidence_model(report):
    table = report.table('rq2_1-clip_tiny')
    assert table.columns[:5] == [
        'order',
        'MetaVLM occurrence %',
        'MetaVLM VR (Eq. 6) % (Th=1%)',
        'MetaVLM VR (Eq. 6) % (Th=3%)',
        'MetaVLM VR (Eq. 6) % (Th=5%)',
    ]
    # MetaVLM: 4 solutions per cell, orders 1, 2, 2, 3; Rand: orders 1, 2, 6, 2.
    assert table.row(order=1) == [1, 0.25, 1.0, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0]
    assert table.row(order=2) == [2, 0.5, 1.0, 1.0, 0.5, 0.5, 1.0, 0.0, 0.0]
    assert table.row(order=3) == [3, 0.25, 1.0, 1.0, 0.0, 0.0, None, None, None]
    assert table.row(order=4) == [4, 0.0, None, None, None, 0.0, None, None, None]
    assert table.row(order=6) == [6, 0.0, None, None, None, 0.25, 1.0, 1.0, 1.0]


def test_rq21_count_model(report):
    table = report.table('rq2_1-blip_tiny')
    assert table.columns == ['order', 'MetaVLM occurrence %', 'MetaVLM VR (Eq. 6) % (count)',
                             'Rand occurrence %', 'Rand VR (Eq. 6) % (count)']  # fmt: skip
    assert table.row(order=1) == [1, pytest.approx(2 / 3), 1.0, 0.5, 0.0]
    assert table.row(order=2) == [2, pytest.approx(1 / 3), 0.0, 0.25, 1.0]
    assert table.row(order=3) == [3, 0.0, None, 0.25, 0.0]


def test_rq22_top_compositions(report):
    table = report.table('rq2_2-clip_tiny-nsga2-0_01')
    # The paper's Table 6 'VR' is a composition's share of all violations; Eq. 6 is another number.
    assert table.columns == ['rank', 'composition', 'order', 'violations', 'share of violations %',
                             'solutions', 'VR (Eq. 6) %']  # fmt: skip
    # 4 violations per cell: {2,3} twice, {1} and {1,2,5} once; ties ranked by order.
    assert table.rows == [
        [1, '{2,3}', 2, 16, 0.5, 16, 1.0],
        [2, '{1}', 1, 8, 0.25, 8, 1.0],
        [3, '{1,2,5}', 3, 8, 0.25, 8, 1.0],
    ]
    assert report.table('rq2_2-clip_tiny-nsga2-0_05').rows == [[1, '{2,3}', 2, 8, 1.0, 16, 0.5]]
    third = pytest.approx(1 / 3)
    assert report.table('rq2_2-clip_tiny-random-0_01').rows == [
        [1, '{1,3}', 2, 8, third, 8, 1.0],
        [2, '{2,3}', 2, 8, third, 8, 1.0],
        [3, '{1,2,3,4,5,6}', 6, 8, third, 8, 1.0],
    ]
    assert report.table('rq2_2-blip_tiny-nsga2-count').rows == [[1, '{3}', 1, 16, 1.0, 16, 1.0]]
    assert report.table('rq2_2-blip_tiny-random-count').rows == [[1, '{2,6}', 2, 8, 1.0, 8, 1.0]]


def test_rq3_compares_one_mean_strength_per_image_and_run(report):
    table = report.table('rq3-clip_tiny-0_01')
    assert table.columns == ['order', 'MetaVLM VS', 'MetaVLM violations', 'MetaVLM samples', 'Rand VS',
                             'Rand violations', 'Rand samples', 'p', 'A12', 'magnitude']  # fmt: skip
    assert table.row(order=1) == [1, pytest.approx(0.02), 8, 8, None, 0, 0, None, None, None]
    order2 = table.row(order=2)
    # MetaVLM (0.06 + 0.10) / 2 = 0.08 in each of its 8 searches; Rand (0.015 + 0.02) / 2 = 0.0175.
    # The test sees 8 search means per side, not the 16 pooled pairs.
    assert order2[:7] == [2, pytest.approx(0.08), 16, 8, pytest.approx(0.0175), 16, 8]
    per_run = mannwhitneyu([0.08] * 8, [0.0175] * 8, alternative='two-sided').pvalue
    pooled = mannwhitneyu([0.06, 0.10] * 8, [0.015, 0.02] * 8, alternative='two-sided').pvalue
    assert order2[7] == pytest.approx(per_run) and per_run > 10 * pooled
    assert order2[8:] == [1.0, 'large']
    assert table.row(order=6) == [6, None, 0, 0, pytest.approx(0.2), 8, 8, None, None, None]
    assert 'pooled' not in table.title
    assert 'RQ3 samples: one value per (image, run): the mean violation strength of that search.' in (
        report.notes
    )
    at3 = report.table('rq3-clip_tiny-0_03')
    assert at3.row(order=2)[:4] == [2, pytest.approx(0.07), 16, 8]
    blip = report.table('rq3-blip_tiny-count')
    # Strengths 1 and 2 in each MetaVLM search: 16 pairs, 8 search means of 1.5.
    assert blip.row(order=1)[:7] == [1, pytest.approx(1.5), 16, 8, None, 0, 0]
    assert blip.row(order=2)[:7] == [2, None, 0, 0, pytest.approx(1.0), 8, 8]


def test_rq3_pooled_pairs_is_an_option_and_says_so():
    pooled_report = build_report(FIXTURE, rq3='pooled')
    table = pooled_report.table('rq3-clip_tiny-0_01')
    order2 = table.row(order=2)
    assert order2[:7] == [2, pytest.approx(0.08), 16, 16, pytest.approx(0.0175), 16, 16]
    expected = mannwhitneyu([0.06, 0.10] * 8, [0.015, 0.02] * 8, alternative='two-sided').pvalue
    assert order2[7] == pytest.approx(expected)
    assert table.title.endswith('(pooled pairs)')
    assert 'POOLED' in table.note
    with pytest.raises(ParameterError, match='unknown RQ3 sample "median"'):
        build_report(FIXTURE, rq3='median')


def test_solution_set_options():
    pareto = build_report(FIXTURE, solutions='pareto').table('rq2_1-clip_tiny')
    # Pareto indices 1 and 3: MetaVLM {1} (o1) and {2,3} (o2, violating at 5%).
    assert pareto.row(order=1)[:5] == [1, 0.5, 1.0, 0.0, 0.0]
    assert pareto.row(order=2)[:5] == [2, 0.5, 1.0, 1.0, 1.0]
    final = build_report(FIXTURE, solutions='final').table('rq2_1-clip_tiny')
    # Last generation of MetaVLM: {2,3} (o2), {1,2,5} (o3) and a failed evaluation, left out.
    assert final.row(order=2)[1] == 0.5
    assert final.row(order=3)[1] == 0.5
    assert final.row(order=1)[1] == 0.0
    md = render_markdown(build_report(FIXTURE, solutions='pareto'))
    assert "Solution set: each search's non-dominated set" in md
    # Every RQ2/RQ3 table says which set it uses.
    assert md.count("Solution set: each search's non-dominated set (f_pred > 0).") == 2 + 8 + 4


def test_writers(report, tmp_path):
    md = render_markdown(report)
    assert '## RQ1 (Table 4): hypervolume of MetaVLM vs Rand across runs' in md
    assert '| clip:tiny | reef | 4 | 4 | 0.6500 | 0.2500 | 0.0286 | 1.000 | large | MetaVLM |' in md
    assert 'Cells: 32 of 32 finished.' in md
    rows = list(csv.reader(io.StringIO(render_csv(report.table('rq2_1-clip_tiny')))))
    # Columns labelled % hold percentages, as report.md shows them (25.0, not 0.25).
    assert rows[0][1] == 'MetaVLM occurrence %'
    assert rows[1][:3] == ['1', '25.0', '100.0']
    assert rows[3][5:] == ['0.0', '', '', '']  # order 3 has no Rand solutions: empty fields
    rq1 = list(csv.reader(io.StringIO(render_csv(report.table('rq1')))))
    assert rq1[1][4:6] == ['0.65', '0.25']  # hypervolumes are not percentages

    html_files = write_report(report, tmp_path / 'html', fmt='html')
    page = html_files[0].read_text()
    assert html_files[0].name == 'index.html'
    assert '<h2 id="rq1">' in page and 'plots/hv-clip_tiny.png' in page
    pngs = [p for p in html_files if p.suffix == '.png']
    # One front per model and image, one VR plot and one HV plot per model.
    assert len(pngs) == 2 * 2 + 2 + 2
    assert all(p.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' for p in pngs)
    csv_files = write_report(report, tmp_path / 'csv', fmt='csv')
    assert {p.name for p in csv_files} >= {'rq1.csv', 'rq1-totals.csv', 'rq2_1-clip_tiny.csv'}


def test_bad_input(tmp_path):
    with pytest.raises(InputError, match='not a campaign results directory'):
        build_report(tmp_path)
    with pytest.raises(ParameterError, match='unknown solution set "best"'):
        build_report(FIXTURE, solutions='best')
    with pytest.raises(ParameterError, match='unknown report format'):
        write_report(build_report(FIXTURE), tmp_path, fmt='pdf')


def test_partial_campaign(tmp_path):
    # A campaign still running: only MetaVLM cells of CLIP so far. RQ1 is skipped with a note.
    partial = tmp_path / 'partial'
    shutil.copytree(FIXTURE, partial)
    for cell in (partial / 'cells').iterdir():
        if not cell.name.startswith('m0-nsga2'):
            shutil.rmtree(cell)
    report = build_report(partial)
    assert 'Cells: 8 of 32 finished.' in report.notes
    assert any(note.startswith('RQ1 needs both algorithms') for note in report.notes)
    assert 'blip:tiny: no finished cells yet.' in report.notes
    assert report.table('rq2_1-clip_tiny').row(order=2)[:2] == [2, 0.5]


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
