"""The probe endpoint against a scripted responder: stamp matching, retry, timeout, latency, transport."""

import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import Image

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction, VLMBackend
from metavlm_ros.ros.conversions import error_to_array, image_msg_to_rgb, prediction_to_array
from metavlm_ros.ros.probe_client import (
    PROBE_QOS,
    LatencyStats,
    ProbesReleased,
    RosProbeBackend,
    TransportSizeBackend,
)
from test.conftest import make_frame
from test.ros.helpers import ros_context


def mean_prediction(rgb: np.ndarray) -> Prediction:
    """What the scripted responder answers: the frame's channel means and its width."""
    return Prediction(
        kind='confidence',
        values={
            'red': float(rgb[..., 0].mean()),
            'green': float(rgb[..., 1].mean()),
            'width': float(rgb.shape[1]),
        },
    )


class Responder(Node):
    """Plays the perception node: answers probes, or ignores the first copy, or never, or late."""

    def __init__(self, context, mode: str = 'answer', delay_s: float = 0.0):
        super().__init__('scripted_perception', context=context)
        self.mode = mode
        self.delay_s = delay_s
        self.seen: list[int] = []
        self.pub = self.create_publisher(DiagnosticArray, 'probe/prediction', PROBE_QOS)
        self.subscription = self.create_subscription(Image, 'probe', self._on_probe, PROBE_QOS)
        self._answered_once: set[bytes] = set()
        self._delayed: list[threading.Timer] = []

    def _on_probe(self, msg: Image) -> None:
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        self.seen.append(stamp)
        if self.mode == 'silent':
            return
        if self.mode == 'refuse_narrow' and msg.width < 45:
            self.pub.publish(error_to_array(msg.header, 'scripted', f'unreadable frame: {msg.width} px'))
            return
        if self.mode == 'ignore_first':
            key = bytes(msg.data)
            if key not in self._answered_once:
                self._answered_once.add(key)  # the retry of this frame will be answered
                return
        reply = prediction_to_array(mean_prediction(image_msg_to_rgb(msg)), msg.header, 'scripted', 1.0)
        if self.delay_s:
            timer = threading.Timer(self.delay_s, self.pub.publish, args=(reply,))
            self._delayed.append(timer)
            timer.start()
        else:
            self.pub.publish(reply)

    def destroy_node(self) -> None:
        for timer in self._delayed:
            timer.cancel()
            timer.join()
        super().destroy_node()


@pytest.fixture
def graph():
    """A context with a tester-side node and an executor spinning in the background."""
    with ros_context() as context:
        client = Node('probe_client_test', context=context)
        executor = MultiThreadedExecutor(num_threads=3, context=context)
        executor.add_node(client)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        nodes = [client]

        def add(node: Node) -> Node:
            executor.add_node(node)
            nodes.append(node)
            return node

        yield context, client, add
        executor.shutdown(timeout_sec=2)
        for node in nodes:
            node.destroy_node()


def wait_matched(backend: RosProbeBackend, responder: Responder, timeout: float = 5.0) -> None:
    """Wait until the client and this responder see each other on both probe topics.

    Counts alone are not enough: a perception node killed by an earlier test stays in discovery
    until its lease runs out and counts as a subscriber of `probe`; probes sent before the
    responder itself is matched would be lost and sent again, which these tests count.
    """
    client = backend.node

    def ready() -> bool:
        readers = {i.node_name for i in client.get_subscriptions_info_by_topic('/probe')}
        writers = {i.node_name for i in client.get_publishers_info_by_topic('/probe/prediction')}
        return (
            backend.connected
            and responder.get_name() in readers
            and responder.get_name() in writers
            and responder.subscription.get_publisher_count() > 0
            and responder.pub.get_subscription_count() > 0
        )

    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready(), 'the responder never matched both probe topics'


def frames(n: int) -> list[np.ndarray]:
    return [make_frame(40 + 8 * i, 30, seed=i) for i in range(n)]


def test_replies_are_matched_to_their_frames_by_stamp(graph):
    context, client, add = graph
    responder = add(Responder(context))
    backend = RosProbeBackend(client, timeout_s=3.0)
    wait_matched(backend, responder)
    batch = frames(5)
    predictions = backend.predict(batch)
    # Frame i has width 40 + 8 i: each answer must be the one computed on its own frame.
    assert [p.values['width'] for p in predictions] == [40.0, 48.0, 56.0, 64.0, 72.0]
    for frame, prediction in zip(batch, predictions, strict=True):
        assert prediction.values['red'] == pytest.approx(float(frame[..., 0].mean()))
    assert backend.kind == 'confidence'
    assert backend.classes == ('red', 'green', 'width')
    assert backend.model_id == 'scripted'
    assert backend.sent == 5 and backend.answered == 5 and backend.lost == 0
    assert backend.answering
    assert len(backend.latency) == 5
    assert backend.latency.percentile_ms(50) > 0


def test_stamps_are_unique_even_within_one_nanosecond(graph):
    context, client, add = graph
    responder = add(Responder(context))
    backend = RosProbeBackend(client, timeout_s=3.0)
    wait_matched(backend, responder)
    backend.predict(frames(20))
    # Every probe sent (a rare retry on a loaded machine included) reached the responder, each
    # under its own stamp, in the order sent.
    assert backend.sent >= 20
    assert len(responder.seen) == backend.sent
    assert len(set(responder.seen)) == backend.sent
    assert responder.seen == sorted(responder.seen)


def test_a_missing_reply_is_asked_for_once_more(graph):
    context, client, add = graph
    responder = add(Responder(context, mode='ignore_first'))
    backend = RosProbeBackend(client, timeout_s=0.5)
    wait_matched(backend, responder)
    started = time.monotonic()
    predictions = backend.predict(frames(3))
    assert all(p is not None for p in predictions)
    assert [p.values['width'] for p in predictions] == [40.0, 48.0, 56.0]
    # Each frame went out twice (first copy ignored), under two distinct stamps.
    assert len(responder.seen) == 6 and len(set(responder.seen)) == 6
    assert backend.retried == 3
    assert 0.5 <= time.monotonic() - started < 2.0


def test_no_answer_gives_none_after_one_retry_and_never_hangs(graph):
    context, client, add = graph
    responder = add(Responder(context, mode='silent'))
    backend = RosProbeBackend(client, timeout_s=0.3)
    wait_matched(backend, responder)
    started = time.monotonic()
    assert backend.predict(frames(2)) == [None, None]
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 1.5  # timeout, one retry, timeout: then give up
    assert len(responder.seen) == 4
    assert backend.lost == 2
    assert backend.consecutive_failed_rounds == 1
    assert not backend.answering


def test_a_late_reply_to_the_first_copy_is_accepted(graph):
    context, client, add = graph
    responder = add(Responder(context, delay_s=0.45))
    backend = RosProbeBackend(client, timeout_s=0.3)
    wait_matched(backend, responder)
    predictions = backend.predict(frames(1))
    # The first copy's answer arrives during the retry's wait and is as good as the retry's.
    assert predictions[0] is not None and predictions[0].values['width'] == 40.0
    assert backend.consecutive_failed_rounds == 0


def test_no_perception_node_means_no_subscriber_and_none(graph):
    _, client, _ = graph
    backend = RosProbeBackend(client, timeout_s=0.1)
    assert backend.subscribers == 0 and not backend.connected
    assert backend.predict(frames(1)) == [None]
    assert not backend.answering


def test_a_probe_listener_that_cannot_answer_is_not_connected(graph):
    context, client, add = graph
    listener = add(Node('probe_listener', context=context))
    listener.create_subscription(Image, 'probe', lambda _msg: None, PROBE_QOS)
    backend = RosProbeBackend(client, timeout_s=0.1)
    deadline = time.monotonic() + 5.0
    while backend.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.subscribers == 1
    assert not backend.connected  # nothing publishes probe/prediction
    answerer = add(Node('answer_publisher', context=context))
    answerer.create_publisher(DiagnosticArray, 'probe/prediction', PROBE_QOS)
    while not backend.connected and time.monotonic() < deadline + 5.0:
        time.sleep(0.02)
    assert backend.connected


def test_release_wakes_a_waiting_caller(graph):
    context, client, add = graph
    responder = add(Responder(context, mode='silent'))
    backend = RosProbeBackend(client, timeout_s=30.0)
    wait_matched(backend, responder)
    result = {}

    def call():
        try:
            backend.predict(frames(1))
        except ProbesReleased as exc:
            result['raised'] = exc

    worker = threading.Thread(target=call)
    worker.start()
    deadline = time.monotonic() + 10.0  # the probe is out: the caller now waits for its answer
    while backend.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.sent == 1 and worker.is_alive()
    backend.release()
    worker.join(2.0)
    assert not worker.is_alive()
    # A shutdown is not a failure of the perception node: nothing is returned to be recorded as failed.
    assert isinstance(result['raised'], ProbesReleased)
    assert backend.lost == 0


def test_bad_settings_are_refused(graph):
    _, client, _ = graph
    with pytest.raises(ParameterError, match='probe_timeout_s'):
        RosProbeBackend(client, timeout_s=0)


class ShapeBackend(VLMBackend):
    kind = 'confidence'
    classes = ('h', 'w')
    model_id = 'shapes'
    name = 'shape'

    def __init__(self):
        self.seen = []

    def predict(self, frames):
        self.seen.extend(f.shape for f in frames)
        return [Prediction('confidence', {'h': f.shape[0], 'w': f.shape[1]}) for f in frames]


def test_transport_size_shrinks_the_longer_side_and_keeps_the_aspect():
    inner = ShapeBackend()
    backend = TransportSizeBackend(inner, 64)
    out = backend.predict([np.zeros((1080, 1920, 3), np.uint8), np.zeros((30, 40, 3), np.uint8)])
    # 1920x1080 -> 64 x round(1080 * 64 / 1920) = 64x36; small frames are never enlarged.
    assert inner.seen == [(36, 64, 3), (30, 40, 3)]
    assert out[0].values == {'h': 36, 'w': 64}
    assert (backend.kind, backend.classes, backend.model_id, backend.name) == (
        'confidence',
        ('h', 'w'),
        'shapes',
        'shape',
    )
    assert TransportSizeBackend(inner, 0).reduce(np.zeros((100, 200, 3), np.uint8)).shape == (100, 200, 3)
    with pytest.raises(ParameterError):
        TransportSizeBackend(inner, -1)


def test_latency_percentiles():
    stats = LatencyStats(window=4)
    assert np.isnan(stats.percentile_ms(50))
    for seconds in (0.010, 0.020, 0.030, 0.040, 0.050):
        stats.add(seconds)
    # The window keeps the last four: 20, 30, 40, 50 ms; median 35, p95 48.5 (linear interpolation).
    assert stats.percentile_ms(50) == pytest.approx(35.0)
    assert stats.percentile_ms(95) == pytest.approx(48.5)


def test_a_refused_frame_is_a_per_frame_error_at_once_without_a_retry(graph):
    context, client, add = graph
    responder = add(Responder(context, mode='refuse_narrow'))
    backend = RosProbeBackend(client, timeout_s=5.0)
    wait_matched(backend, responder)
    started = time.monotonic()
    predictions = backend.predict(frames(3))  # widths 40 (refused), 48, 56
    assert time.monotonic() - started < 2.0, 'an error answer must not be waited out like a lost one'
    assert predictions[0] is None
    assert [p.values['width'] for p in predictions[1:]] == [48.0, 56.0]
    assert backend.errors == {0: 'unreadable frame: 40 px'}
    assert len(responder.seen) == 3 and backend.retried == 0
    assert backend.refused == 1 and backend.lost == 0
    assert backend.answering  # a refusal is an answer: the perception node is there
