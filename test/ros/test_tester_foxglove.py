"""The tester watched in Foxglove: its live server through the lifecycle, a real client of a running
tester node, and the same overlay on ROS (`violation_followup`) for rqt and rviz."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading

import cv2
import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from sensor_msgs.msg import Image

from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.frames import load_image
from metavlm_ros.ros.conversions import image_msg_to_rgb
from metavlm_ros.ros.managed import state_label
from metavlm_ros.ros.visualisation import followup_overlay
from metavlm_ros.viewer.channels import overlay_lines
from test.conftest import make_frame
from test.ros.helpers import CameraPublisher, TopicCollector, ros_context, wait_for
from test.ros.tester_graph import values_of
from test.viewer.foxglove_client import free_port, watch


def serving(port: int) -> bool:
    """Whether something listens on the port: a socket of the test's own cannot bind it (no connection)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(('127.0.0.1', port))
        except OSError:
            return True
    return False


def test_a_port_in_use_refuses_configure_in_one_line_and_a_free_one_serves_from_configure_to_cleanup(
    graph, capfd
):
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        g = graph(start=False, foxglove_port=port)
        assert g.tester.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert state_label(g.tester) == 'unconfigured'
        message = str(g.tester.transition_error)
        assert message.startswith(f'parameter foxglove_port: cannot serve Foxglove on 127.0.0.1:{port} (')
        assert 'in use' in message and '\n' not in message
        assert g.tester.live is None and g.tester.backend is None  # refused before a model was made
    logged = [line for line in capfd.readouterr().err.splitlines() if 'foxglove' in line.lower()]
    assert len(logged) == 1 and 'configure failed: parameter foxglove_port' in logged[0], logged

    # The port free again: configure serves it, a pause keeps the viewer's connection, cleanup ends it.
    assert g.tester.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert g.tester.live.url == f'ws://127.0.0.1:{port}' and serving(port)
    assert g.tester.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert g.tester.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert serving(port)
    values = values_of(g.tester.diagnostics())
    assert values['foxglove'] == f'ws://127.0.0.1:{port}' and values['foxglove_viewers'] == '0'
    assert g.tester.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    assert g.tester.live is None and not serving(port)
    assert values_of(g.tester.diagnostics())['foxglove'] == 'off'


def test_violation_followup_is_the_judged_follow_up_with_the_foxglove_overlay(graph):
    g = graph(violation_image_height=360, violation_pngs_per_search=1000)
    followups = TopicCollector(g.tester.context, 'violation_followup', Image, name='followup_sink')
    g.executor.add_node(followups)
    g.nodes.append(followups)
    g.wait(lambda: g.tester.violation_followup_pub.get_subscription_count() > 0, 5, 'the subscription')
    stamp = g.camera.publish(make_frame(160, 120, seed=5), 7_000_000_123)
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    stored = read_jsonl(g.results / 'violations.jsonl')
    assert stored and all(r['frame'] for r in stored)
    g.wait(lambda: len(followups.messages) == len(stored), 5, 'a follow-up image per violation')
    for record, msg in zip(stored, followups.messages, strict=True):
        assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == divmod(stamp, 10**9)
        assert msg.encoding == 'rgb8' and (msg.width, msg.height) == (480, 360)
        picture = image_msg_to_rgb(msg)
        followup = load_image(g.results / record['frame'])  # the pixels the model judged
        # The judged follow-up with this violation's overlay lines (the text Foxglove draws) on it.
        assert np.array_equal(picture, followup_overlay(followup, record, height=360))
        lines = overlay_lines(record)
        assert f'evaluation {record["index"]} of camera@{stamp}' in lines[0]
        assert record['composition'] in lines[1] and f'f_pred {record["f_pred"]:.4f}' in lines[2]
        assert lines[3].startswith('changed: ') and lines[3] != 'changed: -'
        # Drawn at the top; below the text, the frame scaled to the panel height, untouched.
        scaled = cv2.resize(followup, (480, 360), interpolation=cv2.INTER_AREA)
        assert not np.array_equal(picture[:20], scaled[:20])
        assert np.array_equal(picture[200:], scaled[200:])


def test_a_running_tester_node_is_watched_live_by_a_foxglove_client(tmp_path, tiny_clip_dir):
    results, port = tmp_path / 'results', free_port()
    parameters = {
        'autostart': 'true', 'vlm_endpoint': 'inprocess', 'model': str(tiny_clip_dir), 'device': 'cpu',
        'population': '6', 'evaluations': '18', 'frame_period_s': '0.0', 'transport_size': '48',
        'report_threshold': '0.01', 'results_dir': str(results), 'foxglove_port': str(port),
        'violation_pngs_per_search': '1',
    }  # fmt: skip
    command = [sys.executable, '-m', 'metavlm_ros.ros.tester_node', '--ros-args']
    for name, value in parameters.items():
        command += ['-p', f'{name}:={value}']
    env = {**os.environ, 'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'PYTHONUNBUFFERED': '1'}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outcome: dict = {}

    def searched_whole(received) -> bool:
        # A search's summary with violations (one kept PNG, one not): all of that search came before it.
        return any(m['violations'] >= 2 for _, m in received.get('/metavlm/summary', []))

    def client() -> None:
        try:
            outcome['received'] = asyncio.run(
                watch(port, searched_whole, timeout_s=120, alive=lambda: process.poll() is None)
            )
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread)
            outcome['error'] = exc

    viewer = threading.Thread(target=client, daemon=True)
    viewer.start()
    try:
        with ros_context() as context:
            camera = CameraPublisher(context)
            health = TopicCollector(context, '/diagnostics', DiagnosticArray, name='diagnostics_sink')
            executor = SingleThreadedExecutor(context=context)
            for node in (camera, health):
                executor.add_node(node)

            def viewers() -> int:
                for msg in reversed(health.messages):
                    for status in msg.status:
                        if status.name.startswith('metavlm_tester'):
                            return int(values_of(status)['foxglove_viewers'])
                return 0

            try:
                # The tester says when the viewer is subscribed: frames go out only then, so every
                # search is watched whole.
                wait_for(lambda: viewers() == 1, 120, executor, "the viewer's subscriptions on /diagnostics")
                seed = 0
                while viewer.is_alive():
                    camera.publish(make_frame(120, 90, seed=seed), 3_000_000_000 + seed * 10**9)
                    seed += 1
                    viewer.join(1.5)  # a search of the tiny model takes well under that
            finally:
                executor.shutdown(timeout_sec=2)
                for node in (camera, health):
                    node.destroy_node()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0]
        viewer.join(5)
    assert 'error' not in outcome, f'{outcome.get("error")}\n{output}'
    assert process.returncode == 0, output
    assert f'serving the searches live to Foxglove at ws://127.0.0.1:{port}' in output

    received = outcome['received']
    (_, summary), *_ = [(t, m) for t, m in received['/metavlm/summary'] if m['violations'] >= 2]
    key = (summary['image'], summary['seed'])
    stored = [r for r in read_jsonl(results / 'violations.jsonl') if (r['image'], r['seed']) == key]
    live = [(t, m) for t, m in received['/metavlm/violations'] if m['image'] == summary['image']]
    # Every violation the tester published for that search, as violations.jsonl holds it.
    assert [m['index'] for _, m in live] == [r['index'] for r in stored] and summary['violations'] == len(
        stored
    )
    stamp = stored[0]['source_stamp']
    assert {t for t, _ in live} == {stamp} and {m['stamp_ns'] for _, m in live} == {stamp}
    # Each with its follow-up and overlay at the source frame's time: the kept PNG where one was kept.
    notes = [(t, n) for t, n in received['/metavlm/followup/annotations'] if t == stamp]
    images = [(t, i) for t, i in received['/metavlm/followup/image'] if t == stamp]
    assert len(notes) == len(images) == len(stored)
    for record, (_, note), (_, image) in zip(stored, notes, images, strict=True):
        assert [t.text for t in note.texts] == overlay_lines(record)
        if record['frame']:  # kept: its PNG as written
            assert image.format == 'png' and image.data == (results / record['frame']).read_bytes()
        else:  # not kept: the judged pixels as JPEG (cheap for the search; the export renders the PNG)
            assert image.format == 'jpeg' and image.data.startswith(b'\xff\xd8')
    assert any(not r['frame'] for r in stored) and any(r['frame'] for r in stored)
    # The searched frame, as the tester stored it (sources/), once.
    sources = [s for t, s in received['/metavlm/source/image'] if t == stamp]
    (stored_summary,) = [s for s in read_jsonl(results / 'summary.jsonl') if (s['image'], s['seed']) == key]
    assert [s.data for s in sources] == [(results / stored_summary['source_frame']).read_bytes()]
