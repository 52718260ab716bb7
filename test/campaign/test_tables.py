"""The report's tables (campaign/tables.py) on the fixed campaign, values by hand (campaign_results.py)."""

import pytest
from scipy.stats import mannwhitneyu

from metavlm_ros.campaign.report import build_report, render_markdown
from metavlm_ros.common.errors import ParameterError
from test.campaign.campaign_results import FIXTURE


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
