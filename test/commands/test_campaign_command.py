"""Tests of `metavlm campaign` and `metavlm report`: end to end, killed with SIGKILL and resumed."""

import csv
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest

from metavlm_ros.cli import main
from metavlm_ros.explain.modes import catalogue_of
from metavlm_ros.explain.sections import TOP_MODES
from test.conftest import make_frame

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
        pytest.param(['--workers', '2'], id='pool'),
        pytest.param(['--executor', 'dask', '--workers', '2'], id='dask'),
    ],
)
def test_kill_then_resume_gives_the_same_report(tmp_path, campaign_yaml, capsys, executor):
    try:
        import psutil  # comes with the Dask extra; without it the orphan check is left out
    except ImportError:
        psutil = None
    killed = tmp_path / 'killed'
    # A killed Dask cluster leaves its workers' scratch folders behind: in the test's folder, not /tmp.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
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
    # The model's failure modes, learnt from every evaluation of its cells: the top modes `metavlm modes`
    # finds there, in the page and in their CSV.
    html = (tmp_path / 'html' / 'index.html').read_text()
    expected = catalogue_of(sorted((out / 'cells').iterdir()))
    assert len(expected.modes) > TOP_MODES  # the tiny CLIP breaks in many ways
    assert '<h2 id="modes">Failure modes</h2>' in html and html.count('<td>' + expected.modes[0].rule) == 1
    (path,) = (out / 'report').glob('modes_*.csv')
    rows = list(csv.DictReader(path.open()))
    assert [row['rule'] for row in rows] == [m.rule for m in expected.modes[:TOP_MODES]]
    assert [int(row['violations']) for row in rows] == [
        m.violations_inside for m in expected.modes[:TOP_MODES]
    ]
    plots = sorted(p.name for p in (tmp_path / 'html' / 'plots').glob('*.png'))
    assert len(plots) == 6  # 2 fronts, VR, HV, and the anytime hypervolume of each of the 2 images
    assert sum(name.startswith('anytime-') for name in plots) == 2
    capsys.readouterr()
    # The same directory with another config is refused, and nothing in it changes.
    campaign_yaml.write_text(config.replace('seed: 11', 'seed: 12'))
    assert main(['campaign', str(campaign_yaml), '--out', str(out), '--no-progress']) == 2
    assert 'different campaign config' in capsys.readouterr().err
    assert main(['report', str(tmp_path / 'nothing')]) == 2


def test_report_rq3_samples_option(tmp_path, capsys):
    fixture = ROOT / 'test' / 'fixtures' / 'campaign_results'
    assert main(['report', str(fixture), '--no-plots', '--out', str(tmp_path / 'run')]) == 0
    per_run = capsys.readouterr().out
    assert 'RQ3 samples: one value per (image, run)' in per_run and '(pooled pairs)' not in per_run
    assert main(['report', str(fixture), '--no-plots', '--rq3', 'pooled', '--out', str(tmp_path / 'p')]) == 0
    pooled = capsys.readouterr().out
    assert '## RQ3 (Table 7): violation strength by order, clip:tiny, Th=1% (pooled pairs)' in pooled
    assert not (fixture / 'report').exists()


def test_report_baseline_option(tmp_path, capsys):
    fixture = ROOT / 'test' / 'fixtures' / 'campaign_results'
    out = tmp_path / 'by-metavlm'
    assert main(['report', str(fixture), '--no-plots', '--baseline', 'nsga2', '--out', str(out)]) == 0
    text = capsys.readouterr().out
    assert '## RQ1 (Table 4): hypervolume of Rand vs MetaVLM across runs' in text
    assert 'Comparisons (RQ1, RQ3): Rand vs MetaVLM; A12 is the first of each pair over the second.' in text
    assert main(['report', str(fixture), '--baseline', 'moead', '--out', str(tmp_path / 'no')]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith('metavlm: error: baseline "moead" is not one of the campaign') and err.count('\n') == 1
    )


# ---------------------------------------------------------------------------------------------------
# Cells as evidence: checksums the report verifies, damaged cells named and run again


OPTIONS = ['--no-progress', '--threads', '1']


def _damage(cell: Path, how: str) -> None:
    evaluations = cell / 'evaluations.jsonl.gz'
    if how == 'truncated':
        data = evaluations.read_bytes()
        evaluations.write_bytes(data[: len(data) // 2])
    elif how == 'garbled':
        data = bytearray((cell / 'summary.jsonl.gz').read_bytes())
        data[len(data) // 2] ^= 0x20
        (cell / 'summary.jsonl.gz').write_bytes(bytes(data))
    elif how == 'removed':
        (cell / 'pareto.jsonl.gz').unlink()
    elif how == 'added':
        (cell / 'extra.jsonl').write_text('{}\n')
    elif how == 'record-edited':  # still valid JSON, another value
        info = json.loads((cell / 'cell.json').read_text())
        info['hypervolume'] = 0.99
        (cell / 'cell.json').write_text(json.dumps(info))
    elif how == 'record-cut':
        data = (cell / 'cell.json').read_bytes()
        (cell / 'cell.json').write_bytes(data[:40])


@pytest.mark.parametrize('how', ['truncated', 'garbled', 'removed', 'added', 'record-edited', 'record-cut'])
def test_a_damaged_cell_is_named_left_out_and_run_again(tmp_path, campaign_yaml, capsys, how):
    out = tmp_path / 'out'
    campaign_yaml.write_text(campaign_yaml.read_text().replace('runs: 2', 'runs: 1'))
    assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 0
    reference = _tables(capsys, out)
    assert 'Cells: 4 of 4 finished.' in reference
    victim = _cells(out)[1]
    _damage(out / 'cells' / victim, how)
    capsys.readouterr()
    assert main(['report', str(out), '--no-plots']) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith('metavlm: error: 1 damaged cell(s) left out of the report') and victim in err
    assert 'Cells: 3 of 4 finished.' in captured.out
    assert 'Damaged cells left out of every table (they do not match their checksums' in captured.out
    assert victim in captured.out
    # Running the campaign again sets the damaged cell aside (kept, never deleted) and redoes it.
    assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 0
    assert '1 cells run, 3 already finished' in capsys.readouterr().out
    assert [
        p.name.startswith(f'.damaged-{victim}-') for p in (out / 'cells').iterdir() if p.name[0] == '.'
    ] == [True]
    assert _tables(capsys, out) == reference


def test_a_campaign_record_that_is_not_a_mapping_gets_one_line(tmp_path, campaign_yaml, capsys):
    out = tmp_path / 'out'
    out.mkdir()
    for content in ('[1, 2, 3]', '"text"', '\x00\x01'):
        (out / 'campaign.json').write_text(content)
        for argv in (['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS], ['report', str(out)]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert (
                err.startswith('metavlm: error:') and 'unreadable campaign record' in err and '\n' not in err
            )
    assert sorted(p.name for p in out.iterdir()) == ['campaign.json']


def test_damaged_weights_are_refused_before_the_results_directory_is_made(
    tmp_path, campaign_yaml, tiny_clip_dir, capsys
):
    data = (tiny_clip_dir / 'model.safetensors').read_bytes()
    for name, weights in (('cut', data[:300]), ('half', data[: len(data) // 2]), ('noise', os.urandom(4096))):
        model = tmp_path / f'model-{name}'
        shutil.copytree(tiny_clip_dir, model)
        (model / 'model.safetensors').write_bytes(weights)
        campaign_yaml.write_text(campaign_yaml.read_text().replace(str(tiny_clip_dir), str(model)))
        out = tmp_path / f'out-{name}'
        assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and 'damaged weights' in err and '\n' not in err
        assert not out.exists()
        campaign_yaml.write_text(campaign_yaml.read_text().replace(str(model), str(tiny_clip_dir)))


def test_a_full_disk_stops_the_campaign_in_one_line_and_it_resumes(tmp_path, campaign_yaml, capsys):
    out = tmp_path / 'out'
    fresh = tmp_path / 'fresh'
    assert main(['campaign', str(campaign_yaml), '--out', str(fresh), *OPTIONS]) == 0
    size = max(p.stat().st_size for p in (fresh / 'cells').rglob('evaluations.jsonl.gz'))
    capsys.readouterr()
    # Writes past this size fail with EFBIG, as they fail with ENOSPC on a full disk.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
    try:
        code = main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith('metavlm: error:') and 'File too large' in err
    assert not list((out / 'cells').glob('.tmp-*'))
    assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 0
    assert _tables(capsys, out) == _tables(capsys, fresh)


def test_a_report_whose_output_is_a_file_gets_one_line(tmp_path, campaign_yaml, capsys):
    out = tmp_path / 'out'
    campaign_yaml.write_text(campaign_yaml.read_text().replace('runs: 2', 'runs: 1'))
    assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 0
    (tmp_path / 'afile').write_text('x')
    capsys.readouterr()
    for target in ('afile', 'afile/sub'):
        assert main(['report', str(out), '--out', str(tmp_path / target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and 'is a file, not a directory' in err and '\n' not in err
    assert (tmp_path / 'afile').read_text() == 'x'


def test_stale_scratch_folders_of_killed_cells_are_removed_and_nothing_else(tmp_path, monkeypatch):
    import socket
    import tempfile

    from metavlm_ros.campaign import executors
    from metavlm_ros.campaign.cells import safe_name

    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    host = safe_name(socket.gethostname())
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    stale = tmp_path / f'.metavlm-cell-{host}.partial-{dead.pid}-0123abcd'
    alive = tmp_path / f'.metavlm-cell-{host}.partial-{os.getpid()}-4567cdef'
    elsewhere = tmp_path / f'.metavlm-cell-otherhost.partial-{dead.pid}-89ab0123'
    older = tmp_path / 'metavlm-cell-k2j3h4'  # a name without a pid: cannot tell, kept
    other = tmp_path / f'.something.partial-{dead.pid}-0123abcd'
    for path in (stale, alive, elsewhere, older, other):
        path.mkdir()
        (path / 'evaluations.jsonl').write_text('{}\n')
    executors._remove_stale_scratch.cache_clear()
    assert executors._remove_stale_scratch() == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (alive, elsewhere, older, other)
    )


def test_a_killed_campaign_leaves_no_scratch_after_the_next_run(tmp_path, campaign_yaml, monkeypatch):
    import tempfile

    from metavlm_ros.campaign import executors

    scratch_root = tmp_path / 'tmp'
    scratch_root.mkdir()
    out = tmp_path / 'out'
    # Longer cells: the kill lands while one runs in its scratch folder.
    campaign_yaml.write_text(campaign_yaml.read_text().replace('evaluations: 24', 'evaluations: 120'))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(scratch_root))
    command = [
        sys.executable,
        '-m',
        'metavlm_ros.cli',
        'campaign',
        str(campaign_yaml),
        '--out',
        str(out),
        *OPTIONS,
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while (
        not list(scratch_root.glob('.metavlm-cell-*'))
        and process.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.005)
    assert process.poll() is None
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert list(scratch_root.glob('.metavlm-cell-*'))
    monkeypatch.setattr(tempfile, 'tempdir', str(scratch_root))
    executors._remove_stale_scratch.cache_clear()
    assert main(['campaign', str(campaign_yaml), '--out', str(out), *OPTIONS]) == 0
    assert not list(scratch_root.glob('.metavlm-cell-*'))
