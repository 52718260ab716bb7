"""Detections on ROS: the perception node's `detections` (vision_msgs, read back by a subscriber), the
boxes through the probe round trip, a node without vision_msgs, and a tester that publishes box
violations. One perception graph is shared by the module's tests (a stand-in detector, no model)."""

import json
import threading
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from vision_msgs.msg import Detection2DArray

from metavlm_ros.common.errors import InputError
from metavlm_ros.common.results import VIOLATIONS, ResultsStore, read_jsonl
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.ros import perception_node
from metavlm_ros.ros.conversions import (
    array_to_prediction,
    detection_array_to_detections,
    detections_from_json,
    frame_and_scale,
    image_msg_to_rgb,
    rgb_to_image_msg,
    stamp_to_ns,
)
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.perception_node import PerceptionNode
from metavlm_ros.ros.probe_client import RosProbeBackend, TransportSizeBackend
from metavlm_ros.ros.tester_boxes import BOXES_STATUS, CHANGES
from metavlm_ros.viewer.boxes import ROLE_RGBA
from metavlm_ros.viewer.export import export_mcap
from test.fakes import ThresholdDetector
from test.method.test_detection_search import _scene
from test.ros.helpers import CameraPublisher, TopicCollector, ros_context
from test.ros.tester_graph import values_of
from test.viewer.mcap_decode import read_mcap


def until(predicate, timeout: float, what: str) -> None:
    """Wait (the graph spins in the background) until `predicate()`; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout:g} s waiting for {what}')
        time.sleep(0.02)


def same_boxes(found, expected) -> None:
    assert [(d.cls, d.score) for d in found] == [(d.cls, pytest.approx(d.score)) for d in expected]
    for got, want in zip(found, expected, strict=True):
        assert got.box == pytest.approx(want.box, abs=1e-6)


class Perception:
    """A perception node on the stand-in detector, a camera, collectors and a probe client, spun in
    the background."""

    def __init__(self, context):
        self.detector = ThresholdDetector()
        self.node = PerceptionNode(context=context, backend=self.detector)
        bring_up(self.node)
        self.camera = CameraPublisher(context, frame_id='camera_optical')
        self.detections = TopicCollector(context, 'detections', Detection2DArray, name='detections_sink')
        self.predictions = TopicCollector(context, 'prediction', DiagnosticArray, name='prediction_sink')
        self.client = Node('probe_client_test', context=context)
        self.probe = RosProbeBackend(self.client, timeout_s=5.0, retries=0)
        self.nodes = [self.node, self.camera, self.detections, self.predictions, self.client]
        self.executor = MultiThreadedExecutor(num_threads=3, context=context)
        for node in self.nodes:
            self.executor.add_node(node)
        self.spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinner.start()
        until(lambda: self.camera.publisher.get_subscription_count() > 0, 5, 'the camera subscription')
        until(lambda: self.detections.count_publishers('detections') > 0, 5, 'the detections publisher')
        until(lambda: self.probe.connected, 5, 'the probe topics')

    def close(self):
        self.probe.close()
        self.executor.shutdown(timeout_sec=2)
        for node in self.nodes:
            node.destroy_node()


@pytest.fixture(scope='module')
def perception():
    with ros_context() as context:
        graph = Perception(context)
        yield graph
        graph.close()


def test_camera_frames_get_their_boxes_on_detections_as_detection2darray(perception):
    frame = _scene(160, 120)
    (answer,) = ThresholdDetector().predict([frame])
    assert len(answer.detections) == 4
    stamp = perception.camera.publish(frame, 5_000_000_123)
    until(lambda: perception.detections.messages, 10, 'a Detection2DArray')
    (msg,) = perception.detections.messages
    assert stamp_to_ns(msg.header.stamp) == stamp and msg.header.frame_id == 'camera_optical'
    same_boxes(detection_array_to_detections(msg), answer.detections)
    first = msg.detections[0]
    x1, y1, x2, y2 = answer.detections[0].box
    assert (first.bbox.center.position.x, first.bbox.size_x) == pytest.approx(((x1 + x2) / 2, x2 - x1))
    assert first.results[0].hypothesis.class_id == answer.detections[0].cls
    assert stamp_to_ns(first.header.stamp) == stamp
    # `prediction` as before, its boxes in a value of their own.
    until(lambda: perception.predictions.messages, 5, 'the prediction')
    read = array_to_prediction(perception.predictions.messages[-1])
    assert read.kind == 'detection' and read.values == answer.values
    same_boxes(read.detections, answer.detections)


def test_the_probe_round_trip_gives_the_tester_the_same_boxes_in_the_frame_it_sent(perception):
    frames = [_scene(160, 120), _scene(96, 72)]
    answers = ThresholdDetector().predict(frames)
    replies = perception.probe.predict(frames)
    for reply, answer in zip(replies, answers, strict=True):
        assert isinstance(reply, Prediction) and reply.kind == 'detection'
        assert reply.values == answer.values
        same_boxes(reply.detections, answer.detections)
    assert perception.probe.kind == 'detection'
    # Through a transport size the model sees half the pixels; the boxes come back in the frame's own.
    shrunk = TransportSizeBackend(perception.probe, 80)
    (reply,) = shrunk.predict([frames[0]])
    (small,) = ThresholdDetector().predict([shrunk.reduce(frames[0])])
    same_boxes(reply.detections, [d.scaled(2.0, 2.0) for d in small.detections])
    # Probes are the tester's altered frames: nothing of theirs goes out on `detections`.
    assert len(perception.detections.messages) <= 1


class _Logger:
    def __init__(self, inner):
        self.inner, self.warnings = inner, []

    def warning(self, text, **kwargs):
        self.warnings.append(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_without_vision_msgs_the_node_says_so_once_and_goes_on(perception, monkeypatch):
    monkeypatch.setattr(perception_node, 'detection_array_type', lambda: None)
    node = PerceptionNode(context=perception.node.context, backend=ThresholdDetector(), namespace='pip_only')
    logger = _Logger(node.get_logger())
    node.get_logger = lambda: logger
    try:
        for _ in range(2):  # configured, cleaned up, configured again: said once
            bring_up(node)
            assert node.detections_pub is None and node.prediction_pub is not None
            node.trigger_deactivate()
            node.trigger_cleanup()
        assert len([w for w in logger.warnings if 'vision_msgs' in w]) == 1
        assert node.count_publishers('/pip_only/detections') == 0
    finally:
        node.destroy_node()


def test_boxes_are_in_the_pixels_of_the_image_received_and_malformed_ones_are_refused():
    msg = rgb_to_image_msg(_scene(320, 240), 1)
    frame, scale = frame_and_scale(msg, max_side=80)
    assert frame.shape == (60, 80, 3) and scale == (4.0, 4.0)
    (small,) = ThresholdDetector().predict([frame])
    moved = small.scaled(*scale)
    assert moved.detections[0].box == pytest.approx([4 * v for v in small.detections[0].box])
    assert small.scaled(1.0, 1.0) is small
    with pytest.raises(InputError, match='unreadable detections'):
        detections_from_json('[{"class": "trash"}]')
    with pytest.raises(InputError, match='finite box'):
        detections_from_json('[{"class": "trash", "score": 0.5, "box": [1, 2, NaN, 4]}]')


def test_a_tester_on_a_detector_publishes_violations_with_their_boxes_and_draws_them(graph):
    g = graph(
        backend=ThresholdDetector(),
        relations=['rotation', 'translation', 'turbidity'],
        seed=3,
        population=8,
        evaluations=24,
    )
    frame = _scene(160, 120)
    g.camera.publish(frame)
    g.wait(lambda: g.violations.messages and g.images.messages, 30, 'a box violation and its image')
    status = g.violations.messages[0].status[0]
    values = values_of(status)
    boxes, found = json.loads(values['boxes']), json.loads(values['followup_detections'])
    # The camera frame's pixels, as the records hold them; the match says what went wrong.
    (record,) = [
        r
        for r in read_jsonl(g.results / VIOLATIONS)
        if (r['composition'], repr(float(r['f_pred']))) == (values['composition'], values['f_pred'])
    ][:1]
    assert boxes == record['boxes'] and found == record['followup_detections']
    assert boxes['lost'] or boxes['new'] or boxes['reclassed'] or boxes['displaced']
    assert {e['class'] for e in boxes['expected']} <= {'animal', 'vegetation', 'object', 'trash'}
    # The picture draws them: the follow-up panel holds the colours of expected and found boxes.
    image = image_msg_to_rgb(g.images.messages[0])
    colours = {
        tuple(round(255 * c) for c in ROLE_RGBA[role][:3]) for role in ('expected', 'found', 'lost', 'new')
    }
    pixels = {tuple(int(v) for v in p) for p in image.reshape(-1, 3)}
    assert len(colours & pixels) >= 2
    # /diagnostics adds up the search's box figures beside the tester's health, as its records hold them.
    g.wait(lambda: g.tester.searches_done == 1, 30, 'the search to end')
    records = read_jsonl(g.results / 'evaluations.jsonl')
    judged = [r['boxes'] | {'violation': r['violation']} for r in records if r['boxes'] is not None]

    def boxes_status():
        statuses = [s for a in g.diagnostics.messages for s in a.status if s.name == BOXES_STATUS]
        done = [s for s in statuses if values_of(s)['evaluations_judged'] == str(len(judged))]
        return done[0] if done else None

    g.wait(lambda: boxes_status() is not None, 5, 'the box figures of the whole search on /diagnostics')
    status = boxes_status()
    figures = values_of(status)
    assert status.level == DiagnosticStatus.WARN and figures['iou_threshold'] == '0.5'
    assert {c: int(figures[c]) for c in CHANGES} == {c: sum(len(r[c]) for r in judged) for c in CHANGES}
    assert int(figures['evaluations_violating']) == sum(any(r['violation'].values()) for r in judged) > 0
    assert int(figures['objects_expected']) == sum(e['required'] for r in judged for e in r['expected'])
    assert 0 < float(figures['matched_iou_p10']) <= float(figures['matched_iou_p50']) <= 1


def test_the_export_of_a_detection_search_draws_its_boxes_as_image_annotations(tmp_path):
    space = SearchSpace.from_options(['rotation', 'scaling', 'translation', 'turbidity'])
    config = SearchConfig(
        algorithm='nsga2', population=8, evaluations=48, seed=3, working_size=160, space=space
    )
    with ResultsStore(tmp_path / 'res') as store:
        run_search(_scene(320, 240), ThresholdDetector(), config, image_id='scene', store=store)
    export_mcap(tmp_path / 'res', tmp_path / 'run.mcap')
    topics = read_mcap(tmp_path / 'run.mcap')['topics']
    records = [r for _, r, _ in topics['/metavlm/violations']]
    assert records and all(r['kind'] == 'detection' and r['changed'] for r in records)
    annotations = [a for _, a, _ in topics['/metavlm/followup/annotations']]
    assert len(annotations) == len(records)
    for record, annotation in zip(records, annotations, strict=True):
        drawn = len(record['boxes']['expected']) + len(record['followup_detections'])
        assert len(annotation.points) == drawn and all(len(p.points) == 4 for p in annotation.points)
        # Source-frame boxes (320 wide) on the 160-wide follow-up: halved.
        if record['followup_detections']:
            x1, y1, x2, y2 = record['followup_detections'][0]['box']
            corners = annotation.points[len(record['boxes']['expected'])].points
            assert (corners[0].x, corners[2].y) == pytest.approx((x1 / 2, y2 / 2))
        assert any(t.text.startswith(('lost ', 'new ')) or '(' in t.text for t in annotation.texts)
