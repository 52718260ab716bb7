"""`metavlm search` end to end with a tiny CLIP, and its answers to bad input."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import torch

from metavlm_ros.cli import main
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.results import read_jsonl, records_file
from test.conftest import can_mount_tmpfs, make_frame

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def image_path(tmp_path):
    path = tmp_path / 'frame.png'
    cv2.imwrite(str(path), make_frame(96, 64)[..., ::-1])
    return path


def search(args, tiny_clip_dir):
    # The options given last win: tests may pass another --model or --backend.
    return main(['search', '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet', *args])


def test_search_writes_results_and_prints_a_summary(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    code = search(
        [str(image_path), '--population', '6', '--evaluations', '18', '--out', str(out)], tiny_clip_dir
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert 'hypervolume' in printed and 'violations by order' in printed and str(out) in printed
    assert len(read_jsonl(out / 'evaluations.jsonl')) == 18
    assert len(read_jsonl(out / 'summary.jsonl')) == 1


def test_search_works_at_twice_the_model_input_by_default(tmp_path, tiny_clip_dir, capsys):
    # The tiny CLIP sees 32x32: by default a 160x120 frame is searched at 64x48.
    path = tmp_path / 'big.png'
    cv2.imwrite(str(path), make_frame(160, 120)[..., ::-1])
    common = [str(path), '--population', '4', '--evaluations', '4']
    assert search([*common, '--out', str(tmp_path / 'auto')], tiny_clip_dir) == 0
    (summary,) = read_jsonl(tmp_path / 'auto' / 'summary.jsonl')
    assert summary['working_size'] == 64 and summary['source_size'] == [160, 120]
    assert 'relations at working size 64 px (frame 160x120' in capsys.readouterr().out
    assert search([*common, '--out', str(tmp_path / 'full'), '--working-size', 'full'], tiny_clip_dir) == 0
    (summary,) = read_jsonl(tmp_path / 'full' / 'summary.jsonl')
    assert summary['working_size'] == 160


def test_existing_results_are_kept_unless_resume_or_overwrite(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    args = [str(image_path), '--population', '6', '--evaluations', '12', '--out', str(out)]
    assert search(args, tiny_clip_dir) == 0
    before = records_file(out / 'evaluations.jsonl').read_bytes()
    assert search(args, tiny_clip_dir) == 2
    assert 'already holds results' in capsys.readouterr().err
    assert records_file(out / 'evaluations.jsonl').read_bytes() == before
    assert search([*args, '--resume'], tiny_clip_dir) == 0
    assert 'already searched' in capsys.readouterr().out
    assert records_file(out / 'evaluations.jsonl').read_bytes() == before


@pytest.mark.parametrize(
    ('extra', 'needle'),
    [
        (['--evaluations', '0'], 'evaluations'),
        (['--population', '-3'], 'population'),
        (['--range', 'rotation=-9:9'], 'rotation'),
        (['--range', 'motion_blur_angle=-95:0'], 'MR10 motion_blur angle -95.0 is outside'),
        (['--range', 'motion_blur_angle=up:down'], 'motion_blur_angle=up:down'),
        (['--relations', 'water', '--range', 'water_type=XI:5C'], "unknown Jerlov water type 'XI'"),
        (['--relations', 'blur'], 'blur'),
        (['--algorithm', 'annealing'], 'algorithm'),
        (['--working-size', 'half'], 'working size'),
    ],
)
def test_bad_parameters_give_one_line_and_exit_2(tmp_path, image_path, tiny_clip_dir, capsys, extra, needle):
    code = search([str(image_path), '--out', str(tmp_path / 'r'), *extra], tiny_clip_dir)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith('metavlm: error:') and needle in err and '\n' not in err
    assert not records_file(tmp_path / 'r' / 'evaluations.jsonl').exists()


def test_bad_frames_and_models_give_one_line(tmp_path, image_path, tiny_clip_dir, capsys):
    text = tmp_path / 'notes.png'
    text.write_text('not an image')
    empty = tmp_path / 'empty.png'
    empty.write_bytes(b'')
    for path in (text, empty, tmp_path / 'missing.png'):
        assert search([str(path), '--out', str(tmp_path / 'r')], tiny_clip_dir) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and str(path.name) in err and '\n' not in err
    assert main(['search', str(image_path), '--backend', 'llava', '--out', str(tmp_path / 'r')]) == 2
    assert 'llava' in capsys.readouterr().err
    assert (
        main(['search', str(image_path), '--model', str(tmp_path / 'nomodel'), '--out', str(tmp_path / 'r')])
        == 2
    )
    assert 'nomodel' in capsys.readouterr().err


def test_class_prompts_map_onto_the_classes(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    prompts = ['a fish', 'a plant', 'a pipe', 'a bottle']
    args = [
        str(image_path),
        '--population',
        '4',
        '--evaluations',
        '4',
        '--out',
        str(out),
        '--class-prompts',
        *prompts,
    ]
    assert search(args, tiny_clip_dir) == 0
    assert search([*args[:-1], '--overwrite'], tiny_clip_dir) == 2
    assert '3 prompts for 4 classes' in capsys.readouterr().err


def test_blip_search_with_a_custom_vocabulary(tmp_path, image_path, tiny_blip_dir):
    out = tmp_path / 'res'
    code = main(
        [
            'search',
            str(image_path),
            '--backend',
            'blip',
            '--model',
            str(tiny_blip_dir),
            '--quiet',
            '--population',
            '4',
            '--evaluations',
            '4',
            '--max-new-tokens',
            '8',
            '--out',
            str(out),
            '--vocabulary',
            'trash=bottle,can',
        ]
    )
    assert code == 0
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert summary['kind'] == 'count' and set(summary['source']) == {
        'animal',
        'vegetation',
        'object',
        'trash',
    }


# ---------------------------------------------------------------------------------------------------
# Results as evidence: validated before they are touched, never mixed, lost or duplicated


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob('*')) if p.is_file()
    }


def _records(directory: Path) -> dict[str, list[dict]]:
    return {
        name: [{k: v for k, v in r.items() if k != 'seconds'} for r in read_jsonl(directory / name)]
        for name in ('evaluations.jsonl', 'pareto.jsonl', 'summary.jsonl')
    }


SMALL = ['--population', '6', '--evaluations', '12']


@pytest.fixture
def damaged_weights(tmp_path, tiny_clip_dir):
    """Model directories whose weights are truncated, cut in the middle, or random bytes."""
    made = []
    data = (tiny_clip_dir / 'model.safetensors').read_bytes()
    for name, weights in (
        ('header', data[:100]),
        ('middle', data[: len(data) // 2]),
        ('random', os.urandom(5000)),
    ):
        copy = tmp_path / f'weights-{name}'
        shutil.copytree(tiny_clip_dir, copy)
        (copy / 'model.safetensors').write_bytes(weights)
        made.append(copy)
    return made


def test_overwrite_checks_everything_before_it_replaces_anything(
    tmp_path, image_path, tiny_clip_dir, damaged_weights, capsys
):
    out = tmp_path / 'res'
    assert search([str(image_path), *SMALL, '--out', str(out)], tiny_clip_dir) == 0
    (out / 'frames' / 'earlier_run.png').write_bytes((out / 'frames').iterdir().__next__().read_bytes())
    before = _snapshot(out)
    capsys.readouterr()
    bad_runs = [
        ['search', str(image_path), '--model', str(tmp_path / 'no' / 'model')],
        *[['search', str(image_path), '--model', str(d)] for d in damaged_weights],
        ['search', str(tmp_path / 'missing.png'), '--model', str(tiny_clip_dir)],
        ['search', str(image_path), '--model', str(tiny_clip_dir), '--population', '0'],
        ['search', str(image_path), '--model', str(tiny_clip_dir), '--batch-size', '0'],
        ['search', str(image_path), '--model', str(tiny_clip_dir), '--backend', 'llava'],
    ]
    for argv in bad_runs:
        assert main([*argv, '--out', str(out), '--overwrite', '--quiet']) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and '\n' not in err
        assert _snapshot(out) == before, argv
    # A directory holding anything but results is never replaced.
    (out / 'notes.txt').write_text('mine')
    assert search([str(image_path), *SMALL, '--out', str(out), '--overwrite'], tiny_clip_dir) == 2
    assert 'not results (notes.txt)' in capsys.readouterr().err
    (out / 'notes.txt').unlink()
    # A good run replaces the whole directory: the old frames go too, nothing is left beside it.
    assert (
        search([str(image_path), *SMALL, '--seed', '4', '--out', str(out), '--overwrite'], tiny_clip_dir) == 0
    )
    assert not (out / 'frames' / 'earlier_run.png').exists()
    assert {r['seed'] for r in read_jsonl(out / 'evaluations.jsonl')} == {4}
    assert len(read_jsonl(out / 'summary.jsonl')) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith('.')) == []


@pytest.mark.parametrize(
    ('change', 'named'),
    [
        (['--population', '4'], 'settings.population'),
        (['--evaluations', '10'], 'settings.evaluations'),
        (['--seed', '1'], 'settings.seed'),
        (['--algorithm', 'random'], 'settings.algorithm'),
        (['--relations', 'rotation', 'shear'], 'settings.relations.enabled'),
        (['--range', 'rotation=-2:2'], 'settings.relations.low'),
        (['--thresholds', '0.02'], 'settings.thresholds'),
        (['--working-size', '32'], 'settings.working_size'),
        (['--backend', 'blip'], 'model.backend'),
        (['--classes', 'animal', 'trash'], 'model.options.classes'),
        (['--confidence', 'softmax'], 'model.options.confidence'),
        (['--dtype', 'float32'], 'model.options.dtype'),
    ],
)
def test_resume_continues_only_the_same_search(tmp_path, image_path, tiny_clip_dir, capsys, change, named):
    out = tmp_path / 'res'
    assert search([str(image_path), *SMALL, '--out', str(out)], tiny_clip_dir) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert search([str(image_path), *SMALL, '--out', str(out), '--resume', *change], tiny_clip_dir) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error:') and '\n' not in err
    assert 'holds another search' in err and named in err
    assert _snapshot(out) == before


def test_searches_of_another_blur_angle_range_are_another_search(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    blur = [str(image_path), *SMALL, '--out', str(out), '--relations', 'motion_blur']
    assert search([*blur, '--range', 'motion_blur_angle=90:90'], tiny_clip_dir) == 0
    angles = {r['parameters'].get('motion_blur_angle') for r in read_jsonl(out / 'evaluations.jsonl')}
    assert angles - {None} == {90.0}
    before = _snapshot(out)
    capsys.readouterr()
    assert search([*blur, '--resume'], tiny_clip_dir) == 2
    err = capsys.readouterr().err.strip()
    assert 'holds another search' in err and 'settings.relations.extras.motion_blur_angle' in err
    assert '\n' not in err and _snapshot(out) == before


def test_resume_refuses_other_weights_or_another_frame_under_the_same_names(
    tmp_path, image_path, tiny_clip_dir, capsys
):
    model = tmp_path / 'model'
    shutil.copytree(tiny_clip_dir, model)
    out = tmp_path / 'res'
    assert search([str(image_path), *SMALL, '--out', str(out), '--model', str(model)], tiny_clip_dir) == 0
    before = _snapshot(out)
    capsys.readouterr()
    # Same directory name, other weights (retrained in place).
    data = bytearray((model / 'model.safetensors').read_bytes())
    data[-1] ^= 0xFF
    (model / 'model.safetensors').write_bytes(bytes(data))
    assert (
        search([str(image_path), *SMALL, '--out', str(out), '--resume', '--model', str(model)], tiny_clip_dir)
        == 2
    )
    assert 'model.weights_sha256' in capsys.readouterr().err
    shutil.rmtree(model)
    shutil.copytree(tiny_clip_dir, model)
    # Same file name, other pixels.
    records_file(out / 'summary.jsonl').write_bytes(
        b''
    )  # the search must be run again, so its frame is compared
    before = _snapshot(out)
    cv2.imwrite(str(image_path), make_frame(96, 64, seed=5)[..., ::-1])
    assert (
        search([str(image_path), *SMALL, '--out', str(out), '--resume', '--model', str(model)], tiny_clip_dir)
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert 'frame' in err and 'pixels differ' in err and '\n' not in err
    assert _snapshot(out) == before


def test_resume_refuses_results_that_carry_no_identity(tmp_path, image_path, tiny_clip_dir, capsys):
    out = tmp_path / 'res'
    assert search([str(image_path), *SMALL, '--out', str(out)], tiny_clip_dir) == 0
    (out / 'search.json').unlink()
    capsys.readouterr()
    assert search([str(image_path), *SMALL, '--out', str(out), '--resume'], tiny_clip_dir) == 2
    assert 'no identity record' in capsys.readouterr().err


def test_resume_continues_results_whose_identity_was_recorded_before_it_had_a_source_part(
    tmp_path, image_path, tiny_clip_dir, capsys
):
    out = tmp_path / 'res'
    assert search([str(image_path), *SMALL, '--out', str(out)], tiny_clip_dir) == 0
    # search.json as `metavlm search` wrote it before the one shape (format 1): settings and model.
    record = json.loads((out / 'search.json').read_text())
    assert record['format'] == 2 and record['identity']['source']['endpoint'] == 'inprocess'
    del record['identity']['source']
    (out / 'search.json').write_text(json.dumps({**record, 'format': 1}))
    records_file(out / 'summary.jsonl').write_bytes(
        b''
    )  # run again: every record recognised, none written twice
    before = read_jsonl(out / 'evaluations.jsonl')
    assert search([str(image_path), *SMALL, '--out', str(out), '--resume'], tiny_clip_dir) == 0
    assert read_jsonl(out / 'evaluations.jsonl') == before
    capsys.readouterr()
    assert search([str(image_path), *SMALL, '--out', str(out), '--resume', '--seed', '1'], tiny_clip_dir) == 2
    assert 'settings.seed: 0 there, 1 here' in capsys.readouterr().err


def test_a_failed_search_leaves_no_new_directory(
    tmp_path, image_path, tiny_clip_dir, damaged_weights, capsys
):
    out = tmp_path / 'new' / 'res'
    failures = [
        ['--model', str(tmp_path / 'nothing')],
        *[['--model', str(d)] for d in damaged_weights],
        ['--population', '1'],
        ['--batch-size', '0'],
        ['--backend', 'llava'],
        ['--relations', 'blur'],
    ]
    for extra in failures:
        argv = [
            'search',
            str(image_path),
            '--model',
            str(tiny_clip_dir),
            '--quiet',
            '--out',
            str(out),
            *extra,
        ]
        assert main(argv) == 2, extra
        assert not (tmp_path / 'new').exists(), extra
    assert main(['search', str(tmp_path / 'none.png'), '--model', str(tiny_clip_dir), '--out', str(out)]) == 2
    assert not (tmp_path / 'new').exists()


def test_an_output_below_a_file_gets_one_line(tmp_path, image_path, tiny_clip_dir, capsys):
    (tmp_path / 'afile').write_text('x')
    for out in ('afile', 'afile/sub', 'afile/sub/deeper'):
        assert search([str(image_path), *SMALL, '--out', str(tmp_path / out)], tiny_clip_dir) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and 'is a file, not a directory' in err and '\n' not in err
    assert (tmp_path / 'afile').read_text() == 'x'


def test_a_read_only_output_is_refused_before_the_model_loads(
    tmp_path, image_path, tiny_clip_dir, capsys, monkeypatch
):
    import errno
    import tempfile

    from metavlm_ros.commands import search as search_command

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def no_model(args):
        raise AssertionError('the model was loaded before the output was checked')

    monkeypatch.setattr(tempfile, 'mkstemp', read_only)
    monkeypatch.setattr(search_command, 'create_backend_from_args', no_model)
    assert search([str(image_path), *SMALL, '--out', str(tmp_path / 'res')], tiny_clip_dir) == 2
    err = capsys.readouterr().err.strip()
    assert 'Read-only file system' in err and '\n' not in err
    assert not (tmp_path / 'res').exists()


def _cli(*argv: str) -> list[str]:
    return [sys.executable, '-m', 'metavlm_ros.cli', *argv]


# `metavlm` as the command runs it, but it stops itself (SIGSTOP) once its first non-dominated solution
# is written: the moment a signal must land on, every time (polling the file from outside missed it
# on a fast machine, where the whole front was written within a millisecond).
STOP_AFTER_FIRST_PARETO = """
import os, signal, sys
if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    print('SIGINT is not KeyboardInterrupt here:', signal.getsignal(signal.SIGINT), file=sys.stderr)
from metavlm_ros.cli import entry_point
from metavlm_ros.common.results import ResultsStore
append = ResultsStore.append_pareto
def append_then_stop(self, record):
    append(self, record)
    if not append_then_stop.__dict__.get('stopped'):
        append_then_stop.stopped = True
        os.kill(os.getpid(), signal.SIGSTOP)
ResultsStore.append_pareto = append_then_stop
sys.argv[0] = 'metavlm'
entry_point()
"""


def _signals_as_a_user_has_them() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _stop_while_front_is_written(argv: list[str], env: dict, signal_number: int) -> int:
    """Run a search and signal it while it writes its non-dominated set (one pareto record written,
    no summary yet); its exit status."""
    command = [sys.executable, '-c', STOP_AFTER_FIRST_PARETO, *argv]
    # The search must take SIGINT and SIGTERM as a user's command does: a test runner that ignores
    # them (in-process ROS and launch code can leave it so, test/ros/test_replay.py) would pass SIG_IGN
    # on through exec, and the search would then finish as if nothing had been sent.
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_signals_as_a_user_has_them,
    )
    _, status = os.waitpid(process.pid, os.WUNTRACED)  # returns once it stopped itself (or ended)
    assert os.WIFSTOPPED(status), f'the search ended (status {status}) before writing its front'
    process.send_signal(signal_number)
    process.send_signal(signal.SIGCONT)
    stderr = process.communicate(timeout=60)[1].decode()
    assert 'Traceback' not in stderr and 'SIGINT is not KeyboardInterrupt' not in stderr, stderr
    return process.returncode


def test_a_search_stopped_by_any_signal_while_it_writes_its_front_resumes_without_duplicates(
    tmp_path, tiny_clip_dir
):
    # Every other moment: test/common/test_results.py.
    args = ['search', str(tmp_path / 'frame.png'), '--model', str(tiny_clip_dir), '--population', '10',
            '--evaluations', '40', '--quiet']  # fmt: skip
    cv2.imwrite(args[1], make_frame(320, 180, seed=2)[..., ::-1])
    full = tmp_path / 'full'
    assert main([*args, '--out', str(full)]) == 0
    assert len(read_jsonl(full / 'pareto.jsonl')) >= 3
    # The same torch thread count as this process (which other tests may have changed): a resume
    # reproduces a search only with it (the store refuses otherwise).
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    for signal_number in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        out = tmp_path / f'cut-{signal_number}'
        code = _stop_while_front_is_written([*args, '--out', str(out)], env, signal_number)
        # Interrupted (130: metavlm's Ctrl-C), or killed by the signal: never a search that finished.
        assert code in (130, -signal_number), (signal_number, code)
        # No finished search: SIGINT and SIGTERM may let it write a summary that says it was stopped.
        assert not [s for s in read_jsonl(out / 'summary.jsonl') if not s['stopped']], signal_number
        # The front waits in memory until the summary flushes it (SIGKILL: none of it is on disk);
        # SIGINT and SIGTERM end the search in order, and what waited is written then.
        assert len(read_jsonl(out / 'pareto.jsonl')) < len(read_jsonl(full / 'pareto.jsonl'))
        assert main([*args, '--out', str(out), '--resume']) == 0
        assert _records(out) == _records(full), signal_number
        assert sorted(p.name for p in (out / 'frames').iterdir()) == sorted(
            p.name for p in (full / 'frames').iterdir()
        )


def test_a_full_disk_during_a_search_gives_one_line_and_resumes(tmp_path, image_path, tiny_clip_dir, capsys):
    args = ['search', str(image_path), '--model', str(tiny_clip_dir), '--population', '10',
            '--evaluations', '40', '--quiet']  # fmt: skip
    full = tmp_path / 'full'
    assert main([*args, '--out', str(full)]) == 0
    size = records_file(full / 'evaluations.jsonl').stat().st_size
    out = tmp_path / 'cut'
    capsys.readouterr()
    # Writes past this size fail with EFBIG, as they fail with ENOSPC on a full disk.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
    try:
        code = main([*args, '--out', str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error:') and 'File too large' in err and '\n' not in err
    assert all(
        m.problem is None for m in iter_members(records_file(out / 'evaluations.jsonl'))
    )  # taken back whole
    assert main([*args, '--out', str(out), '--resume']) == 0
    assert _records(out) == _records(full)


def test_a_damaged_bag_is_refused_before_any_frame_is_searched(tmp_path, tiny_clip_dir, capsys):
    from metavlm_ros.footage.bags import write_bag

    frames = [(make_frame(64, 48, seed=i), None) for i in range(3)]
    for storage in ('mcap', 'sqlite3'):
        bag = write_bag(tmp_path / storage / 'bag', frames, fps=5.0, storage=storage)
        (path,) = [p for p in bag.iterdir() if p.name != 'metadata.yaml']
        data = bytearray(path.read_bytes())
        start = data.find(frames[2][0].tobytes()[:256])  # the last frame: the first two would be searched
        data[start + 10 : start + 210] = bytes(range(200))
        path.write_bytes(bytes(data))
        out = tmp_path / f'res-{storage}'
        assert search([str(bag), *SMALL, '--out', str(out)], tiny_clip_dir) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and 'damaged bag' in err and '\n' not in err
        assert not out.exists()


@pytest.mark.skipif(not can_mount_tmpfs(), reason='needs unshare and tmpfs mounts (user namespaces)')
def test_a_read_only_file_system_is_one_line_before_the_model_loads(tmp_path, image_path, tiny_clip_dir):
    mount = tmp_path / 'mnt'
    mount.mkdir()
    command = ' '.join(_cli('search', str(image_path), '--model', str(tiny_clip_dir), '--quiet', '--out'))
    script = (
        f'mount -t tmpfs tmpfs {mount} && mkdir {mount}/kept && echo x > {mount}/kept/a && '
        f'mount -o remount,ro {mount} && {command} {mount}/kept/res; code=$?; ls {mount}/kept; exit $code'
    )
    done = subprocess.run(['unshare', '-rm', 'sh', '-c', script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err.startswith('metavlm: error:') and 'Read-only file system' in err and '\n' not in err
    assert done.stdout.split() == ['a']


def test_mobo_searches_from_the_command_line_and_a_cut_search_resumes_to_the_same_records(
    tmp_path, image_path, tiny_clip_dir, capsys
):
    # A resumed search runs again from its seed and skips what is stored: mobo must propose the same
    # genotypes again, batch by batch, for the records to come out as an uncut search's.
    args = ['search', str(image_path), '--model', str(tiny_clip_dir), '--algorithm', 'mobo',
            '--population', '10', '--evaluations', '40', '--quiet']  # fmt: skip
    full = tmp_path / 'full'
    assert main([*args, '--out', str(full)]) == 0
    records = read_jsonl(full / 'evaluations.jsonl')
    assert len(records) == 40 and {r['algorithm'] for r in records} == {'mobo'}
    size = records_file(full / 'evaluations.jsonl').stat().st_size
    out = tmp_path / 'cut'
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
    try:
        assert main([*args, '--out', str(out)]) == 2
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    capsys.readouterr()
    assert main([*args, '--out', str(out), '--resume']) == 0
    assert _records(out) == _records(full)


def test_water_types_are_ranged_by_name_as_in_criteria_files(tmp_path, image_path, tiny_clip_dir):
    out = tmp_path / 'res'
    water = [str(image_path), *SMALL, '--out', str(out), '--relations', 'water']
    assert search([*water, '--range', 'water_type=II:5C'], tiny_clip_dir) == 0
    types = {r['parameters']['water_type'] for r in read_jsonl(out / 'evaluations.jsonl') if r['parameters']}
    assert types and all(3.0 <= t <= 7.0 for t in types)  # II is index 3, 5C index 7


@pytest.mark.parametrize('form', ['png', 'mcap'])
def test_a_search_of_water_over_the_scenes_own_ranges_renders_again(tmp_path, tiny_clip_dir, capsys, form):
    """`--water-ranges truth` on footage `metavlm scenes` wrote (a PNG folder, a bag): the identity says
    so, the search keeps its range map beside its source, `metavlm render` makes its follow-ups again
    byte for byte; footage without maps is refused in one line before the model loads."""
    scenes = tmp_path / ('scenes' if form == 'png' else 'scenes.mcap')
    size = ['--size', '64x48', '--frames', '1', '--seed', '4', '--environment', 'shallow']
    assert main(['scenes', '--out', str(scenes), *(['--format', 'png'] if form == 'png' else []), *size]) == 0
    common = ['--relations', 'rotation', 'water', '--range', 'water_type=5C:9C', '--water-ranges', 'truth']
    budget = ['--population', '6', '--evaluations', '24', '--working-size', 'full', '--pareto-pngs', 'all']
    out = tmp_path / 'res'
    assert search([str(scenes), *common, *budget, '--out', str(out)], tiny_clip_dir) == 0
    identity = json.loads((out / 'search.json').read_text())
    assert identity['identity']['settings']['water_ranges'] == 'truth'
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert (out / summary['source_ranges']).is_file() and summary['source_ranges'].endswith('.ranges.png')
    pareto = read_jsonl(out / 'pareto.jsonl')
    assert main(['render', str(out), 'pareto', '--out', str(tmp_path / 'again')]) == 0
    for p in pareto:
        again = tmp_path / 'again' / Path(p['frame']).name
        assert again.read_bytes() == (out / p['frame']).read_bytes()
    if form == 'png':
        shutil.rmtree(scenes / 'ranges')
        named = 'frame_000000.png'
    else:  # a bag of pairs, as another tool records one: no depth topic
        from metavlm_ros.footage.bags import write_bag
        from metavlm_ros.footage.scenes import SceneGenerator

        generator = SceneGenerator(64, 48, 10, seed=4, environment='shallow')
        write_bag(scenes, [generator.frame(0)], fps=10.0, overwrite=True)
        named = 'scenes.mcap: no range map at 1767225600000000000'
    capsys.readouterr()
    assert search([str(scenes), *common, *budget, '--out', str(tmp_path / 'none')], tiny_clip_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'no range map' in err[0] and named in err[0]
    assert not (tmp_path / 'none').exists()
