"""`metavlm modes` end to end: results in, modes.json / .md / .html out, read back with pandas and DuckDB."""

from __future__ import annotations

import json

import duckdb
import pandas as pd
import pytest

from metavlm_ros.cli import main
from test.explain.conftest import write_planted


@pytest.fixture(scope='module')
def second_results(tmp_path_factory):
    # Another search of the same double, with other seeds: a second results root.
    return write_planted(tmp_path_factory.mktemp('planted-again') / 'search', seed=40, evaluations=60)


@pytest.fixture(scope='module')
def written(planted_results, second_results, tmp_path_factory):
    out = tmp_path_factory.mktemp('modes') / 'modes'
    assert main(['modes', str(planted_results), str(second_results), '--out', str(out)]) == 0
    return out


def test_the_command_writes_one_mode_a_line_that_pandas_and_duckdb_read(written):
    lines = (written / 'modes.json').read_text(encoding='utf-8').splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(r['label'] for r in records) == ['animal rose', 'trash dropped']
    assert [r['rank'] for r in records] == [1, 2]
    frame = pd.read_json(written / 'modes.json', lines=True)
    assert list(frame['rule']) == [r['rule'] for r in records]
    rows = duckdb.sql(
        'SELECT rank, label, violations_inside, example.render AS render '
        f"FROM read_json('{written}/modes.json') ORDER BY rank"
    ).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (r['rank'], r['label'], r['violations_inside']) for r in records
    ]
    assert all(render.startswith('metavlm render ') for *_, render in rows)
    # Both roots are read: the second's searches count among the supports.
    assert sum(r['searches'] for r in records if r['label'] == 'animal rose') > 6


def test_the_command_writes_the_catalogue_as_markdown_and_html(written):
    markdown = (written / 'modes.md').read_text(encoding='utf-8')
    html = (written / 'modes.html').read_text(encoding='utf-8')
    assert markdown.startswith('# Failure modes')
    assert ': trash dropped' in markdown and ': animal rose' in markdown
    assert 'metavlm render' in markdown and '<table' in html
    assert sorted(p.name for p in written.iterdir()) == ['modes.html', 'modes.json', 'modes.md']


@pytest.mark.parametrize(
    'extra, message',
    [
        (['--max-modes', '0'], '--max-modes must be at least 1'),
        (['--threshold', '2'], '--threshold must lie in (0, 1]'),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(planted_results, tmp_path, capsys, extra, message):
    assert main(['modes', str(planted_results), '--out', str(tmp_path / 'out'), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and message in err and err.count('\n') == 1
    assert not (tmp_path / 'out').exists()


def test_bad_input_is_one_line_and_exit_2(planted_results, written, tmp_path, capsys):
    cases = [
        ([str(tmp_path / 'missing')], tmp_path / 'a', 'no such results directory'),
        ([str(tmp_path)], tmp_path / 'b', 'no results directory'),
        ([str(planted_results)], planted_results / 'modes', 'inside the evidence'),
        ([str(planted_results)], written, 'exists'),
    ]
    for roots, out, message in cases:
        assert main(['modes', *roots, '--out', str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith('metavlm: error: ') and message in err and err.count('\n') == 1, err
    assert not (planted_results / 'modes').exists()
