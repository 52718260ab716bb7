"""Results read with the tools users open them with (pandas, DuckDB, jq), as written, and docs/results.md's
one-liners run as written: each gets the same records as the project's reader."""

from __future__ import annotations

import collections
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.results import EVALUATIONS, read_jsonl
from test.campaign.configs import small_config
from test.conftest import make_frame
from test.tools_reading import duckdb_rows_match, same_as_ours

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def search_results(tmp_path_factory, tiny_clip_dir) -> Path:
    """`metavlm search` of two frames with the tiny CLIP, in <folder>/results/search as the docs name it."""
    folder = tmp_path_factory.mktemp('reading')
    for seed in (0, 1):
        cv2.imwrite(str(folder / f'frame{seed}.png'), make_frame(96, 64, seed=seed)[..., ::-1])
    out = folder / 'results' / 'search'
    args = ['search', str(folder / 'frame0.png'), str(folder / 'frame1.png'), '--model', str(tiny_clip_dir),
            '--population', '8', '--evaluations', '48', '--quiet', '--out', str(out)]  # fmt: skip
    assert main(args) == 0
    return out


def test_pandas_and_duckdb_read_a_search_as_the_project_does(search_results):
    same_as_ours(search_results)


def test_pandas_and_duckdb_read_a_campaign_cell_as_the_project_does(tmp_path, tiny_clip_dir):
    images = tmp_path / 'images'
    images.mkdir()
    cv2.imwrite(str(images / 'a.png'), make_frame(96, 64, seed=3)[..., ::-1])
    config = small_config(images, tiny_clip_dir, runs=1, algorithms=['nsga2'], evaluations=24)
    run_campaign(config, tmp_path / 'campaign', progress=False, threads=1)
    (cell,) = sorted((tmp_path / 'campaign' / 'cells').iterdir())
    same_as_ours(cell)


def _blocks(language: str) -> list[str]:
    """The fenced `language` blocks of docs/results.md's "Reading results", as written."""
    text = (ROOT / 'docs' / 'results.md').read_text(encoding='utf-8')
    section = text[text.index('## Reading results') :]
    return re.findall(rf'```{language}\n(.*?)```', section, re.S)


def test_the_docs_python_one_liners_run_as_written(search_results):
    folder = search_results.parents[1]
    ours = read_jsonl(search_results / EVALUATIONS)
    pandas_block, duckdb_block, csv_block, reader_block = _blocks('python')
    for block, marker in ((pandas_block, 'pd.read_json'), (duckdb_block, 'GROUP BY'), (csv_block, 'COPY')):
        assert marker in block
        done = subprocess.run(
            [sys.executable, '-c', block], cwd=folder, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        if marker == 'GROUP BY':  # the compositions searched, the most frequent first (DuckDB shows 20)
            counts = collections.Counter(r['composition'] for r in ours)
            (top, n), *_ = counts.most_common(1)
            assert re.search(rf'│ {re.escape(top)}\s+│\s+{n} │', done.stdout), done.stdout
            assert len(counts) <= 20 or f'{len(counts)} rows' in done.stdout
    with open(folder / 'evaluations.csv', newline='') as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r['index']) for r in rows] == [r['index'] for r in ours]
    assert [float(r['f_pred']) for r in rows] == [r['f_pred'] for r in ours]
    assert [float(r['animal']) for r in rows] == [r['followup']['animal'] for r in ours]
    namespace: dict = {}
    exec(reader_block.replace("'results/", f"'{folder}/results/"), namespace)
    assert namespace['records'] == ours


def test_the_docs_jq_one_liner_runs_as_written(search_results):
    (block,) = [b for b in _blocks('bash') if '| jq ' in b]
    if shutil.which('jq') is None:
        pytest.skip('jq is not installed here: the pandas and DuckDB one-liners were run, this one not')
    done = subprocess.run(
        ['bash', '-c', block], cwd=search_results.parents[1], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    expected = [r for r in read_jsonl(search_results / EVALUATIONS) if r['violation']['0.05']]
    assert expected
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert got == [
        {k: r[k] for k in ('image', 'index', 'composition', 'f_trans', 'f_pred')} for r in expected
    ]


def test_parquet_tables_keep_every_record_and_its_nested_fields(search_results, tmp_path, capsys):
    import duckdb

    out = tmp_path / 'tables'
    assert main(['export', str(search_results), '--format', 'parquet', '--out', str(out)]) == 0
    assert f'{out}: evaluations.parquet (' in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        'evaluations.parquet',
        'pareto.parquet',
        'summary.parquet',
    ]
    for name in (EVALUATIONS, 'pareto.jsonl', 'summary.jsonl'):
        ours = read_jsonl(search_results / name)
        rows = duckdb.sql(f"SELECT * FROM read_parquet('{out / name.replace('.jsonl', '.parquet')}')")
        duckdb_rows_match(rows, ours, name)


def test_csv_tables_hold_nested_fields_as_dotted_columns(search_results, tmp_path):
    import pandas

    out = tmp_path / 'tables'
    assert main(['export', str(search_results), '--format', 'csv', '--out', str(out)]) == 0
    ours = read_jsonl(search_results / EVALUATIONS)
    table = pandas.read_csv(out / 'evaluations.csv')  # pandas 3 parses floats exactly by default
    assert table['index'].tolist() == [r['index'] for r in ours]
    assert table['f_pred'].tolist() == [r['f_pred'] for r in ours]
    assert table['followup.animal'].tolist() == [r['followup']['animal'] for r in ours]
    assert table['violation.0.05'].tolist() == [r['violation']['0.05'] for r in ours]
    assert [json.loads(g) for g in table['genotype']] == [r['genotype'] for r in ours]


def test_tables_of_an_earlier_versions_directory_and_refusals(tmp_path, capsys):
    from test.common.searches import search_frames, write_legacy

    old = tmp_path / 'old'
    search_frames(old)
    write_legacy(old)
    assert main(['export', str(old), '--format', 'csv', '--out', str(tmp_path / 'csv')]) == 0
    with open(tmp_path / 'csv' / 'summary.csv', newline='') as handle:
        rows = list(csv.DictReader(handle))
    assert [row['image'] for row in rows] == [r['image'] for r in read_jsonl(old / 'summary.jsonl')]
    capsys.readouterr()
    for args, words in (
        (['--format', 'csv', '--out', str(tmp_path / 'csv')], 'exists; name a new directory'),
        (['--format', 'csv'], 'writes tables into --out DIR'),
        (
            ['--format', 'parquet', '--out', str(tmp_path / 'p'), '--mcap', str(tmp_path / 'x.mcap')],
            '--out DIR',
        ),
        (['--out', str(tmp_path / 'p')], 'needs --mcap OUT.mcap'),
    ):
        assert main(['export', str(old), *args]) == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and words in err, err
    assert main(['export', str(tmp_path), '--format', 'csv', '--out', str(tmp_path / 'n')]) == 2
    assert 'not a results directory' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['csv', 'old']
