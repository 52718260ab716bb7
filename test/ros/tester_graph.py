"""The tester tests' graph: a tester node, a stand-in model, a test camera and collectors of its outputs."""

import threading

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from metavlm_ros.method.prediction import Prediction, VLMBackend
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from test.ros.helpers import CameraPublisher, TopicCollector, wait_for


class StatsBackend(VLMBackend):
    """A cheap confidence-type stand-in: black fraction, mean green, mean red, grey contrast."""

    kind = 'confidence'
    classes = ('animal', 'vegetation', 'object', 'trash')
    model_id = 'stats'
    name = 'stats'

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.entered = threading.Event()
        self.calls = 0
        self.shapes: list[tuple[int, ...]] = []

    def predict(self, frames):
        self.calls += 1
        self.shapes.extend(f.shape for f in frames)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(20)
        out = []
        for frame in frames:
            f = frame.astype(np.float64) / 255.0
            out.append(
                Prediction(
                    'confidence',
                    {
                        'animal': float(np.mean(np.all(frame == 0, axis=2))),
                        'vegetation': float(f[..., 1].mean()),
                        'object': float(f[..., 0].mean()),
                        'trash': float(f.mean(axis=2).std()),
                    },
                )
            )
        return out


def params(**values):
    base = {
        'vlm_endpoint': 'inprocess',
        'population': 6,
        'evaluations': 18,
        'frame_period_s': 0.0,
        'transport_size': 0,
        'report_threshold': 0.01,
    }
    base.update(values)
    return [Parameter(k, value=v) for k, v in base.items()]


class Graph:
    """A tester (stand-in model), a test camera and collectors of its three output topics."""

    def __init__(self, context, tmp_path, backend=None, start=True, **values):
        self.backend = backend or StatsBackend()
        self.tester = MetaVLMTester(
            context=context,
            backend=self.backend,
            parameter_overrides=params(results_dir=str(tmp_path / 'results'), **values),
        )
        if start:
            bring_up(self.tester)
        compressed = values.get('image_transport') == 'compressed'
        self.camera = CameraPublisher(context, compressed=compressed)
        self.violations = TopicCollector(context, 'violations', DiagnosticArray, name='violations_sink')
        self.images = TopicCollector(context, 'violation_image', Image, name='images_sink')
        self.diagnostics = TopicCollector(context, '/diagnostics', DiagnosticArray, name='diagnostics_sink')
        self.nodes = [self.tester, self.camera, self.violations, self.images, self.diagnostics]
        self.executor = SingleThreadedExecutor(context=context)
        for node in self.nodes:
            self.executor.add_node(node)
        self.results = tmp_path / 'results'

    def wait(self, predicate, timeout=20.0, message=''):
        wait_for(predicate, timeout, self.executor, message)

    def close(self):
        self.executor.shutdown(timeout_sec=2)
        for node in self.nodes:
            node.destroy_node()


def values_of(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}
