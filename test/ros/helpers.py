"""ROS 2 test helpers: a fresh rclpy context, waiting by spinning, a test camera and a topic collector."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.executors import Executor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from metavlm_ros.ros.conversions import ns_to_stamp, rgb_to_image_msg

__all__ = ['CameraPublisher', 'TopicCollector', 'reliable', 'ros_context', 'wait_for']


def reliable(depth: int = 100) -> QoSProfile:
    """A RELIABLE, keep-last QoS profile of the given depth."""
    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)


@contextmanager
def ros_context(args: list[str] | None = None) -> Iterator[Context]:
    """Initialise rclpy in a fresh Context for one test and shut it down afterwards."""
    context = Context()
    rclpy.init(args=args, context=context)
    try:
        yield context
    finally:
        rclpy.try_shutdown(context=context)


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    executor_or_node: Executor | Node | Sequence[Node],
    message: str = '',
) -> None:
    """Spin until `predicate()` is true; fail the test with a message after `timeout` seconds.

    Args:
        predicate: evaluated after every spin step.
        timeout: seconds to wait at most.
        executor_or_node: an executor to spin, or node(s) spun in a temporary executor.
        message: what was awaited, for the failure message.
    """
    temporary = not isinstance(executor_or_node, Executor)
    if temporary:
        nodes = [executor_or_node] if isinstance(executor_or_node, Node) else list(executor_or_node)
        executor: Executor = SingleThreadedExecutor(context=nodes[0].context)
        for node in nodes:
            executor.add_node(node)
    else:
        executor = executor_or_node
    deadline = time.monotonic() + timeout
    try:
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                what = message or getattr(predicate, '__name__', 'condition')
                raise AssertionError(f'timed out after {timeout:g} s waiting for {what}')
            executor.spin_once(timeout_sec=min(0.05, remaining))
    finally:
        if temporary:
            for node in nodes:
                executor.remove_node(node)
            executor.shutdown(timeout_sec=0)


class CameraPublisher(Node):
    """A test camera: publishes frames (raw rgb8 or compressed PNG) on demand or at a rate."""

    def __init__(
        self,
        context: Context,
        topic: str = 'image',
        *,
        compressed: bool = False,
        qos: QoSProfile = qos_profile_sensor_data,
        name: str = 'test_camera',
        frame_id: str = 'camera',
    ) -> None:
        """Create the publisher (on `topic`, or `topic`/compressed when compressed)."""
        super().__init__(name, context=context)
        self.compressed = compressed
        self.frame_id = frame_id
        msg_type = CompressedImage if compressed else Image
        self.topic = f'{topic}/compressed' if compressed else topic
        self.publisher = self.create_publisher(msg_type, self.topic, qos)
        self.stamps: list[int] = []
        self._timer = None

    def message(self, rgb: np.ndarray, stamp_ns: int) -> Image | CompressedImage:
        """The message this camera would publish for a frame and a stamp."""
        if not self.compressed:
            return rgb_to_image_msg(rgb, stamp_ns, self.frame_id)
        import cv2

        ok, buf = cv2.imencode('.png', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        assert ok
        msg = CompressedImage(
            header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=self.frame_id), format='png'
        )
        msg.data = buf.tobytes()
        return msg

    def publish(self, rgb: np.ndarray, stamp_ns: int | None = None) -> int:
        """Publish one frame; returns its stamp in nanoseconds (distinct and increasing by default)."""
        if stamp_ns is None:
            stamp_ns = 1_000_000_000 + len(self.stamps) * 33_333_333
        self.publisher.publish(self.message(rgb, stamp_ns))
        self.stamps.append(stamp_ns)
        return stamp_ns

    def publish_msg(self, msg: Any) -> None:
        """Publish a ready-made (possibly malformed) message."""
        self.publisher.publish(msg)

    def start(self, frames: Sequence[np.ndarray], rate_hz: float) -> None:
        """Publish `frames` cyclically at `rate_hz` while the node is spun."""
        index = iter(range(1 << 62))

        def tick() -> None:
            self.publish(frames[next(index) % len(frames)])

        self._timer = self.create_timer(1.0 / rate_hz, tick)

    def stop(self) -> None:
        """Stop the periodic publishing."""
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None


class TopicCollector(Node):
    """Keeps every message received on one topic."""

    def __init__(
        self,
        context: Context,
        topic: str,
        msg_type: type,
        qos: QoSProfile | None = None,
        name: str = 'test_collector',
    ) -> None:
        """Subscribe to `topic` (RELIABLE, depth 100 unless `qos` is given)."""
        super().__init__(name, context=context)
        self.messages: list[Any] = []
        self.arrivals: list[float] = []  # time.monotonic() when the callback ran
        self.sent: list[float] = []  # the publisher's source timestamps, seconds (free of spin delays)
        self.subscription = self.create_subscription(msg_type, topic, self._keep, qos or reliable())

    def _keep(self, msg: Any, info: Any) -> None:
        self.messages.append(msg)
        self.arrivals.append(time.monotonic())
        self.sent.append(info['source_timestamp'] / 1e9)
