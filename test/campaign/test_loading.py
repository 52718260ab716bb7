"""Loading a campaign's results (campaign/loading.py): the solution sets, a campaign still running."""

import shutil

from metavlm_ros.campaign.report import build_report, render_markdown
from test.campaign.campaign_results import FIXTURE


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
