"""The package as a ROS user runs it: colcon build, `ros2 launch`, `launch_test`, signals, bad arguments.

The launch files are run through the real launch system (the ros-tools wheels), with the package
found through the ament index of a colcon install prefix, never through the source tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from metavlm_ros.models.registry import BACKENDS
from test.launch.support import records
from test.ros_domain import claim_domain
from test.ros_tools import BIN, ROOT

LAUNCH_TESTS = ROOT / 'test' / 'launch'
pytestmark = pytest.mark.ros_tools('colcon', 'ros2', 'launch_testing', 'launch_ros', 'ros2lifecycle')


@pytest.fixture(scope='module')
def ros_env(tmp_path_factory) -> dict[str, str]:
    """A colcon build of the package into a fresh install prefix, and the environment that finds it."""
    workspace = tmp_path_factory.mktemp('colcon_ws')
    (workspace / 'src').mkdir()
    (workspace / 'src' / 'metavlm_ros').symlink_to(ROOT)
    env = {**os.environ, 'PATH': f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}'}
    done = subprocess.run(
        [str(BIN / 'colcon'), 'build', '--packages-select', 'metavlm_ros', '--base-paths', 'src'],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    prefix = workspace / 'install' / 'metavlm_ros'
    assert (prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'metavlm_ros').is_file()
    site = prefix / 'lib' / f'python{sys.version_info.major}.{sys.version_info.minor}' / 'site-packages'
    # A ROS domain of their own: nodes left in this test process's domain by other tests (same names,
    # /metavlm_tester) would otherwise answer the launched nodes' lifecycle and parameter requests.
    domain = claim_domain()
    # launch_ros writes every node's dict parameters to a temporary file it never removes: here they go
    # with the test's own temporary folder, not to /tmp.
    launch_tmp = tmp_path_factory.mktemp('launch_tmp')
    env.update(
        TMPDIR=str(launch_tmp),
        ROS_DOMAIN_ID=str(domain),
        AMENT_PREFIX_PATH=str(prefix),
        # the installed package first; the source root after it only for tests.launch.support
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]),
        PYTHONUNBUFFERED='1',
    )
    return env


def small_params(path: Path, results: Path, **tester) -> Path:
    """config/metavlm.yaml with a small search budget and its own results directory."""
    blocks = yaml.safe_load((ROOT / 'config' / 'metavlm.yaml').read_text())
    values = blocks['metavlm_tester']['ros__parameters']
    values.update(
        {'population': 10, 'evaluations': 150, 'frame_period_s': 1.0, 'results_dir': str(results), **tester}
    )
    path.write_text(yaml.safe_dump(blocks))
    return path


def launch_test(ros_env, test_file: str, cwd: Path, *arguments: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(BIN / 'launch_test'), str(LAUNCH_TESTS / test_file), *arguments],
        cwd=cwd,
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20000:]
    return output


def test_metavlm_launch_gives_violations_params_and_lifecycle_through_the_real_tools(ros_env, tmp_path):
    # The shipped parameters with a search budget that outlasts the test (test_metavlm.launch.py says why).
    blocks = yaml.safe_load((ROOT / 'config' / 'metavlm.yaml').read_text())
    blocks['metavlm_tester']['ros__parameters']['evaluations'] = 1_000_000
    params = tmp_path / 'params.yaml'
    params.write_text(yaml.safe_dump(blocks))
    env = {**ros_env, 'METAVLM_TEST_PARAMS': str(params)}
    output = launch_test(env, 'test_metavlm.launch.py', tmp_path, f'params_file:={params}')
    assert 'Ran 3 tests' in output and 'FAILED' not in output


@pytest.mark.parametrize(
    ('name', 'player', 'messages'),
    # A ROS 1 bag and a video go to metavlm replay even when ros2 bag play is asked for: it reads neither.
    # 60 frames of a scenes bag: image, camera info, ground truth and range map each; a video's images.
    [('dive', 'metavlm', 240), ('dive.bag', 'ros2', 240), ('dive.mkv', 'ros2', 60)],
)
def test_replay_launch_plays_6_s_of_footage_once_the_nodes_are_active(
    ros_env, tmp_path, name, player, messages
):
    bag = tmp_path / name
    scenes = subprocess.run(
        [str(BIN / 'metavlm'), 'scenes', '--out', str(bag), '--frames', '60', '--fps', '10',
         '--size', '384x216', '--environment', 'shallow'],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert scenes.returncode == 0, scenes.stderr
    params = small_params(tmp_path / 'params.yaml', tmp_path / 'results')
    env = {
        **ros_env,
        'METAVLM_TEST_RESULTS': str(tmp_path / 'results'),
        'METAVLM_TEST_PLAYER': player,
        'METAVLM_TEST_MESSAGES': str(messages),
    }
    output = launch_test(env, 'test_replay.launch.py', tmp_path, f'bag:={bag}', f'params_file:={params}')
    assert 'Ran 2 tests' in output and 'FAILED' not in output


def _start_launch(ros_env, cwd: Path, *arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / 'ros2'), 'launch', 'metavlm_ros', 'metavlm.launch.py', *arguments],
        cwd=cwd,
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives it
    )


def _start_nodes(ros_env, cwd: Path, params: Path) -> list[subprocess.Popen]:
    """Both installed node executables, brought up by `autostart`, in one process group as in a terminal.

    Not through `ros2 run`: that wrapper ends on SIGTERM without waiting for its child.
    """
    processes: list[subprocess.Popen] = []
    for executable in ('perception_node', 'tester_node'):
        command = [
            str(Path(ros_env['AMENT_PREFIX_PATH']) / 'lib' / 'metavlm_ros' / executable),
            *('--ros-args', '--params-file', str(params), '-p', 'autostart:=true'),
        ]
        processes.append(
            subprocess.Popen(
                command,
                cwd=cwd,
                env=ros_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                process_group=processes[0].pid if processes else 0,
            )
        )
    return processes


@pytest.mark.parametrize(
    ('how', 'signum'),
    [('ros2-launch', signal.SIGINT), ('nodes', signal.SIGTERM), ('nodes', signal.SIGINT)],
    ids=['SIGINT-ros2-launch', 'SIGTERM-terminal', 'SIGINT-terminal'],
)
def test_a_signal_to_the_process_group_stops_the_search_cleanly(ros_env, tmp_path, how, signum):
    """Ctrl-C (or SIGTERM) in the terminal reaches every process of the group during a search.

    `ros2 launch` itself ends on SIGTERM without waiting for its processes (upstream behaviour), so
    SIGTERM is sent to the node executables started as in a terminal.
    """
    import rclpy

    from test.launch.support import Watcher

    results = tmp_path / 'results'
    params = small_params(tmp_path / 'params.yaml', results, evaluations=1_000_000)
    if how == 'ros2-launch':
        processes = [_start_launch(ros_env, tmp_path, f'params_file:={params}')]
    else:
        processes = _start_nodes(ros_env, tmp_path, params)
    group = processes[0].pid
    try:
        rclpy.init(domain_id=int(ros_env['ROS_DOMAIN_ID']))
        watcher = Watcher(camera_topic='/camera/image_raw' if how == 'ros2-launch' else '/image')
        try:
            deadline = time.monotonic() + 240
            while len(records(results / 'evaluations.jsonl')) < 40 and time.monotonic() < deadline:
                rclpy.spin_once(watcher, timeout_sec=0.1)
                assert all(process.poll() is None for process in processes), 'a process ended early'
            assert len(records(results / 'evaluations.jsonl')) >= 40, 'no search within 240 s'
        finally:
            watcher.destroy_node()
            rclpy.shutdown()
        signalled = time.monotonic()
        os.killpg(group, signum)  # the terminal's Ctrl-C reaches every process of the group
        outputs = [process.communicate(timeout=60)[0] for process in processes]
        took = time.monotonic() - signalled
    finally:
        if any(process.poll() is None for process in processes):
            os.killpg(group, signal.SIGKILL)  # never leave nodes behind in the test's ROS domain
            for process in processes:
                process.wait(10)
    output = '\n'.join(outputs)
    assert [process.returncode for process in processes] == [0] * len(processes), output
    if how == 'ros2-launch':
        assert output.count('process has finished cleanly') == 2, output
    for bad in ('ERROR', 'Traceback', 'context is invalid', 'terminate called', 'escalating'):
        assert bad not in output, output
    assert took < 10.0, f'{took:.1f} s to stop'
    summary = records(results / 'summary.jsonl')
    assert len(summary) == 1 and summary[0]['stopped'] is True
    assert summary[0]['evaluations'] == len(records(results / 'evaluations.jsonl'))
    assert records(results / 'pareto.jsonl')


@pytest.mark.parametrize(
    ('launch_file', 'argument', 'line'),
    [
        (
            'metavlm.launch.py',
            'autostart:=maybe',
            "launch argument autostart: expected true or false, got 'maybe'",
        ),
        (
            'metavlm.launch.py',
            'camera_topic:=camera image',
            "launch argument camera_topic: 'camera image' is not",
        ),
        (
            'metavlm.launch.py',
            'backend:=gpt',
            f'launch argument backend: expected one of {", ".join(BACKENDS)}',
        ),
        ('replay.launch.py', 'rate:=fast', "launch argument rate: expected a positive number, got 'fast'"),
    ],
    ids=['autostart', 'camera_topic', 'backend', 'rate'],
)
def test_a_wrong_launch_argument_is_one_line_naming_it(ros_env, tmp_path, launch_file, argument, line):
    # Every argument's wrong values are tested in process (test_launch.py); these through `ros2 launch`.
    extra = [f'bag:={tmp_path}'] if launch_file == 'replay.launch.py' else []
    done = subprocess.run(
        [str(BIN / 'ros2'), 'launch', 'metavlm_ros', launch_file, argument, *extra],
        cwd=tmp_path, env=ros_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    errors = [entry for entry in (done.stdout + done.stderr).splitlines() if 'ERROR' in entry]
    assert len(errors) == 1 and line in errors[0], done.stdout + done.stderr
    assert 'Traceback' not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ('argument', 'line', 'running'),
    [
        ('population:=1', 'metavlm_tester: error: parameter population', 'metavlm_perception'),
        ('model:=/no/such/model', 'configure failed: ', 'metavlm_tester'),
        ('vlm_endpoint:=cloud', 'metavlm_tester: error: parameter vlm_endpoint', 'metavlm_perception'),
        # A served model whose server is not running (port 9 on this machine: nothing listens).
        (
            'backend:=openai model:=smolvlm endpoint:=http://127.0.0.1:9/v1',
            'configure failed: ',
            'metavlm_tester',
        ),
    ],
    ids=['tester-parameter', 'perception-model', 'tester-endpoint', 'perception-served-model-down'],
)
def test_a_wrong_parameter_is_one_line_naming_it_and_the_other_node_keeps_running(
    ros_env, tmp_path, argument, line, running
):
    if argument.startswith('population'):  # a wrong value in the tester's block of the parameter file
        arguments = [f'params_file:={small_params(tmp_path / "p.yaml", tmp_path / "r", population=1)}']
    else:  # launch arguments that reach the perception node's parameters
        arguments = argument.split()
        argument = arguments[-1]
    process = _start_launch(ros_env, tmp_path, *arguments)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, '')), daemon=True)
    reader.start()
    active = f'[{running}]: active'

    def seen() -> bool:
        text = ''.join(lines)
        return line in text and active in text

    ended = None
    try:
        deadline = time.monotonic() + 180
        while not seen() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # What this test is about is above; ending the launch is the signal tests' subject. Ctrl-C must
        # end it, though: a launch with a request left waiting on the node that died once did not.
        os.killpg(process.pid, signal.SIGINT)
        try:
            ended = process.wait(30)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # never leave nodes behind in the test's ROS domain
            process.wait(10)
    reader.join(5)
    text = ''.join(lines)
    assert seen(), text
    (named,) = [entry for entry in text.splitlines() if line in entry]
    assert argument.split(':=')[0] in named or argument.split(':=')[1] in named, named
    assert f'[{running}]' in text and 'Traceback' not in text, text
    assert ended is not None, f'ros2 launch still ran 30 s after SIGINT:\n{text}'
