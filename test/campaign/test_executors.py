"""Executors (campaign/executors.py): atomic commits, Dask on loopback only, existing clusters and GPUs."""

import json
from pathlib import Path

import pytest

from metavlm_ros.campaign.cells import finished_cells, load_images, plan_cells
from metavlm_ros.campaign.config import parse_config
from metavlm_ros.campaign.executors import CellOutcome, commit_cell
from metavlm_ros.campaign.report import build_report, write_report
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.common.errors import ParameterError
from test.campaign.configs import small_config


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
