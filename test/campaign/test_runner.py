"""run_campaign (campaign/runner.py): resume and refusal, its options, relations and algorithms per cell."""

import json
import os

import pytest

from metavlm_ros.campaign.report import build_report
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import read_jsonl
from test.campaign.configs import small_config


def test_campaign_local_resume_and_refusal(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    out = tmp_path / 'out'
    first = run_campaign(config, out, progress=False, threads=1)
    assert (first.total, first.skipped, first.completed) == (8, 0, 8)
    record = json.loads((out / 'campaign.json').read_text())
    assert record['version'] and record['cells'] == 8
    assert record['models'][0]['weights_sha256'] and len(record['models'][0]['weights_sha256']) == 64
    assert [im['id'] for im in record['images']] == ['img0', 'img1']
    assert (out / 'frames' / 'img0.png').is_file()
    cell_dir = out / 'cells' / 'm0-nsga2-r000-img0'
    records = read_jsonl(cell_dir / 'evaluations.jsonl')
    assert len(records) == 24
    assert {r['run'] for r in records} == {0} and {r['cell'] for r in records} == {'m0-nsga2-r000-img0'}
    assert {(r['model'], r['backend'], r['stamp_ns']) for r in records} == {(str(tiny_clip_dir), 'clip', 0)}
    # Where the frame came from: the image of the folder, and its position there.
    assert {(r['frame_file'], r['frame_index']) for r in records} == {(str(image_dir / 'img0.png'), 0)}
    info = json.loads((cell_dir / 'cell.json').read_text())
    assert info['search_seconds'] > 0 and info['finished'] >= info['started']

    # Again: nothing to do. A lost cell is redone, and only it.
    mtime = (out / 'cells' / 'm0-random-r001-img1' / 'cell.json').stat().st_mtime_ns
    again = run_campaign(config, out, progress=False, threads=1)
    assert (again.skipped, again.completed) == (8, 0)
    import shutil

    shutil.rmtree(cell_dir)
    redo = run_campaign(config, out, progress=False, threads=1)
    assert (redo.skipped, redo.completed) == (7, 1)
    assert read_jsonl(cell_dir / 'evaluations.jsonl') == records
    assert (out / 'cells' / 'm0-random-r001-img1' / 'cell.json').stat().st_mtime_ns == mtime
    assert len(json.loads((out / 'campaign.json').read_text())['invocations']) == 3

    # Two campaigns writing to one directory at once: the second is refused.
    from metavlm_ros.campaign.runner import _exclusive

    with _exclusive(out), pytest.raises(ParameterError, match='another metavlm campaign is writing to it'):
        run_campaign(config, out, progress=False)
    assert len(json.loads((out / 'campaign.json').read_text())['invocations']) == 3

    other = small_config(image_dir, tiny_clip_dir, evaluations=12)
    with pytest.raises(ParameterError, match='holds results of a different campaign config'):
        run_campaign(other, out, progress=False)
    forced = run_campaign(other, out, progress=False, force=True, threads=1)
    assert forced.completed == 0  # same cell ids: mixing keeps what is there
    assert json.loads((out / 'campaign.json').read_text())['previous']


def test_executor_options_checked(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    with pytest.raises(ParameterError, match='unknown executor "ray"'):
        run_campaign(config, tmp_path / 'o', executor='ray')
    with pytest.raises(ParameterError, match='--workers must be an integer >= 1'):
        run_campaign(config, tmp_path / 'o', workers=0)
    with pytest.raises(ParameterError, match='--scheduler needs --executor dask'):
        run_campaign(config, tmp_path / 'o', scheduler='tcp://127.0.0.1:1')
    assert not os.path.exists(tmp_path / 'o')


def test_relations_narrow_every_cell(tmp_path, image_dir, tiny_clip_dir):
    relations = {'enabled': ['shear'], 'ranges': {'shear': [0.0, 0.1]}}
    config = small_config(
        image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=12, relations=relations
    )
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    records = [
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl.gz') for r in read_jsonl(path)
    ]
    assert len(records) == 2 * 12
    assert {r['composition'] for r in records} <= {'{}', '{5}'}
    assert all(0.0 <= r['parameters'].get('shear', 0.0) <= 0.1 for r in records)
    with pytest.raises(ParameterError, match=r'relations.ranges.shear: must be \[low, high\], got 5'):
        small_config(image_dir, tiny_clip_dir, relations={'ranges': {'shear': 5}})


def test_a_campaign_of_three_algorithms_on_underwater_relations_reports_every_pair(
    tmp_path, image_dir, tiny_clip_dir
):
    config = small_config(
        image_dir,
        tiny_clip_dir,
        algorithms=['nsga2', 'nsga3', 'random'],
        evaluations=12,
        relations={'enabled': ['turbidity', 'marine_snow']},
    )
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    records = [
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl.gz') for r in read_jsonl(path)
    ]
    assert len(records) == 3 * 2 * 2 * 12  # algorithms x runs x images x budget
    assert {r['composition'] for r in records} <= {'{}', '{8}', '{9}', '{8,9}'}
    assert all(len(r['genotype']) == 4 for r in records)
    summaries = [read_jsonl(p)[0] for p in (tmp_path / 'out' / 'cells').glob('*/summary.jsonl.gz')]
    assert {tuple(s['relations']) for s in summaries} == {('turbidity', 'marine_snow')}
    report = build_report(tmp_path / 'out')
    keys = {t.key for t in report.tables}
    assert {'rq1', 'rq1-nsga3-vs-random', 'rq1-totals', 'rq1-totals-nsga3-vs-random'} <= keys
    assert report.table('rq2_1-tiny_clip').column('order') == [1, 2]
    rq3 = report.table('rq3-tiny_clip-0_01')
    assert 'p MetaVLM vs Rand' in rq3.columns and 'p NSGA-III vs Rand' in rq3.columns
    assert report.table('rq1-nsga3-vs-random').column('runs NSGA-III') == [2, 2]


def test_a_campaign_runs_mobo_beside_nsga2_on_equal_budgets(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(
        image_dir, tiny_clip_dir, algorithms=['nsga2', 'mobo'], baseline='nsga2', evaluations=18, runs=1
    )
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    summaries = [read_jsonl(p)[0] for p in (tmp_path / 'out' / 'cells').glob('*/summary.jsonl.gz')]
    by_algorithm = {}
    for s in summaries:
        by_algorithm.setdefault(s['algorithm'], []).append(s['evaluations'])
    assert by_algorithm == {'nsga2': [18, 18], 'mobo': [18, 18]}
    report = build_report(tmp_path / 'out')
    assert report.table('rq1-mobo-vs-nsga2').column('runs MOBO') == [1, 1]
