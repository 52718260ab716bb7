"""The two endpoints agree; the tester survives a perception node that is absent, killed and restarted."""

import os
import signal
import subprocess
import sys

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from metavlm_ros.common.results import read_jsonl
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.perception_node import PerceptionNode
from metavlm_ros.ros.probe_client import PROBE_QOS
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from test.conftest import make_frame
from test.ros.helpers import CameraPublisher, TopicCollector, ros_context, wait_for


def node_parameters(results, endpoint, model, **extra):
    values = {
        'vlm_endpoint': endpoint,
        'model': str(model),
        'device': 'cpu',
        'population': 6,
        'evaluations': 30,
        'seed': 11,
        'frame_period_s': 0.0,
        'transport_size': 48,
        'results_dir': str(results),
        **extra,
    }
    return [Parameter(k, value=v) for k, v in values.items()]


def search_once(tmp_path, endpoint, tiny_clip_dir):
    """Search one frame through `endpoint` and return the stored evaluation records."""
    results = tmp_path / endpoint
    with ros_context() as context:
        nodes = []
        if endpoint == 'ros':
            model = [Parameter('model', value=str(tiny_clip_dir)), Parameter('device', value='cpu')]
            nodes.append(PerceptionNode(context=context, parameter_overrides=model))
            bring_up(nodes[-1])
        tester = MetaVLMTester(
            context=context, parameter_overrides=node_parameters(results, endpoint, tiny_clip_dir)
        )
        bring_up(tester)
        camera = CameraPublisher(context)
        probes = TopicCollector(context, 'probe', Image, PROBE_QOS, name='probe_sink')
        nodes += [tester, camera, probes]
        executor = SingleThreadedExecutor(context=context)
        for node in nodes:
            executor.add_node(node)
        try:
            ready = lambda: camera.publisher.get_subscription_count() > 0 and tester._endpoint_ready()  # noqa: E731
            wait_for(ready, 10, executor, 'the tester and its endpoint')
            camera.publish(make_frame(120, 90, seed=8), 3_000_000_000)
            wait_for(lambda: tester.searches_done == 1, 30, executor, f'a search through {endpoint}')
            if endpoint == 'ros':
                # Full-resolution frames never cross DDS: every probe is at the transport size.
                wait_for(lambda: len(probes.messages) == tester.probe.sent, 5, executor, 'the probes')
                assert {(m.width, m.height) for m in probes.messages} == {(48, 36)}
        finally:
            executor.shutdown(timeout_sec=2)
            for node in nodes:
                node.destroy_node()
    return read_jsonl(results / 'evaluations.jsonl')


def test_ros_and_inprocess_endpoints_give_the_same_evaluations(tmp_path, tiny_clip_dir):
    through_ros = search_once(tmp_path, 'ros', tiny_clip_dir)
    in_process = search_once(tmp_path, 'inprocess', tiny_clip_dir)
    assert len(through_ros) == len(in_process) == 30
    assert not any(r['failed'] for r in through_ros)
    for a, b in zip(through_ros, in_process, strict=True):
        assert a['genotype'] == b['genotype']  # same seed, same genotypes
        assert a['composition'] == b['composition']
        # Same pixels reach the same model in both: the transport reduction is shared.
        assert a['source'] == pytest.approx(b['source'], abs=1e-6)
        assert a['f_pred'] == pytest.approx(b['f_pred'], abs=1e-5)
        assert a['violation'] == b['violation']
    assert {r['endpoint'] for r in through_ros} == {'ros'}
    assert {r['source_stamp'] for r in through_ros} == {3_000_000_000}


def start_perception(tiny_clip_dir):
    """The perception node as its own process, as a robot runs it."""
    return subprocess.Popen(
        [
            sys.executable,
            '-m',
            'metavlm_ros.ros.perception_node',
            '--ros-args',
            '-p',
            'autostart:=true',
            '-p',
            f'model:={tiny_clip_dir}',
            '-p',
            'device:=cpu',
        ],
        # UDP on loopback only: this process is killed with SIGKILL, and Fast DDS would leave its shared
        # memory segments behind in /dev/shm (two of 52 KB a kill, never reclaimed).
        env={**os.environ, 'FASTDDS_BUILTIN_TRANSPORTS': 'UDPv4'},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def latest(diagnostics):
    status = diagnostics.messages[-1].status[0]
    return status, {kv.key: kv.value for kv in status.values}


def test_tester_waits_for_survives_and_resumes_with_a_restarted_perception_node(tmp_path, tiny_clip_dir):
    results = tmp_path / 'results'
    process = None
    with ros_context() as context:
        tester = MetaVLMTester(
            context=context,
            parameter_overrides=node_parameters(
                results, 'ros', tiny_clip_dir, evaluations=6000, probe_timeout_s=0.4
            ),
        )
        bring_up(tester)
        camera = CameraPublisher(context)
        diagnostics = TopicCollector(context, '/diagnostics', DiagnosticArray, name='diagnostics_sink')
        executor = SingleThreadedExecutor(context=context)
        for node in (tester, camera, diagnostics):
            executor.add_node(node)
        camera.start([make_frame(120, 90, seed=s) for s in range(3)], rate_hz=5.0)
        try:
            # Absent at start: said so in /diagnostics, frames kept coming, nothing searched.
            wait_for(lambda: len(diagnostics.messages) >= 2, 10, executor, 'diagnostics')
            status, kv = latest(diagnostics)
            assert status.level == DiagnosticStatus.WARN and 'absent' in status.message
            assert kv['searches_done'] == '0' and int(kv['frames_received']) > 0

            process = start_perception(tiny_clip_dir)
            wait_for(lambda: tester.evaluations > 12, 60, executor, 'evaluations through the perception node')
            assert tester.perception_answering

            # Killed mid-search: failed evaluations recorded, the search given up, nothing lost.
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            done_before = tester.evaluations - tester.evaluations_failed
            wait_for(lambda: tester.searches_stopped >= 1, 30, executor, 'the search to be given up')
            stored = read_jsonl(results / 'evaluations.jsonl')
            assert len(stored) == tester.evaluations
            assert sum(not r['failed'] for r in stored) >= done_before
            assert any(r['failed'] for r in stored)
            summary = read_jsonl(results / 'summary.jsonl')
            assert summary[-1]['stopped'] is True
            count = len(diagnostics.messages)
            wait_for(lambda: len(diagnostics.messages) > count + 1, 5, executor, 'diagnostics after the kill')
            status, kv = latest(diagnostics)
            assert status.level == DiagnosticStatus.WARN
            assert kv['perception_answering'] == 'false'

            # Restarted: the tester carries on by itself.
            process = start_perception(tiny_clip_dir)
            good = tester.evaluations - tester.evaluations_failed
            wait_for(
                lambda: tester.evaluations - tester.evaluations_failed > good + 12,
                60,
                executor,
                'evaluations after the restart',
            )
            assert tester.perception_answering
        finally:
            camera.stop()
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            executor.shutdown(timeout_sec=2)
            for node in (tester, camera, diagnostics):
                node.destroy_node()
