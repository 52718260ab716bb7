"""The tester's model endpoints: frames judged through the perception node's probe topics, or in process."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import CallbackGroup, MutuallyExclusiveCallbackGroup
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from metavlm_ros.common.errors import ParameterError, SearchInterrupted
from metavlm_ros.common.images import resize_longer_side
from metavlm_ros.method.prediction import CLASSES, Prediction, VLMBackend
from metavlm_ros.ros.conversions import (
    array_to_prediction,
    identity_of,
    refusal_of,
    rgb_to_image_msg,
    stamp_to_ns,
)

__all__ = ['PROBE_QOS', 'LatencyStats', 'ProbesReleased', 'RosProbeBackend', 'TransportSizeBackend']

# Probes are requests: none may be lost to a shallow queue, so RELIABLE and deep on both sides.
PROBE_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=256,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.VOLATILE,
)


class ProbesReleased(SearchInterrupted):
    """The probe endpoint was released (stop, deactivate, shutdown) while a caller waited for answers."""


class TransportSizeBackend(VLMBackend):
    """A backend that shrinks every frame to the transport size before the wrapped backend sees it.

    Both endpoints use it, so the `ros` and `inprocess` endpoints judge exactly the same pixels:
    the source and every follow-up go through the same reduction.
    """

    def __init__(self, inner: VLMBackend, transport_size: int | None) -> None:
        """Wrap `inner`; `transport_size` is the longest side sent to it (0 or None: frames as they are)."""
        if transport_size is not None and int(transport_size) < 0:
            raise ParameterError(f'transport_size must be 0 (off) or positive, got {transport_size}')
        self.inner = inner
        self.transport_size = int(transport_size or 0)

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.inner.kind

    @property
    def classes(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.classes

    @property
    def model_id(self) -> str:  # type: ignore[override]
        return self.inner.model_id

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def input_size(self) -> int:  # type: ignore[override]
        # What the model is sent is at most transport_size: `auto` working sizes follow it, so both
        # endpoints search the same pixels. Without a transport size, the model's own (0 when unknown).
        return self.transport_size or self.inner.input_size

    def weights_hash(self) -> str:
        """The wrapped model's weights hash."""
        return self.inner.weights_hash()

    def reduce(self, frame: np.ndarray) -> np.ndarray:
        """The frame as it crosses the transport: longer side at most transport_size."""
        return np.ascontiguousarray(resize_longer_side(frame, self.transport_size))

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction | None]:
        """Predict on the reduced frames with the wrapped backend; boxes come back in the pixels of
        the frames given (the search compares them there)."""
        reduced = [self.reduce(frame) for frame in frames]
        answers = self.inner.predict(reduced)
        return [
            None
            if answer is None
            else answer.scaled(frame.shape[1] / small.shape[1], frame.shape[0] / small.shape[0])
            for frame, small, answer in zip(frames, reduced, answers, strict=True)
        ]


class LatencyStats:
    """A bounded window of probe round-trip times with percentiles, safe across threads."""

    def __init__(self, window: int = 500) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """Record one round-trip time in seconds."""
        with self._lock:
            self._values.append(seconds)

    def percentile_ms(self, q: float) -> float:
        """The q-th percentile of the window in milliseconds; nan when nothing was recorded."""
        with self._lock:
            values = list(self._values)
        if not values:
            return float('nan')
        return float(np.percentile(values, q) * 1000.0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)


class RosProbeBackend(VLMBackend):
    """Judges frames through the perception node: each frame goes out on `probe`, the answer comes
    back on `probe/prediction` with the same header stamp.

    `predict` blocks the calling (search worker) thread; the reply subscription lives in its own
    callback group, so the executor delivers replies on another thread while the worker waits.
    Replies missing after `timeout_s` are asked for once more; those still missing are None, which
    the search records as failed evaluations. A call never waits longer than (retries + 1) timeouts.
    A frame the perception node refuses (an error answer: unreadable frame, model failure) is None
    at once, without a retry; `errors` holds the reasons of the last call, by frame index.
    """

    name = 'ros'

    def __init__(
        self,
        node: Node,
        *,
        timeout_s: float = 5.0,
        retries: int = 1,
        classes: Sequence[str] = CLASSES,
        kind: str = 'confidence',
        callback_group: CallbackGroup | None = None,
        probe_topic: str = 'probe',
        reply_topic: str = 'probe/prediction',
    ) -> None:
        """Create the probe publisher and the reply subscription on `node`.

        Args:
            node: the node the topics belong to (its executor must spin while `predict` waits).
            timeout_s: seconds to wait for the answers of one round of probes.
            retries: how many times missing answers are asked for again.
            classes: the classes assumed until the first answer names the model's own.
            kind: 'confidence' or 'count', assumed until the first answer says.
            callback_group: the group of the reply subscription (default: a group of its own).
            probe_topic: where frames are sent (relative, remappable).
            reply_topic: where answers come back.

        Raises:
            ParameterError: a non-positive timeout or a negative number of retries.
        """
        if not timeout_s > 0:
            raise ParameterError(f'probe_timeout_s must be positive, got {timeout_s}')
        if retries < 0:
            raise ParameterError(f'probe retries must be 0 or more, got {retries}')
        self.node = node
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        # Until the first reply tells otherwise; replies carry the model's own classes and kind.
        self.kind = kind
        self.classes = tuple(classes)
        self.model_id = ''
        #: What identifies the model that answered last (its options included), as the perception node
        #: says; None until it answers, or from a node that does not say (it names its model only).
        self.identity: dict | None = None
        self.latency = LatencyStats()
        self.sent = 0
        self.answered = 0
        self.retried = 0
        self.lost = 0
        self.refused = 0
        self.errors: dict[int, str] = {}  # frame index -> the perception node's reason, last call
        self.consecutive_failed_rounds = 0
        self.last_reply_time: float | None = None
        self._cond = threading.Condition()
        self._replies: dict[int, Prediction] = {}
        self._refusals: dict[int, str] = {}  # stamp (ns) -> reason of an error answer
        self._waiting: dict[int, float] = {}  # stamp (ns) -> monotonic send time
        self._last_stamp = 0
        self._closed = False
        self.callback_group = callback_group or MutuallyExclusiveCallbackGroup()
        # No QoS event handlers: the tester destroys these (close) while its executor spins, and rclpy
        # would still put destroyed event handlers in a wait set.
        self._publisher = node.create_publisher(
            Image,
            probe_topic,
            PROBE_QOS,
            event_callbacks=PublisherEventCallbacks(use_default_callbacks=False),
        )
        self._subscription = node.create_subscription(
            DiagnosticArray,
            reply_topic,
            self._on_reply,
            PROBE_QOS,
            callback_group=self.callback_group,
            event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False),
        )

    # -- health -----------------------------------------------------------------------------------

    @property
    def subscribers(self) -> int:
        """How many subscriptions (perception nodes) are matched on the probe topic."""
        return self._publisher.get_subscription_count()

    @property
    def connected(self) -> bool:
        """Whether probes can go out and answers come back: both probe topics are matched.

        Discovery matches the two directions separately; an answer published before its direction
        is matched is lost, and the probe has to be sent again after `timeout_s`.
        """
        return self.subscribers > 0 and self._subscription.get_publisher_count() > 0

    @property
    def answering(self) -> bool:
        """Whether the perception node is there and answered the last round of probes."""
        answers = self.answered + self.refused  # a refusal is an answer: the node is there
        return self.subscribers > 0 and answers > 0 and self.consecutive_failed_rounds == 0

    # -- the VLMBackend interface -------------------------------------------------------------------

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction | None]:
        """Send every frame as a probe and wait for the replies; None for those never answered.

        Raises:
            ProbesReleased: `release()` was called (shutdown) before every answer came.
        """
        results: list[Prediction | None] = [None] * len(frames)
        self.errors = {}
        if not frames:
            return results
        missing = list(range(len(frames)))
        stamps: dict[int, list[int]] = {i: [] for i in missing}
        for attempt in range(self.retries + 1):
            if self._closed:
                break
            if attempt > 0:
                self.retried += len(missing)
            for i in missing:
                stamps[i].append(self._send(frames[i]))
            deadline = time.monotonic() + self.timeout_s
            with self._cond:
                while True:
                    # A late reply to the first attempt is as good as a reply to the retry.
                    missing = [
                        i
                        for i in missing
                        if not any(s in self._replies or s in self._refusals for s in stamps[i])
                    ]
                    remaining = deadline - time.monotonic()
                    if not missing or remaining <= 0 or self._closed:
                        break
                    self._cond.wait(remaining)
            if not missing:
                break
        with self._cond:
            for i, sent in stamps.items():
                for stamp in sent:
                    reply = self._replies.pop(stamp, None)
                    if reply is not None and results[i] is None:
                        results[i] = reply
                    reason = self._refusals.pop(stamp, None)
                    if reason is not None:
                        self.errors[i] = reason
                    self._waiting.pop(stamp, None)
            # A retry may have been answered where an earlier copy was refused.
            self.errors = {i: reason for i, reason in self.errors.items() if results[i] is None}
        if self._closed and any(r is None for r in results):
            # Answers cut off by a shutdown are not the perception node's failures: record nothing.
            raise ProbesReleased('probe endpoint released while answers were awaited')
        for i, reason in self.errors.items():
            self.node.get_logger().warning(
                f'the perception node refused frame {i}: {reason}', throttle_duration_sec=5.0
            )
        failed = sum(r is None for r in results) - len(self.errors)
        self.lost += failed
        if failed == len(frames):
            self.consecutive_failed_rounds += 1
        else:
            self.consecutive_failed_rounds = 0
        return results

    def release(self) -> None:
        """Wake every waiting caller at once; they raise ProbesReleased (used at shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        """Accept callers again after `release()` (the tester was deactivated, then activated)."""
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """Release waiting callers and drop the probe topics."""
        self.release()
        self.node.destroy_subscription(self._subscription)
        self.node.destroy_publisher(self._publisher)

    # -- internals ----------------------------------------------------------------------------------

    def _next_stamp(self) -> int:
        # Unique and increasing even when the clock stands still or two probes share a nanosecond.
        stamp = max(time.time_ns(), self._last_stamp + 1)
        self._last_stamp = stamp
        return stamp

    def _send(self, frame: np.ndarray) -> int:
        with self._cond:
            stamp = self._next_stamp()
            self._waiting[stamp] = time.monotonic()
        msg = rgb_to_image_msg(frame, stamp, frame_id='metavlm_probe')
        self._publisher.publish(msg)
        self.sent += 1
        return stamp

    def _on_reply(self, msg: DiagnosticArray) -> None:
        stamp = stamp_to_ns(msg.header.stamp)
        now = time.monotonic()
        with self._cond:
            sent_at = self._waiting.pop(stamp, None)
            if sent_at is None:
                return  # not ours, or an answer that came after its caller gave up
            try:
                reason = refusal_of(msg)
                prediction = None if reason is not None else array_to_prediction(msg)
                identity = identity_of(msg) if prediction is not None else None
            except Exception as exc:  # a malformed reply counts as no reply, never as a crash
                self.node.get_logger().warning(f'unreadable probe reply: {exc}', throttle_duration_sec=5.0)
                return
            self.last_reply_time = now
            if prediction is None:
                self._refusals[stamp] = reason
                self.refused += 1
                self._cond.notify_all()
                return
            self._replies[stamp] = prediction
            self.answered += 1
            self.latency.add(now - sent_at)
            self.kind = prediction.kind
            self.classes = tuple(prediction.values)
            if msg.status and msg.status[0].hardware_id:
                self.model_id = msg.status[0].hardware_id
            self.identity = identity
            self._cond.notify_all()
