"""The report's formats (campaign/formats.py): Markdown, CSV and HTML, written with their plots."""

import csv
import io

from metavlm_ros.campaign.formats import render_csv, render_markdown, write_report


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
