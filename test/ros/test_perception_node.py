"""The perception node with a tiny CLIP in this process: camera predictions, micro-batched probes,
parameters refused at run time, garbage frames survived, clean shutdown."""

import threading
import time

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rcl_interfaces.srv import SetParameters
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.models.vlm import DEFAULT_BATCH_SIZE, create_backend
from metavlm_ros.ros.conversions import (
    array_to_prediction,
    image_msg_to_rgb,
    latency_of,
    refusal_of,
    stamp_to_ns,
)
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.perception_node import PROBE_QOS, PerceptionNode, main
from metavlm_ros.ros.probe_client import RosProbeBackend
from test.conftest import make_frame
from test.ros.helpers import CameraPublisher, TopicCollector, ros_context, wait_for

CLASSES = ['animal', 'vegetation', 'object', 'trash']


class CountingBackend(VLMBackend):
    """Delegates to a real backend and records every batch it is given (optionally blocking)."""

    def __init__(self, inner: VLMBackend, gate: threading.Event | None = None) -> None:
        self.inner = inner
        self.kind, self.classes, self.model_id, self.name = (
            inner.kind,
            inner.classes,
            inner.model_id,
            inner.name,
        )
        self.batches: list[int] = []
        self.entered = threading.Event()
        self.gate = gate

    def predict(self, frames):
        self.batches.append(len(frames))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        return self.inner.predict(frames)


@pytest.fixture(scope='module')
def clip(tiny_clip_dir):
    return create_backend('clip', str(tiny_clip_dir), device='cpu')


def overrides(tiny_clip_dir, **extra):
    values = {'model': str(tiny_clip_dir), 'device': 'cpu', **extra}
    return [Parameter(name, value=value) for name, value in values.items()]


def test_camera_frames_get_predictions_with_the_design_fields(tiny_clip_dir, clip):
    frame = make_frame(64, 48, seed=3)
    expected = clip.predict([frame])[0]
    with ros_context() as context:
        node = PerceptionNode(context=context, parameter_overrides=overrides(tiny_clip_dir))
        bring_up(node)
        camera = CameraPublisher(context)
        results = TopicCollector(context, 'prediction', DiagnosticArray)
        nodes = [node, camera, results]
        worker = node._worker
        try:
            wait_for(lambda: node.count_publishers('image') > 0, 5, nodes, 'camera discovery')
            wait_for(lambda: node.prediction_pub.get_subscription_count() > 0, 5, nodes, 'the collector')
            stamp = None

            # Sensor-data QoS is best effort: keep publishing the same frame until one is judged.
            def judged() -> bool:
                nonlocal stamp
                if not results.messages:
                    stamp = camera.publish(frame, 7_000_000_123)
                return bool(results.messages)

            wait_for(judged, 20, nodes, 'a prediction for the camera frame')
            msg = results.messages[0]
            assert stamp_to_ns(msg.header.stamp) == 7_000_000_123
            assert msg.header.frame_id == 'camera'
            (status,) = msg.status
            assert status.name == 'metavlm/prediction'
            assert status.hardware_id == str(tiny_clip_dir)
            assert [kv.key for kv in status.values] == [*CLASSES, 'latency_ms', 'kind']
            assert latency_of(msg) >= 0.0
            prediction = array_to_prediction(msg)
            assert prediction.kind == 'confidence'
            for cls in CLASSES:
                assert prediction.values[cls] == pytest.approx(expected.values[cls], abs=1e-5)
            assert status.message.startswith('animal ')
            assert node.counters.predictions >= 1
        finally:
            for n in nodes:
                n.destroy_node()
        assert not worker.is_alive()


def test_probes_are_micro_batched_and_answered_with_their_stamps(tiny_clip_dir, clip):
    frames = [make_frame(40, 30, seed=s) for s in range(8)]
    expected = clip.predict(frames)
    with ros_context() as context:
        counting = CountingBackend(clip)
        node = PerceptionNode(
            context=context,
            backend=counting,
            parameter_overrides=overrides(tiny_clip_dir, max_batch=16, batch_wait_ms=300),
        )
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        replies = TopicCollector(context, 'probe/prediction', DiagnosticArray, PROBE_QOS)
        nodes = [node, tester, replies]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            wait_for(lambda: node.probe_prediction_pub.get_subscription_count() > 0, 5, nodes)
            stamps = [tester.publish(f, 1_000 + i) for i, f in enumerate(frames)]
            wait_for(lambda: len(replies.messages) == len(frames), 20, nodes, 'all probe replies')
            by_stamp = {stamp_to_ns(m.header.stamp): array_to_prediction(m) for m in replies.messages}
            assert sorted(by_stamp) == stamps
            for stamp, want in zip(stamps, expected, strict=True):
                for cls in CLASSES:
                    assert by_stamp[stamp].values[cls] == pytest.approx(want.values[cls], abs=1e-5)
            assert sum(counting.batches) == len(frames)
            assert len(counting.batches) < len(frames)  # fewer model calls than probes
            assert node.counters.probes_answered == len(frames)

            # A smaller max_batch, set at run time, caps the batches.
            assert node.set_parameters([Parameter('max_batch', value=3)])[0].successful
            counting.batches.clear()
            replies.messages.clear()
            for i, f in enumerate(frames):
                tester.publish(f, 5_000 + i)
            wait_for(lambda: len(replies.messages) == len(frames), 20, nodes, 'replies after max_batch=3')
            assert max(counting.batches) <= 3 and sum(counting.batches) == len(frames)
        finally:
            for n in nodes:
                n.destroy_node()


def test_latest_camera_frame_wins_while_the_model_is_busy(tiny_clip_dir, clip):
    gate = threading.Event()
    blocking = CountingBackend(clip, gate)
    with ros_context() as context:
        node = PerceptionNode(context=context, backend=blocking, parameter_overrides=overrides(tiny_clip_dir))
        bring_up(node)
        camera = CameraPublisher(context)
        results = TopicCollector(context, 'prediction', DiagnosticArray)
        nodes = [node, camera, results]
        try:
            wait_for(lambda: camera.publisher.get_subscription_count() > 0, 5, nodes, 'camera subscriber')
            wait_for(lambda: node.prediction_pub.get_subscription_count() > 0, 5, nodes, 'the collector')
            frame = make_frame(32, 24)

            def first_in_model() -> bool:
                if node.counters.camera_frames == 0:
                    camera.publish(frame, 1)
                return blocking.entered.is_set()

            wait_for(first_in_model, 10, nodes, 'the first frame to reach the model')
            for stamp in (2, 3, 4):
                camera.publish(frame, stamp)
            wait_for(lambda: node.counters.camera_frames >= 4, 5, nodes, 'three more frames')
            gate.set()
            wait_for(lambda: len(results.messages) == 2, 10, nodes, 'two predictions')
            assert [stamp_to_ns(m.header.stamp) for m in results.messages] == [1, 4]
            assert node.counters.camera_frames_replaced == 2
            assert blocking.batches == [1, 1]
        finally:
            gate.set()
            for n in nodes:
                n.destroy_node()


class FailingBackend(VLMBackend):
    kind, classes, model_id, name = 'confidence', tuple(CLASSES), 'broken', 'clip'

    def predict(self, frames):
        raise RuntimeError('CUDA out of memory')


def test_a_failing_model_call_is_counted_and_the_node_goes_on(tiny_clip_dir):
    with ros_context() as context:
        node = PerceptionNode(
            context=context, backend=FailingBackend(), parameter_overrides=overrides(tiny_clip_dir)
        )
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        nodes = [node, tester]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            tester.publish(make_frame(32, 24))
            wait_for(lambda: node.counters.inference_failures == 1, 10, nodes, 'the failed model call')
            tester.publish(make_frame(32, 24))
            wait_for(lambda: node.counters.inference_failures == 2, 10, nodes, 'a second model call')
            assert node._worker.is_alive() and node.counters.probes_answered == 0
        finally:
            for n in nodes:
                n.destroy_node()


def test_parameters_are_refused_at_run_time_with_a_reason(tiny_clip_dir, clip):
    with ros_context() as context:
        node = PerceptionNode(context=context, backend=clip, parameter_overrides=overrides(tiny_clip_dir))
        bring_up(node)
        try:
            (result,) = node.set_parameters([Parameter('max_batch', value=0)])
            assert not result.successful and 'max_batch' in result.reason
            (result,) = node.set_parameters([Parameter('batch_wait_ms', value=1001)])
            assert not result.successful and 'batch_wait_ms' in result.reason
            (result,) = node.set_parameters([Parameter('backend', value='blip')])
            assert not result.successful and 'read-only' in result.reason
            assert node.get_parameter('max_batch').value == DEFAULT_BATCH_SIZE
            # an empty string array is a real, typed, read-only value (not an unset parameter)
            assert node.get_parameter('class_prompts').value == []
            assert node.get_parameter('class_prompts').type_ == Parameter.Type.STRING_ARRAY
            (result,) = node.set_parameters([Parameter('class_prompts', value=['a fish'])])
            assert not result.successful and 'read-only' in result.reason
            (result,) = node.set_parameters([Parameter('batch_wait_ms', value=40)])
            assert result.successful and node._batch_wait_s == pytest.approx(0.040)
        finally:
            node.destroy_node()


def test_parameter_service_answers_while_the_model_is_busy(tiny_clip_dir, clip):
    gate = threading.Event()
    blocking = CountingBackend(clip, gate)
    with ros_context() as context:
        node = PerceptionNode(context=context, backend=blocking, parameter_overrides=overrides(tiny_clip_dir))
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        client = tester.create_client(SetParameters, '/metavlm_perception/set_parameters')
        nodes = [node, tester]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            tester.publish(make_frame(32, 24))
            wait_for(blocking.entered.is_set, 10, nodes, 'the model call to start')
            wait_for(client.service_is_ready, 5, nodes, 'the parameter service')
            request = SetParameters.Request(parameters=[Parameter('max_batch', value=0).to_parameter_msg()])
            future = client.call_async(request)
            wait_for(future.done, 5, nodes, 'the parameter service reply while the model is busy')
            (result,) = future.result().results
            assert not result.successful and 'max_batch' in result.reason
            assert not gate.is_set()  # the model was still busy when the service answered
        finally:
            gate.set()
            for n in nodes:
                n.destroy_node()


def test_garbage_frames_are_counted_and_the_node_goes_on(tiny_clip_dir, clip):
    with ros_context() as context:
        node = PerceptionNode(
            context=context, backend=clip, parameter_overrides=overrides(tiny_clip_dir, batch_wait_ms=0)
        )
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        replies = TopicCollector(context, 'probe/prediction', DiagnosticArray, PROBE_QOS)
        nodes = [node, tester, replies]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            wait_for(lambda: node.probe_prediction_pub.get_subscription_count() > 0, 5, nodes)
            garbage = Image(height=10, width=10, encoding='rgb8', step=30)
            garbage.data = bytes(7)  # step*height is 300
            tester.publish_msg(garbage)
            odd = Image(height=2, width=2, encoding='weird', step=6)
            odd.data = bytes(12)
            tester.publish_msg(odd)
            good = tester.publish(make_frame(32, 24), 42)
            wait_for(lambda: len(replies.messages) == 3, 20, nodes, 'the replies (two of them errors)')
            answers = [m for m in replies.messages if refusal_of(m) is None]
            assert [stamp_to_ns(m.header.stamp) for m in answers] == [good]
            assert node.counters.conversion_failures == 2
            assert node._worker.is_alive()
        finally:
            for n in nodes:
                n.destroy_node()


def test_compressed_transport_subscribes_image_compressed(tiny_clip_dir, clip):
    with ros_context() as context:
        node = PerceptionNode(
            context=context,
            backend=clip,
            parameter_overrides=overrides(tiny_clip_dir, image_transport='compressed'),
        )
        bring_up(node)
        camera = CameraPublisher(context, compressed=True)
        results = TopicCollector(context, 'prediction', DiagnosticArray)
        nodes = [node, camera, results]
        try:
            assert camera.topic == 'image/compressed'
            frame = make_frame(32, 24, seed=5)

            def judged() -> bool:
                if not results.messages:
                    camera.publish(frame, 99)
                return bool(results.messages)

            wait_for(judged, 20, nodes, 'a prediction for the compressed frame')
            assert stamp_to_ns(results.messages[0].header.stamp) == 99
            assert array_to_prediction(results.messages[0]).kind == 'confidence'
            # the PNG round trip is lossless
            np.testing.assert_array_equal(image_msg_to_rgb(camera.message(frame, 0)), frame)
        finally:
            for n in nodes:
                n.destroy_node()


@pytest.mark.parametrize(
    ('extra', 'reason'),
    [
        ({'max_batch': 0}, 'max_batch'),
        ({'backend': 'yolo'}, 'backend'),
        ({'confidence': 'logits'}, 'confidence'),
        ({'classes': ['fish', 'fish']}, 'distinct'),
        ({'classes': ['fish', 'kind']}, 'reserved'),
        ({'class_prompts': ['a fish', 'a plant']}, '2 prompts for 4 classes'),
        ({'max_batch': 'many'}, 'max_batch'),
    ],
)
def test_bad_start_parameters_raise_parameter_error(tiny_clip_dir, extra, reason):
    with ros_context() as context:
        with pytest.raises(ParameterError, match=reason):
            PerceptionNode(context=context, parameter_overrides=overrides(tiny_clip_dir, **extra))


def test_class_prompts_reach_the_backend(tiny_clip_dir):
    prompts = ['a fish', '', 'a pipe', '']
    with ros_context() as context:
        node = PerceptionNode(
            context=context, parameter_overrides=overrides(tiny_clip_dir, class_prompts=prompts)
        )
        bring_up(node)
        try:
            assert node.backend.class_prompts['animal'] == 'a fish'
            assert node.backend.class_prompts['object'] == 'a pipe'
            assert node.backend.class_prompts['trash'] == 'a photo of trash underwater'
        finally:
            node.destroy_node()


def test_main_exits_1_with_a_one_line_error(capsys):
    assert main(['--ros-args', '-p', 'max_batch:=0']) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm_perception: error: parameter max_batch') and '\n' not in err


# -- metavlm_ros.ros.parameters, on a plain node --------------------------------------------------


def test_parameter_rules_declare_check_and_notify():
    from rclpy.node import Node

    from metavlm_ros.ros.parameters import ParameterRules, in_range, one_of

    assert one_of('a', 'b')('a') is None and 'not one of a, b' in one_of('a', 'b')('c')
    assert in_range(0.0, 1.0)([0.0, 1.0]) is None and '1.5 is outside [0.0, 1.0]' in in_range(0.0, 1.0)(
        [0.5, 1.5]
    )
    seen = []
    with ros_context(['--ros-args', '-p', 'gain:=0.25', '-p', 'names:=[alpha, beta]']) as context:
        node = Node('rules_test', context=context)
        try:
            rules = ParameterRules(node)
            assert rules.declare('gain', 0.5, 'a gain', low=0.0, high=1.0, on_change=seen.append) == 0.25
            desc = node.describe_parameter('gain')
            assert desc.description == 'a gain' and desc.floating_point_range[0].to_value == 1.0
            assert rules.declare('names', [], 'names', array_type=Parameter.Type.STRING_ARRAY) == [
                'alpha',
                'beta',
            ]
            assert rules.declare('mode', 'fast', 'mode', choices=('fast', 'slow')) == 'fast'
            assert node.describe_parameter('mode').additional_constraints == 'one of: fast, slow'
            (result,) = node.set_parameters([Parameter('gain', value=2.0)])
            assert not result.successful and 'out of range' in result.reason
            (result,) = node.set_parameters([Parameter('mode', value='medium')])
            assert not result.successful and result.reason == "mode: 'medium' is not one of fast, slow"
            assert seen == []  # refused changes reach no listener
            assert node.set_parameters([Parameter('gain', value=0.75)])[0].successful
            assert seen == [0.75] and rules.value('gain') == 0.75
            with pytest.raises(ParameterError, match='parameter size: .*outside'):
                rules.declare('size', 5, 'size', check=in_range(10, 20))
        finally:
            node.destroy_node()


def _malformed_probes():
    bad_encoding = Image(height=2, width=2, encoding='weird', step=6)
    bad_encoding.data = bytes(12)
    bad_length = Image(height=10, width=10, encoding='rgb8', step=30)
    bad_length.data = bytes(7)  # step*height is 300
    zero_size = Image(height=0, width=0, encoding='rgb8', step=0)
    out = []
    for i, (msg, words) in enumerate(
        [(bad_encoding, "encoding 'weird'"), (bad_length, '7 bytes'), (zero_size, 'empty image')]
    ):
        msg.header.stamp.sec, msg.header.stamp.nanosec = 100 + i, 7
        msg.header.frame_id = 'metavlm_probe'
        out.append((msg, words))
    return out


def test_malformed_probes_get_an_error_answer_and_diagnostics_count_them(tiny_clip_dir, clip):
    with ros_context() as context:
        node = PerceptionNode(
            context=context, backend=clip, parameter_overrides=overrides(tiny_clip_dir, batch_wait_ms=0)
        )
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        replies = TopicCollector(context, 'probe/prediction', DiagnosticArray, PROBE_QOS)
        health = TopicCollector(context, '/diagnostics', DiagnosticArray, name='health_sink')
        nodes = [node, tester, replies, health]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            wait_for(lambda: node.probe_prediction_pub.get_subscription_count() > 0, 5, nodes)
            malformed = _malformed_probes()
            for msg, _words in malformed:
                tester.publish_msg(msg)
            good = tester.publish(make_frame(32, 24), 42)
            wait_for(lambda: len(replies.messages) == 4, 20, nodes, 'an answer to every probe')
            by_stamp = {stamp_to_ns(m.header.stamp): m for m in replies.messages}
            for msg, words in malformed:
                answer = by_stamp[stamp_to_ns(msg.header.stamp)]
                assert answer.header.frame_id == 'metavlm_probe'
                (status,) = answer.status
                assert status.level == DiagnosticStatus.ERROR
                assert status.name == 'metavlm/prediction'
                assert status.message.startswith('unreadable frame:') and words in status.message
                assert refusal_of(answer) == status.message
                with pytest.raises(InputError, match='not judged'):
                    array_to_prediction(answer)
            assert array_to_prediction(by_stamp[good]).kind == 'confidence'
            assert node.counters.probes_refused == 3 and node.counters.probes_answered == 1

            def reported():
                mine = [s for m in health.messages for s in m.status if s.name == 'metavlm_perception: model']
                return mine and {kv.key: kv.value for kv in mine[-1].values}.get('probes_refused') == '3'

            wait_for(reported, 5, nodes, "the perception node's /diagnostics")
            status = [s for m in health.messages for s in m.status if s.hardware_id == clip.model_id][-1]
            kv = {item.key: item.value for item in status.values}
            assert kv['probes_answered'] == '1' and kv['frames_unreadable'] == '3'
            assert float(kv['latency_p50_ms']) > 0
            assert status.hardware_id == clip.model_id
        finally:
            for n in nodes:
                n.destroy_node()


def test_a_failing_model_answers_the_probe_client_with_the_reason_at_once(tiny_clip_dir):
    with ros_context() as context:
        node = PerceptionNode(
            context=context, backend=FailingBackend(), parameter_overrides=overrides(tiny_clip_dir)
        )
        bring_up(node)
        client_node = rclpy.create_node('probe_client', context=context)
        client = RosProbeBackend(client_node, timeout_s=10.0)
        executor = MultiThreadedExecutor(num_threads=3, context=context)
        for n in (node, client_node):
            executor.add_node(n)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            deadline = time.monotonic() + 5
            while not client.connected and time.monotonic() < deadline:
                time.sleep(0.02)
            started = time.monotonic()
            assert client.predict([make_frame(32, 24)]) == [None]
            assert time.monotonic() - started < 5.0, 'the error answer ends the wait, not the 10 s timeout'
            assert client.errors[0].startswith('model failed:')
            assert client.retried == 0 and client.lost == 0
        finally:
            executor.shutdown(timeout_sec=2)
            for n in (node, client_node):
                n.destroy_node()


def test_a_flood_of_malformed_probes_gets_every_answer_but_few_warnings(tiny_clip_dir, clip, capfd):
    with ros_context() as context:
        node = PerceptionNode(
            context=context, backend=clip, parameter_overrides=overrides(tiny_clip_dir, batch_wait_ms=0)
        )
        bring_up(node)
        tester = CameraPublisher(context, 'probe', qos=PROBE_QOS, name='test_tester')
        replies = TopicCollector(context, 'probe/prediction', DiagnosticArray, PROBE_QOS)
        nodes = [node, tester, replies]
        try:
            wait_for(lambda: tester.publisher.get_subscription_count() > 0, 5, nodes, 'probe subscriber')
            wait_for(lambda: node.probe_prediction_pub.get_subscription_count() > 0, 5, nodes)
            capfd.readouterr()
            for i in range(30):
                bad = Image(height=4, width=4, encoding='rgb8', step=12)
                bad.data = bytes(5)
                bad.header.stamp.sec = 200 + i
                tester.publish_msg(bad)
            wait_for(lambda: len(replies.messages) == 30, 20, nodes, 'an error answer to each probe')
            assert all(refusal_of(m) for m in replies.messages)
            warnings = capfd.readouterr().err.count('probe skipped')
            assert 1 <= warnings <= 3, f'{warnings} warnings for 30 bad probes: throttled to one per 5 s'
        finally:
            for n in nodes:
                n.destroy_node()
