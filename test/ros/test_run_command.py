"""`metavlm run`: both nodes in one process on a folder of PNGs or a bag, with a tiny CLIP."""

import os
from pathlib import Path

import pytest
import yaml

from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.results import read_identity, read_jsonl, records_file
from metavlm_ros.footage.bags import write_bag
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.ros.launcher import _flatten, _write_ros_file, load_parameter_file, run_nodes
from metavlm_ros.ros.transport import USER_VARIABLES
from test.conftest import can_mount_tmpfs, make_frame, write_frames


@pytest.fixture
def folder(tmp_path):
    return write_frames(tmp_path / 'frames', 3, 64, 48)


def write_params(tmp_path, tiny_clip_dir, **tester):
    model = {'model': str(tiny_clip_dir), 'device': 'cpu'}
    values = {
        **model,
        'population': 4,
        'evaluations': 8,
        'frame_period_s': 0,  # an integer on purpose: `metavlm run` makes it the double ROS expects
        'transport_size': 32,
        'results_dir': str(tmp_path / 'results'),
        **tester,
    }
    blocks = {
        'metavlm_perception': {'ros__parameters': model},
        'metavlm_tester': {'ros__parameters': values},
    }
    path = tmp_path / 'params.yaml'
    path.write_text(yaml.safe_dump(blocks), encoding='utf-8')
    return path


def test_metavlm_run_on_a_folder_through_the_perception_node(tmp_path, tiny_clip_dir, folder, capsys):
    params = write_params(tmp_path, tiny_clip_dir)
    code = main(['run', '--params', str(params), '--source', str(folder), '--rate', '4'])
    assert code == 0
    out = capsys.readouterr().out
    assert '3 frame(s) published' in out
    records = read_jsonl(tmp_path / 'results' / 'evaluations.jsonl')
    summaries = read_jsonl(tmp_path / 'results' / 'summary.jsonl')
    assert 1 <= len(summaries) <= 3
    assert len(records) == 8 * len(summaries)
    assert {r['endpoint'] for r in records} == {'ros'}
    assert not any(r['failed'] for r in records)
    assert all(r['source_stamp'] > 0 and r['image'] == f'camera@{r["source_stamp"]}' for r in records)
    assert f'{len(summaries)} search(es), {len(records)} evaluations (0 failed)' in out
    # The tester leaves its directory with a SHA256SUMS of every file, as `sha256sum -c` checks it.
    import subprocess

    results = tmp_path / 'results'
    assert (results / 'SHA256SUMS').is_file()
    done = subprocess.run(
        ['sha256sum', '--check', '--strict', 'SHA256SUMS'], cwd=results, capture_output=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {line.split('  ', 1)[1] for line in (results / 'SHA256SUMS').read_text().splitlines()}
    assert {'evaluations.jsonl.gz', 'summary.jsonl.gz', 'search.json'} <= listed


def test_run_nodes_replays_a_bag_with_its_stamps_for_a_duration(tmp_path, tiny_clip_dir):
    frames = [(make_frame(64, 48, seed=i), None) for i in range(4)]
    bag = write_bag(tmp_path / 'bag', frames, fps=10.0, start_ns=5_000_000_000)
    params = write_params(tmp_path, tiny_clip_dir, vlm_endpoint='inprocess')
    lines = []
    summary = run_nodes(
        params, source=bag, duration=2.0, loop=True, results_dir=tmp_path / 'out', log=lines.append
    )
    if not any(os.environ.get(name) for name in USER_VARIABLES):
        # The nodes run with the project's transport, and it does not outlive the run.
        assert any('Fast DDS shared memory' in line for line in lines), lines
        assert 'FASTDDS_DEFAULT_PROFILES_FILE' not in os.environ
    # 2 s of a 10 Hz bag replayed in a loop: about 20 frames, most dropped while searches run.
    assert 12 <= summary['frames_published'] <= 22
    assert summary['endpoint'] == 'inprocess'
    assert summary['searches'] >= 1
    assert summary['frames_received'] - summary['frames_dropped'] >= summary['searches']
    stamps = {r['source_stamp'] for r in read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')}
    assert stamps <= {5_000_000_000 + i * 100_000_000 for i in range(4)}
    assert summary['results_dir'] == str(tmp_path / 'out')


def test_run_nodes_plays_a_video_at_its_frame_rate_stamped_by_its_position(tmp_path, tiny_clip_dir):
    from metavlm_ros.footage.video import VIDEO_EPOCH_NS, write_video

    video = write_video(tmp_path / 'dive.mkv', [make_frame(64, 48, seed=i) for i in range(4)], fps=10.0)
    params = write_params(tmp_path, tiny_clip_dir, vlm_endpoint='inprocess')
    summary = run_nodes(params, source=video, results_dir=tmp_path / 'out')
    assert summary['frames_published'] == 4 and summary['searches'] >= 1
    stamps = {r['source_stamp'] for r in read_jsonl(tmp_path / 'out' / 'evaluations.jsonl')}
    # A frame's stamp is the video epoch plus its position (frames 100 ms apart): found again from it.
    assert stamps <= {VIDEO_EPOCH_NS + i * 100_000_000 for i in range(4)}


def test_invalid_parameters_are_a_one_line_error_and_exit_2(tmp_path, tiny_clip_dir, folder, capsys):
    params = write_params(tmp_path, tiny_clip_dir, vlm_endpoint='inprocess', population=1)
    assert main(['run', '--params', str(params), '--source', str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith('metavlm: error: parameter population')
    assert not records_file(tmp_path / 'results' / 'evaluations.jsonl').exists()


def test_missing_inputs_are_refused_before_anything_starts(tmp_path, folder, capsys):
    assert main(['run', '--params', str(tmp_path / 'nope.yaml'), '--source', str(folder)]) == 2
    assert 'nope.yaml: no such parameter file' in capsys.readouterr().err
    with pytest.raises(InputError, match='no such file or directory'):
        run_nodes(None, source=tmp_path / 'missing')
    assert main(['run', '--source', str(folder), '--loop']) == 2
    assert 'metavlm: error: --loop needs --duration' in capsys.readouterr().err
    assert main(['run', '--source', str(folder), '--rate', '0']) == 2
    assert 'metavlm: error: --rate must be positive, got 0' in capsys.readouterr().err


def test_parameter_files_are_read_and_rewritten_for_rcl(tmp_path):
    path = tmp_path / 'p.yaml'
    path.write_text(
        'metavlm_tester:\n'
        '  ros__parameters:\n'
        '    probe_timeout_s: 5\n'
        '    ranges:\n'
        '      scaling: [0.8, 1]\n'
        '    class_prompts: []\n'
        '/metavlm_perception:\n'
        '  model: demo\n',
        encoding='utf-8',
    )
    nodes = load_parameter_file(path)
    assert nodes == {
        'metavlm_tester': {'probe_timeout_s': 5, 'ranges': {'scaling': [0.8, 1]}, 'class_prompts': []},
        'metavlm_perception': {'model': 'demo'},
    }
    written = yaml.safe_load(_write_ros_file(nodes, tmp_path).read_text(encoding='utf-8'))
    # Doubles become doubles, nested names are flattened, an untyped empty list is left out.
    assert written == {
        'metavlm_tester': {'ros__parameters': {'probe_timeout_s': 5.0, 'ranges.scaling': [0.8, 1.0]}},
        'metavlm_perception': {'ros__parameters': {'model': 'demo'}},
    }
    bad = tmp_path / 'bad.yaml'
    bad.write_text('metavlm_tester: [1, 2]\n', encoding='utf-8')
    with pytest.raises(ParameterError, match='must be a mapping'):
        load_parameter_file(bad)
    broken = tmp_path / 'broken.yaml'
    broken.write_text('metavlm_tester: {a: [1, 2\n', encoding='utf-8')
    with pytest.raises(InputError, match='not valid YAML'):
        load_parameter_file(broken)


def test_the_shipped_parameter_file_matches_the_nodes(tmp_path):
    from metavlm_ros.ros.tester_settings import PARAMETERS, settings_from_parameters
    from test.ros.helpers import ros_context

    shipped = Path(__file__).resolve().parents[2] / 'config' / 'metavlm.yaml'
    nodes = load_parameter_file(shipped)
    tester = _flatten(nodes['metavlm_tester'])
    # Every tester parameter is documented there (an empty list, as class_prompts, only as a comment).
    assert set(tester) == {p.name for p in PARAMETERS if p.default != []}
    settings = settings_from_parameters(tester)
    assert (settings.endpoint, settings.transport_size, settings.results_dir) == ('ros', 384, 'results/ros')
    assert (settings.search.population, settings.search.evaluations) == (30, 3000)
    # The PNG budgets the tester's hour is sized for (docs/results.md, "What a tester writes an hour").
    assert (settings.search.pareto_pngs, settings.violation_pngs_per_search) == (0, 1)
    assert set(nodes['metavlm_perception']) >= {'backend', 'model', 'max_batch', 'batch_wait_ms'}
    # rcl itself accepts the file as it is.
    with ros_context(['--ros-args', '--params-file', str(shipped)]) as context:
        assert context.ok()


def test_damaged_or_empty_footage_is_refused_before_any_node_or_model_starts(
    tmp_path, tiny_clip_dir, folder, capsys, monkeypatch
):
    from metavlm_ros.ros import tester_node

    def no_start(*args, **kwargs):
        raise AssertionError('a node started before the footage was checked')

    monkeypatch.setattr(tester_node.TesterNode, '__init__', no_start)
    frames = [(make_frame(64, 48, seed=i), None) for i in range(3)]
    bag = write_bag(tmp_path / 'bag', frames, fps=5.0)
    storage = bag / 'bag.mcap'
    data = bytearray(storage.read_bytes())
    start = data.find(frames[1][0].tobytes())
    data[start + 100 : start + 300] = bytes(200)
    storage.write_bytes(bytes(data))
    params = write_params(tmp_path, tiny_clip_dir)
    empty = tmp_path / 'empty'
    empty.mkdir()
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'a.png').write_bytes(b'\x89PNG\r\n\x1a\n' + bytes(30))
    for source, needle in ((bag, 'damaged bag'), (empty, 'no images'), (broken, 'not a readable image')):
        assert main(['run', '--params', str(params), '--source', str(source)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and needle in err and '\n' not in err, err
    assert not (tmp_path / 'results').exists()


def test_ctrl_c_during_metavlm_run_stops_the_search_with_its_summary(tmp_path, tiny_clip_dir, folder):
    import os
    import signal
    import subprocess
    import sys
    import time

    params = write_params(tmp_path, tiny_clip_dir, evaluations=1_000_000, transport_size=32)
    process = subprocess.Popen(
        [sys.executable, '-m', 'metavlm_ros.cli', 'run', '--params', str(params), '--source', str(folder),
         '--loop', '--duration', '600'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )  # fmt: skip
    evaluations = tmp_path / 'results' / 'evaluations.jsonl'
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if len(read_jsonl(evaluations)) >= 12:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()  # never leave nodes behind in the tests' ROS domain
            process.wait(10)
    assert process.returncode == 130, output
    assert 'results written so far are kept' in output
    assert 'ERROR' not in output and 'Traceback' not in output, output
    (summary,) = read_jsonl(tmp_path / 'results' / 'summary.jsonl')
    assert summary['stopped'] is True
    assert summary['evaluations'] == len(read_jsonl(evaluations))


def test_a_rerun_into_results_of_other_settings_is_refused_before_any_node_starts(
    tmp_path, tiny_clip_dir, folder, capsys, monkeypatch
):
    params = write_params(tmp_path, tiny_clip_dir)
    assert main(['run', '--params', str(params), '--source', str(folder), '--rate', '4']) == 0
    results = tmp_path / 'results'
    identity = read_identity(results)
    # The ros endpoint: the model as the perception node identified it in its answers, as an
    # in-process run would (test/ros/test_perception_identity.py compares the two word for word).
    model = identity['model']
    assert (model['backend'], model['model']) == ('clip', str(tiny_clip_dir))
    assert len(model['weights_sha256']) == 64 and model['options']['classes'] == list(CLASSES)
    assert identity['settings']['population'] == 4 and identity['source']['transport_size'] == 32
    assert identity['source']['endpoint'] == 'ros'
    before = {
        name: records_file(results / name).read_bytes() for name in ('evaluations.jsonl', 'summary.jsonl')
    }
    summaries_before = read_jsonl(results / 'summary.jsonl')
    capsys.readouterr()

    from metavlm_ros.ros import tester_node

    def no_start(*args, **kwargs):
        raise AssertionError('a node started before the results directory was checked')

    with monkeypatch.context() as patch:
        patch.setattr(tester_node.TesterNode, '__init__', no_start)
        (tmp_path / 'other').mkdir()
        other = write_params(
            tmp_path / 'other', tiny_clip_dir, population=5, evaluations=10, results_dir=str(results)
        )
        assert main(['run', '--params', str(other), '--source', str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f'metavlm: error: parameter results_dir: {results} holds searches of another identity'
    )
    assert 'settings.population: 4 there, 5 here' in err and 'settings.evaluations: 8 there, 10 here' in err
    assert '\n' not in err
    assert {name: records_file(results / name).read_bytes() for name in before} == before
    # The same settings continue the same directory.
    assert main(['run', '--params', str(params), '--source', str(folder), '--rate', '4']) == 0
    assert len(read_jsonl(results / 'summary.jsonl')) > len(summaries_before)


@pytest.mark.skipif(not can_mount_tmpfs(), reason='needs unshare and tmpfs mounts (user namespaces)')
def test_a_results_disk_that_fills_up_ends_the_run_with_one_line_and_exit_2(tmp_path, tiny_clip_dir, folder):
    import subprocess
    import sys

    mount = tmp_path / 'mnt'
    mount.mkdir()
    # A 600 KiB disk: the first search's records and PNGs fill it.
    params = write_params(
        tmp_path, tiny_clip_dir, evaluations=400, population=10, min_free_disk_mb=0,
        violation_pngs_per_search=1000, results_dir=str(mount / 'res'),
    )  # fmt: skip
    command = f'{sys.executable} -m metavlm_ros.cli run --params {params} --source {folder} --rate 2'
    records = f'zcat {mount}/res/*.jsonl.gz'
    script = f'mount -t tmpfs -o size=600k tmpfs {mount} && {command}; code=$?; {records}; exit $code'
    done = subprocess.run(['unshare', '-rm', 'sh', '-c', script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith('metavlm: error:')]
    assert len(errors) == 1 and 'No space left on device' in errors[0], done.stderr
    assert 'everything written before is intact' in errors[0]
    # The tester says so once, not once per frame.
    assert done.stderr.count('[metavlm_tester]: search stopped:') == 1, done.stderr
    assert 'Traceback' not in done.stderr
    # What was written is whole: zcat reads every member, and each line is a complete record.
    import json

    lines = [line for line in done.stdout.splitlines() if line.startswith('{')]
    assert lines and all(json.loads(line) for line in lines)


def test_a_tester_killed_mid_search_leaves_records_pandas_duckdb_and_jq_read_as_ours(
    tmp_path, tiny_clip_dir, folder
):
    """SIGKILL (no handler runs) while a search is going on: every flushed member stays readable by
    the standard tools as written, and they get what the project's reader gets."""
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from metavlm_ros.common.gzip_lines import iter_members, repair_torn_member
    from metavlm_ros.common.results import EVALUATIONS, PARETO, SUMMARY, VIOLATIONS
    from test.tools_reading import as_jq_reads, jq_records, same_as_ours

    # Thresholds at which the tiny CLIP's answers change (it is random): violations are published.
    params = write_params(tmp_path, tiny_clip_dir, evaluations=40, thresholds=[0.0001, 0.001, 0.01],
                          report_threshold=0.0001)  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, '-m', 'metavlm_ros.cli', 'run', '--params', str(params), '--source', str(folder),
         '--loop', '--duration', '600'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
    )  # fmt: skip
    results = tmp_path / 'results'
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            searches = len(read_jsonl(results / SUMMARY))
            # Mid-search: a later search's evaluations are on disk, its summary not yet.
            if searches >= 2 and len(read_jsonl(results / EVALUATIONS)) > 40 * searches:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()[0]
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()  # never leave nodes behind in the tests' ROS domain
            process.wait(10)
    evaluations = read_jsonl(results / EVALUATIONS)
    assert len(evaluations) > 40 * len(read_jsonl(results / SUMMARY)) >= 80, 'not killed mid-search'
    names = (EVALUATIONS, PARETO, SUMMARY, VIOLATIONS)
    for name in names:
        path = records_file(results / name)
        members = list(iter_members(path))
        if members[-1].problem is not None:
            # A kill inside a write (the kernel stops a write of several pages between two): the
            # project's readers skipped it; the next store that opens the directory cuts it, as here.
            before = read_jsonl(results / name)
            assert repair_torn_member(path) and read_jsonl(results / name) == before
        assert all(member.problem is None for member in iter_members(path)), name
    assert read_jsonl(results / VIOLATIONS), 'no violation was published'
    same_as_ours(results, names=names)
    if shutil.which('jq') is None:
        pytest.skip('jq is not installed here: pandas and DuckDB were compared, jq not')
    for name in names:
        assert jq_records(records_file(results / name)) == as_jq_reads(read_jsonl(results / name)), name
