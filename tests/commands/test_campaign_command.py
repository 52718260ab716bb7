"""Tests of `metavlm campaign` and `metavlm report`: end to end, killed with SIGKILL and resumed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest

from metavlm_ros.cli import main
from tests.conftest import make_frame

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def campaign_yaml(tmp_path, tiny_clip_dir):
    folder = tmp_path / 'images'
    folder.mkdir()
    for i in range(2):
        cv2.imwrite(
            str(folder / f'img{i}.png'), cv2.cvtColor(make_frame(48, 36, seed=10 + i), cv2.COLOR_RGB2BGR)
        )
    path = tmp_path / 'campaign.yaml'
    path.write_text(
        'frames:\n  sources: [images]\n'
        f'models:\n  - {{backend: clip, model: "{tiny_clip_dir}", device: cpu}}\n'
        'algorithms: [nsga2, random]\nruns: 2\npopulation: 6\nevaluations: 24\nseed: 11\n'
    )
    return path


def _cells(out: Path) -> list[str]:
    cells = out / 'cells'
    return sorted(p.name for p in cells.iterdir() if not p.name.startswith('.')) if cells.is_dir() else []


def _tables(capsys, out: Path) -> str:
    capsys.readouterr()
    assert main(['report', str(out), '--no-plots']) == 0
    text = capsys.readouterr().out
    return text[text.index('- Images:') :]  # everything but the results path and its fingerprint line


@pytest.mark.parametrize(
    'executor',
    [
        pytest.param(['--workers', '1'], id='in-process'),
        pytest.param(['--workers', '2'], id='pool', marks=pytest.mark.slow),
        pytest.param(['--executor', 'dask', '--workers', '2'], id='dask', marks=pytest.mark.slow),
    ],
)
def test_kill_then_resume_gives_the_same_report(tmp_path, campaign_yaml, capsys, executor):
    try:
        import psutil  # comes with the Dask extra; without it the orphan check is left out
    except ImportError:
        psutil = None
    killed = tmp_path / 'killed'
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    options = ['--no-progress', '--threads', '1']
    command = [sys.executable, '-m', 'metavlm_ros.cli', 'campaign', str(campaign_yaml), '--out', str(killed),
               *options, *executor]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not _cells(killed) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, process.stderr.read().decode()
    workers = psutil.Process(process.pid).children(recursive=True) if psutil else []
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    done = _cells(killed)
    assert 1 <= len(done) < 8, done
    # Nothing of the killed campaign keeps running: its worker processes leave with it.
    if psutil:
        _, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, alive

    # Resume: only the missing cells run; the finished ones are left as they were.
    before = {name: (killed / 'cells' / name / 'cell.json').stat().st_mtime_ns for name in done}
    assert main(['campaign', str(campaign_yaml), '--out', str(killed), *options]) == 0
    summary = capsys.readouterr().out
    assert f'{8 - len(done)} cells run, {len(done)} already finished, 8 in all' in summary
    assert len(_cells(killed)) == 8
    assert {n: (killed / 'cells' / n / 'cell.json').stat().st_mtime_ns for n in done} == before
    assert not list((killed / 'cells').glob('.tmp-*'))

    fresh = tmp_path / 'fresh'
    assert main(['campaign', str(campaign_yaml), '--out', str(fresh), *options]) == 0
    assert _tables(capsys, killed) == _tables(capsys, fresh)


def test_bad_config_exits_2_before_any_work(tmp_path, capsys):
    config = tmp_path / 'bad.yaml'
    config.write_text('frames: [nowhere]\nmodels: [{backend: x, model: m}]\nruns: -1\n')
    out = tmp_path / 'out'
    assert main(['campaign', str(config), '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error: ') and '\n' not in err
    assert 'frames.sources[0]: no such file or directory' in err
    assert 'models[0].backend: unknown backend "x"' in err
    assert 'runs: must be >= 1, got -1' in err
    assert not out.exists()


def test_report_formats_and_refusal(tmp_path, campaign_yaml, capsys):
    out = tmp_path / 'out'
    config = campaign_yaml.read_text().replace('runs: 2', 'runs: 1')
    campaign_yaml.write_text(config)
    assert main(['campaign', str(campaign_yaml), '--out', str(out), '--no-progress', '--threads', '1']) == 0
    assert main(['report', str(out), '--format', 'csv']) == 0
    assert (out / 'report' / 'rq1.csv').read_text().startswith('model,image,runs MetaVLM,runs Rand,')
    assert main(['report', str(out), '--format', 'html', '--out', str(tmp_path / 'html')]) == 0
    assert (tmp_path / 'html' / 'index.html').is_file()
    assert len(list((tmp_path / 'html' / 'plots').glob('*.png'))) == 4  # 2 fronts, VR, HV
    capsys.readouterr()
    # The same directory with another config is refused, and nothing in it changes.
    campaign_yaml.write_text(config.replace('seed: 11', 'seed: 12'))
    assert main(['campaign', str(campaign_yaml), '--out', str(out), '--no-progress']) == 2
    assert 'different campaign config' in capsys.readouterr().err
    assert main(['report', str(tmp_path / 'nothing')]) == 2


def test_report_rq3_samples_option(tmp_path, capsys):
    fixture = ROOT / 'tests' / 'fixtures' / 'campaign_results'
    assert main(['report', str(fixture), '--no-plots', '--out', str(tmp_path / 'run')]) == 0
    per_run = capsys.readouterr().out
    assert 'RQ3 samples: one value per (image, run)' in per_run and '(pooled pairs)' not in per_run
    assert main(['report', str(fixture), '--no-plots', '--rq3', 'pooled', '--out', str(tmp_path / 'p')]) == 0
    pooled = capsys.readouterr().out
    assert '## RQ3 (Table 7): violation strength by order, clip:tiny, Th=1% (pooled pairs)' in pooled
    assert not (fixture / 'report').exists()
