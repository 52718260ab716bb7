"""Anytime results (campaign/anytime.py): hypervolume after each batch, evaluations to NSGA-II's, the plot."""

import numpy as np

from metavlm_ros.campaign.anytime import anytime_band, evaluations_to_reach
from metavlm_ros.campaign.formats import write_report
from metavlm_ros.campaign.loading import CellResult, load_results
from metavlm_ros.campaign.plots import make_plots
from metavlm_ros.campaign.report import build_report
from metavlm_ros.campaign.runner import run_campaign
from test.campaign.configs import small_config


def _cell(anytime):
    return CellResult(info={}, summary={}, solutions=[], anytime=anytime)


def test_evaluations_to_reach_is_the_first_batch_at_or_above_the_target():
    cell = _cell([(6, 0.1), (12, 0.3), (18, 0.3), (24, 0.5)])
    assert [evaluations_to_reach(cell, t) for t in (0.05, 0.3, 0.31, 0.5, 0.6)] == [6, 12, 24, 24, None]


def test_anytime_band_steps_between_batches_over_runs():
    cells = [_cell([(2, 0.1), (4, 0.4)]), _cell([(2, 0.2), (4, 0.2)]), _cell([(2, 0.3), (4, 0.6)])]
    median, low, high = anytime_band(cells, np.arange(1, 5))
    assert median.tolist() == [0.0, 0.2, 0.2, 0.4]
    assert low.tolist() == [0.0, 0.1, 0.1, 0.2] and high.tolist() == [0.0, 0.3, 0.3, 0.6]


def test_a_campaign_report_gives_anytime_hypervolumes_a_table_and_plots(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(
        image_dir, tiny_clip_dir, algorithms=['nsga2', 'mobo'], baseline='nsga2', evaluations=18, runs=2
    )
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    results = load_results(tmp_path / 'out')
    for cell in results.cells:
        # After every batch of 6; the last is the search's own hypervolume, recomputed from its records.
        assert [k for k, _ in cell.anytime] == [6, 12, 18]
        assert np.isclose(cell.anytime[-1][1], cell.summary['hypervolume'], rtol=0, atol=1e-12)
        assert all(a[1] <= b[1] for a, b in zip(cell.anytime, cell.anytime[1:], strict=False))
    report = build_report(tmp_path / 'out')
    table = report.table('anytime-tiny_clip')
    assert table.column('algorithm') == ['MetaVLM', 'MOBO'] and table.column('searches') == [4, 4]
    # NSGA-II reaches its own median on at least half its searches, by definition of the median.
    assert table.cell('searches reaching 100% of NSGA-II', algorithm='MetaVLM') >= 2
    assert table.column('budget') == [18, 18]
    for fmt in ('md', 'html', 'csv'):
        paths = write_report(report, tmp_path / f'report-{fmt}', fmt, plots=False)
        assert any(
            'Anytime' in p.read_text() or 'evaluations to 90% of NSGA-II' in p.read_text() for p in paths
        ), fmt
    written = make_plots(report.results, tmp_path / 'report')
    anytime = [path for title, path in written if title.startswith('Anytime hypervolume')]
    assert len(anytime) == len(results.images) and all(p.stat().st_size > 0 for p in anytime)
