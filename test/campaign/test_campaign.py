"""Tests of campaigns: config validation, seeds and cells, atomic commits, resume, both executors."""

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from metavlm_ros.campaign.cells import cell_seed, finished_cells, load_images, plan_cells
from metavlm_ros.campaign.config import load_config, parse_config
from metavlm_ros.campaign.executors import CellOutcome, commit_cell
from metavlm_ros.campaign.report import build_report, write_report
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import read_jsonl
from test.conftest import make_frame


@pytest.fixture
def image_dir(tmp_path):
    folder = tmp_path / 'images'
    folder.mkdir()
    for i in range(2):
        cv2.imwrite(str(folder / f'img{i}.png'), cv2.cvtColor(make_frame(48, 36, seed=i), cv2.COLOR_RGB2BGR))
    return folder


def small_config(image_dir, model_dir, **overrides):
    data = {
        'frames': {'sources': [str(image_dir)]},
        'models': [{'backend': 'clip', 'model': str(model_dir), 'name': 'tiny-clip', 'device': 'cpu'}],
        'runs': 2,
        'population': 6,
        'evaluations': 24,
        'seed': 5,
    }
    data.update(overrides)
    return parse_config(data, base_dir=image_dir.parent)


def test_invalid_config_lists_every_problem(tmp_path, tiny_clip_dir):
    data = {
        'frames': {'sources': ['missing-folder'], 'every': 0},
        'models': [
            {'backend': 'clip', 'model': str(tiny_clip_dir)},
            {'backend': 'x', 'model': './nowhere', 'colour': 1},
        ],
        'algorithms': ['nsga2', 'hillclimb'],
        'runs': 0,
        'population': 'thirty',
        'thresholds': [0.01, 1.5],
        'budget': 10,
    }
    with pytest.raises(ParameterError) as info:
        parse_config(data, base_dir=tmp_path, source='c.yaml')
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith('c.yaml: 10 problems: ')
    for expected in (
        'budget: unknown key',
        'frames.every: must be >= 1, got 0',
        f'frames.sources[0]: no such file or directory: {tmp_path / "missing-folder"}',
        'models[1].colour: unknown key',
        'models[1].backend: unknown backend "x"',
        f'models[1].model: no such model directory: {tmp_path / "nowhere"}',
        'algorithms[1]: unknown algorithm "hillclimb"',
        'runs: must be >= 1, got 0',
        "population: must be an integer, got 'thirty'",
        'thresholds[1]: must lie in (0, 1), got 1.5',
    ):
        assert expected in message


def test_config_file_defaults_and_relative_paths(tmp_path, image_dir, tiny_clip_dir):
    path = tmp_path / 'campaign.yaml'
    path.write_text(f'frames: [images]\nmodels:\n  - backend: clip\n    model: {tiny_clip_dir}\n')
    config = load_config(path)
    assert config.frames.sources == (str(image_dir.resolve()),)
    # docs/method.md §7 defaults, and the paper's 10 runs.
    assert (config.runs, config.population, config.evaluations, config.algorithms) == (
        10,
        30,
        3000,
        ('nsga2', 'random'),
    )
    assert config.models[0].name == f'clip:{Path(tiny_clip_dir).name}'
    path.write_text('frames: [images]\nmodels: [{backend: clip, model: ./absent}]\n')
    with pytest.raises(ParameterError, match=r'models\[0\]\.model: no such model directory'):
        load_config(path)
    path.write_text('frames: [images\n')
    with pytest.raises(ParameterError, match='not valid YAML'):
        load_config(path)


def test_cells_and_seeds(image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    images = load_images(config.frames)
    assert [im.id for im in images] == ['img0', 'img1']
    cells = plan_cells(config, images)
    assert len(cells) == 1 * 2 * 2 * 2  # models x runs x images x algorithms
    assert len({c.id for c in cells}) == len(cells)
    # One seed per (model, run): both algorithms and all images of a run share it.
    expected = int(np.random.SeedSequence(5, spawn_key=(0, 1)).generate_state(1, dtype=np.uint32)[0])
    assert cell_seed(5, 0, 1) == expected
    assert {c.seed for c in cells if c.run == 1} == {expected}
    assert cell_seed(5, 0, 0) != expected and cell_seed(5, 1, 1) != expected


def test_commit_is_atomic_and_skips_committed(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    cell = plan_cells(config, load_images(config.frames))[0]
    (tmp_path / 'cells').mkdir()
    # A leftover of a killed writer is not a finished cell.
    (tmp_path / 'cells' / f'.tmp-{cell.id}-1').mkdir()
    assert finished_cells(tmp_path) == set()
    outcome = CellOutcome(
        cell=cell, files={'evaluations.jsonl': b'{"index": 0}\n'}, timing={'search_seconds': 1}
    )
    final = commit_cell(tmp_path, outcome, 'abc')
    assert finished_cells(tmp_path) == {cell.id}
    info = json.loads((final / 'cell.json').read_text())
    assert (info['id'], info['fingerprint'], info['search_seconds']) == (cell.id, 'abc', 1)
    assert commit_cell(tmp_path, outcome, 'abc') is None  # already committed: untouched


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


def _listening_ports(pids):
    """Local addresses of LISTEN TCP sockets owned by the given processes."""
    import psutil

    addresses = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind='inet')
        except psutil.NoSuchProcess:
            continue
        addresses += [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN]
    return addresses


def test_campaign_dask_local_cluster_loopback_only(tmp_path, image_dir, tiny_clip_dir, monkeypatch):
    pytest.importorskip('distributed')
    import psutil

    import metavlm_ros.campaign.runner as campaign

    seen = []
    real_run_dask = campaign.run_dask

    def spy(*args, **kwargs):
        # Check the sockets while the cluster is up: after the first cell comes back.
        for i, outcome in enumerate(real_run_dask(*args, **kwargs)):
            if i == 0:
                me = psutil.Process()
                seen.extend(_listening_ports([me.pid] + [p.pid for p in me.children(recursive=True)]))
            yield outcome

    monkeypatch.setattr(campaign, 'run_dask', spy)
    config = small_config(image_dir, tiny_clip_dir, runs=2)
    # Two 1-thread Dask workers against one in-process worker on all the cores, as users run them:
    # no thread count given, so each cell takes the configuration's.
    (tmp_path / 'dask').mkdir()
    result = run_campaign(config, tmp_path / 'dask' / 'results', executor='dask', workers=2, progress=False)
    assert (result.total, result.completed) == (8, 8)
    assert seen, 'the local cluster listens somewhere'
    assert all(ip in ('127.0.0.1', '::1') for ip in seen), seen
    (tmp_path / 'local').mkdir()
    run_campaign(config, tmp_path / 'local' / 'results', progress=False)

    reports = []
    for executor in ('dask', 'local'):
        monkeypatch.chdir(tmp_path / executor)  # the report names its results directory: the same name
        cells = [json.loads(p.read_text()) for p in Path('results/cells').glob('*/cell.json')]
        assert {c['torch_threads'] for c in cells} == {config.threads} == {1}
        (path,) = write_report(build_report('results'), 'report', plots=False)
        reports.append(path.read_bytes())
    assert b'- Torch threads per cell: 1' in reports[0]
    assert reports[0] == reports[1]


def test_executor_options_checked(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    with pytest.raises(ParameterError, match='unknown executor "ray"'):
        run_campaign(config, tmp_path / 'o', executor='ray')
    with pytest.raises(ParameterError, match='--workers must be an integer >= 1'):
        run_campaign(config, tmp_path / 'o', workers=0)
    with pytest.raises(ParameterError, match='--scheduler needs --executor dask'):
        run_campaign(config, tmp_path / 'o', scheduler='tcp://127.0.0.1:1')
    assert not os.path.exists(tmp_path / 'o')


def test_generated_scene_frames(tiny_clip_dir):
    spec = {'generate': {'count': 2, 'size': [64, 48], 'seed': 3}}
    config = parse_config({'frames': spec, 'models': [{'backend': 'clip', 'model': str(tiny_clip_dir)}]})
    images = load_images(config.frames)
    assert [im.id for im in images] == ['scene-003', 'scene-004']
    assert all(im.rgb.shape == (48, 64, 3) and im.rgb.dtype == np.uint8 for im in images)
    assert images[0].sha256 != images[1].sha256
    assert [im.sha256 for im in load_images(config.frames)] == [im.sha256 for im in images]  # deterministic
    with pytest.raises(ParameterError, match=r'frames.generate.size: must be \[width, height\]'):
        parse_config(
            {'frames': {'generate': {'size': [4, 4]}}, 'models': [{'backend': 'clip', 'model': '.'}]}
        )


def test_existing_dask_cluster_and_gpu_resource(tmp_path, image_dir, tiny_clip_dir):
    distributed = pytest.importorskip('distributed')
    from metavlm_ros.campaign.config import ModelSpec
    from metavlm_ros.campaign.executors import _offers_gpu, task_resources

    assert task_resources(ModelSpec('m', 'clip', 'x', {'device': 'cuda:1'}), gpu_offered=True) == {'GPU': 1}
    assert task_resources(ModelSpec('m', 'clip', 'x', {'device': 'cpu'}), gpu_offered=True) is None
    assert task_resources(ModelSpec('m', 'clip', 'x', {'device': 'cuda'}), gpu_offered=False) is None
    assert _offers_gpu({'workers': {'a': {'resources': {}}, 'b': {'resources': {'GPU': 1}}}})
    assert not _offers_gpu({'workers': {'a': {'resources': {'GPU': 0}}}})

    # A cluster that is already running (here: threads in this process, on loopback, no dashboard).
    with distributed.LocalCluster(
        n_workers=1,
        processes=False,
        protocol='tcp://',
        host='127.0.0.1',
        dashboard_address=None,
        threads_per_worker=1,
    ) as cluster:
        config = small_config(image_dir, tiny_clip_dir, runs=1, algorithms=['random'])
        result = run_campaign(config, tmp_path / 'out', executor='dask', scheduler=cluster.scheduler_address,
                              progress=False)  # fmt: skip
        assert (result.total, result.completed) == (2, 2)
        assert len(finished_cells(tmp_path / 'out')) == 2
        # A cuda model on a cluster whose workers offer no GPU: refused instead of waiting forever.
        cuda = parse_config(
            {
                'frames': [str(image_dir)],
                'models': [{'backend': 'clip', 'model': str(tiny_clip_dir), 'device': 'cuda'}],
                'runs': 1,
                'population': 6,
                'evaluations': 6,
            }
        )
        with pytest.raises(ParameterError, match='offers the GPU resource'):
            run_campaign(
                cuda, tmp_path / 'gpu', executor='dask', scheduler=cluster.scheduler_address, progress=False
            )


def test_relations_narrow_every_cell(tmp_path, image_dir, tiny_clip_dir):
    relations = {'enabled': ['shear'], 'ranges': {'shear': [0.0, 0.1]}}
    config = small_config(
        image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=12, relations=relations
    )
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    records = [
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl') for r in read_jsonl(path)
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
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl') for r in read_jsonl(path)
    ]
    assert len(records) == 3 * 2 * 2 * 12  # algorithms x runs x images x budget
    assert {r['composition'] for r in records} <= {'{}', '{8}', '{9}', '{8,9}'}
    assert all(len(r['genotype']) == 4 for r in records)
    summaries = [json.loads(p.read_text()) for p in (tmp_path / 'out' / 'cells').glob('*/summary.jsonl')]
    assert {tuple(s['relations']) for s in summaries} == {('turbidity', 'marine_snow')}
    report = build_report(tmp_path / 'out')
    keys = {t.key for t in report.tables}
    assert {'rq1', 'rq1-nsga3-vs-random', 'rq1-totals', 'rq1-totals-nsga3-vs-random'} <= keys
    assert report.table('rq2_1-tiny_clip').column('order') == [1, 2]
    rq3 = report.table('rq3-tiny_clip-0_01')
    assert 'p MetaVLM vs Rand' in rq3.columns and 'p NSGA-III vs Rand' in rq3.columns
    assert report.table('rq1-nsga3-vs-random').column('runs NSGA-III') == [2, 2]


def test_any_registered_algorithm_and_a_baseline_may_be_configured(image_dir, tiny_clip_dir):
    config = small_config(
        image_dir, tiny_clip_dir, algorithms=['smsemoa', 'moead', 'nsga2'], baseline='nsga2'
    )
    assert config.algorithms == ('smsemoa', 'moead', 'nsga2') and config.baseline == 'nsga2'
    # The baseline only changes the report: the campaign's identity is the same without it.
    plain = small_config(image_dir, tiny_clip_dir, algorithms=['smsemoa', 'moead', 'nsga2'])
    assert config.fingerprint() == plain.fingerprint() and 'baseline' not in plain.to_dict()
    assert config.to_dict()['baseline'] == 'nsga2'
    with pytest.raises(
        ParameterError, match=r'baseline: must be one of the algorithms \(nsga2, random\) or all'
    ):
        small_config(image_dir, tiny_clip_dir, baseline='moead')
    with pytest.raises(
        ParameterError, match='unknown algorithm "hill" .*nsga2, random, nsga3, smsemoa, moead'
    ):
        small_config(image_dir, tiny_clip_dir, algorithms=['hill'])
    with pytest.raises(ParameterError, match="relations: unknown relation 'fog'"):
        small_config(image_dir, tiny_clip_dir, relations={'enabled': ['paper', 'fog']})


def test_campaigns_warp_sequentially_by_default_and_say_so(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=6)
    assert (config.warp, config.search_config('random', 0).warp) == ('sequential', 'sequential')
    fused = small_config(image_dir, tiny_clip_dir, warp='fused')
    assert fused.search_config('nsga2', 0).warp == 'fused'
    assert fused.fingerprint() != config.fingerprint()  # the warps change the follow-up frames
    with pytest.raises(ParameterError, match="warp: must be one of fused, sequential, got 'bilinear'"):
        small_config(image_dir, tiny_clip_dir, warp='bilinear')
    with pytest.raises(ParameterError, match='threads: must be >= 1, got 0'):
        small_config(image_dir, tiny_clip_dir, threads=0)
    run_campaign(config, tmp_path / 'out', progress=False)
    summaries = [json.loads(p.read_text()) for p in (tmp_path / 'out' / 'cells').glob('*/summary.jsonl')]
    assert len(summaries) == 2 and {s['warp'] for s in summaries} == {'sequential'}
    (path,) = write_report(build_report(tmp_path / 'out'), tmp_path / 'report', plots=False)
    assert '- Warps: sequential (resampled after every relation, as the paper' in path.read_text()


def test_models_take_the_paper_prompt_preset(image_dir, tiny_clip_dir):
    config = small_config(
        image_dir,
        tiny_clip_dir,
        models=[{'backend': 'clip', 'model': str(tiny_clip_dir), 'prompts': 'paper'}],
    )
    assert config.models[0].options['prompts'] == 'paper'
    assert small_config(image_dir, tiny_clip_dir).models[0].options['prompts'] == 'default'
    from metavlm_ros.campaign.executors import _backend_for
    from metavlm_ros.models.vlm import PAPER_CLASS_PROMPTS

    assert _backend_for(config.models[0].key()).class_prompts == PAPER_CLASS_PROMPTS
    with pytest.raises(ParameterError, match=r"models\[0\]: prompts: 'x' is not one of default, paper"):
        small_config(
            image_dir,
            tiny_clip_dir,
            models=[{'backend': 'clip', 'model': str(tiny_clip_dir), 'prompts': 'x'}],
        )


@pytest.mark.parametrize('name', ['demo-campaign.yaml', 'demo-rq1.yaml', 'underwater-campaign.yaml'])
def test_the_example_campaigns_are_valid(name):
    config = load_config(Path(__file__).resolve().parents[2] / 'examples' / name)
    if name == 'demo-rq1.yaml':
        # RQ1 needs runs enough to show an A12 of 0.7-0.9 (docs/demo.md), at the demo's budget.
        assert (config.runs, config.population, config.evaluations) == (20, 30, 300)
    if name.startswith('underwater'):
        assert config.relations == {'enabled': ['turbidity', 'marine_snow']}
        assert config.algorithms == ('nsga2', 'smsemoa', 'random') and config.baseline == 'random'


def test_the_blur_angle_range_narrows_every_cell_and_is_part_of_the_campaign_identity(
    tmp_path, image_dir, tiny_clip_dir
):
    def config(**ranges):
        relations = {'enabled': ['motion_blur'], **({'ranges': ranges} if ranges else {})}
        return small_config(
            image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=6, relations=relations
        )

    heave, roaming = config(motion_blur_angle=[90, 90]), config()
    assert heave.identity()['extras'] == {'motion_blur_angle': [90.0, 90.0]}
    assert roaming.identity()['extras'] == {'motion_blur_angle': [-90.0, 90.0]}
    assert heave.fingerprint() != roaming.fingerprint()
    # A campaign without motion blur keeps the identity it had.
    plain = small_config(image_dir, tiny_clip_dir, relations={'enabled': ['paper', 'turbidity']})
    assert 'extras' not in plain.identity()
    run_campaign(heave, tmp_path / 'out', progress=False, threads=1)
    records = [
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl') for r in read_jsonl(path)
    ]
    assert len(records) == 2 * 6 and all(r['parameters']['motion_blur_angle'] == 90.0 for r in records)
    with pytest.raises(
        ParameterError, match=r'MR10 motion_blur angle -100.0 is outside the allowed range'
    ) as bad:
        config(motion_blur_angle=[-100, 0])
    assert '\n' not in str(bad.value)
