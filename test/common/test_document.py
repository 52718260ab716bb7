"""The document model (common/document.py): one document as Markdown, HTML and CSV, written atomically."""

import csv
import io
import math
import os

import pytest

from metavlm_ros.common.document import (
    Bullets,
    Code,
    Document,
    Figure,
    Link,
    Paragraph,
    Preformatted,
    Section,
    Strong,
    Table,
    markdown_text,
    render_csv,
    render_html,
    render_markdown,
    write_csv,
    write_document,
)


def table() -> Table:
    return Table(
        key='rates',
        title='Rates <by order>',
        columns=['order', 'share %', 'p', 'label'],
        rows=[[1, 0.25, 0.03125, Code('a|b')], [2, None, 1e-6, '<b>&']],
        formats=['d', '%', 'p', ''],
        note='Share: violations over evaluations.',
    )


def document() -> Document:
    return Document(
        'Report <1>',
        [
            Paragraph('Results: ', Code('/r/x'), '; outcome ', Strong('PASS & <ok>'), '\nsecond line'),
            Bullets(['one', Paragraph('see ', Link('the verdict', 'v/verdict.md?a=1&b="2"'))]),
            table().section(),
            Section('Plots', [Figure('plots/a b.png', 'f_trans "against" f_pred')], anchor='plots'),
            Section('Configuration', [Preformatted('{\n "name": "<x>"\n}', 'json')]),
        ],
        page_title='Page & title',
        contents=True,
    )


def test_markdown_shows_every_block_in_order_a_blank_line_between():
    assert render_markdown(document()) == (
        '# Report <1>\n\n'
        'Results: `/r/x`; outcome **PASS & <ok>**\nsecond line\n\n'
        '- one\n- see [the verdict](v/verdict.md?a=1&b="2")\n\n'
        '## Rates <by order>\n\n'
        '| order | share % | p | label |\n|---|---|---|---|\n'
        '| 1 | 25.0 | 0.0312 | `a\\|b` |\n| 2 | - | <0.0001 | <b>& |\n\n'
        'Share: violations over evaluations.\n\n'
        '## Plots\n\n![f_trans "against" f_pred](plots/a b.png)\n\n'
        '## Configuration\n\n```json\n{\n "name": "<x>"\n}\n```\n'
    )


def test_a_table_without_rows_says_so_in_its_section_and_shows_its_header_alone():
    empty = Table(key='e', title='Empty', columns=['a', 'b'], rows=[])
    assert render_markdown(Document('T', [empty.section()])) == '# T\n\n## Empty\n\n(no rows)\n'
    assert markdown_text([empty]) == '| a | b |\n|---|---|'
    # An empty cell stays one space wide.
    assert markdown_text([Table(columns=['a', 'b'], rows=[['x', '']])]).endswith('| x | |')


def test_html_escapes_every_text_and_attribute():
    page = render_html(document())
    assert page.startswith('<!DOCTYPE html>') and page.endswith('</body></html>\n')
    assert '<title>Page &amp; title</title>' in page
    assert '<h1>Report &lt;1&gt;</h1>' in page
    assert (
        '<p>Results: <code>/r/x</code>; outcome <strong>PASS &amp; &lt;ok&gt;</strong><br>\nsecond line</p>'
        in page
    )
    assert '<a href="v/verdict.md?a=1&amp;b=&quot;2&quot;">the verdict</a>' in page
    assert '<h2 id="rates">Rates &lt;by order&gt;</h2>' in page
    assert '<td class="n">25.0</td><td class="n">0.0312</td><td><code>a|b</code></td>' in page
    assert '<td>-</td>' in page and '<td>&lt;b&gt;&amp;</td>' in page
    assert '<p>Share: violations over evaluations.</p>' in page
    assert '<img src="plots/a b.png" alt="f_trans &quot;against&quot; f_pred">' in page
    assert '<figcaption>f_trans &quot;against&quot; f_pred</figcaption>' in page
    assert '<pre>{\n &quot;name&quot;: &quot;&lt;x&gt;&quot;\n}</pre>' in page
    # The contents list every section, linked, before the first one.
    contents = '<ul><li><a href="#rates">Rates &lt;by order&gt;</a></li><li><a href="#plots">Plots</a></li>'
    assert page.index('<h2>Contents</h2>') < page.index(contents) < page.index('<h2 id="rates">')
    assert '<b>' not in page and '"2"' not in page


def test_csv_holds_raw_values_percentages_in_percent_columns_and_empty_fields_for_none():
    rows = list(csv.reader(io.StringIO(render_csv(table()))))
    assert rows == [
        ['order', 'share %', 'p', 'label'],
        ['1', '25.0', '0.03125', 'a|b'],
        ['2', '', '1e-06', '<b>&'],
    ]
    nan = Table(columns=['x'], rows=[[math.nan]])
    assert render_csv(nan) == 'x\n""\n'


def test_a_table_is_looked_up_by_its_columns():
    rates = table()
    assert rates.column('order') == [1, 2]
    assert rates.cell('share %', order=1) == 0.25
    assert rates.formatted()[0] == ['1', '25.0', '0.0312', 'a|b']
    with pytest.raises(KeyError):
        rates.row(order=3)


def test_documents_are_written_atomically_by_their_suffix(tmp_path, monkeypatch):
    md = write_document(document(), tmp_path / 'report.md')
    page = write_document(document(), tmp_path / 'report.html')
    sheet = write_csv(table(), tmp_path / 'rates.csv')
    assert md.read_text(encoding='utf-8') == render_markdown(document())
    assert page.read_text(encoding='utf-8') == render_html(document())
    assert sheet.read_text(encoding='utf-8') == render_csv(table())
    with pytest.raises(ValueError, match='.md or .html'):
        write_document(document(), tmp_path / 'report.txt')

    # A write that fails leaves the earlier file whole and no scratch file beside it.
    def fail(src, dst):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'replace', fail)
    with pytest.raises(OSError):
        write_document(Document('Another', []), md)
    assert md.read_text(encoding='utf-8') == render_markdown(document())
    assert sorted(p.name for p in tmp_path.iterdir()) == ['rates.csv', 'report.html', 'report.md']
