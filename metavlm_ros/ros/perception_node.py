"""The perception node (`metavlm_perception`): a managed node running the VLM on camera frames and probes."""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.qos import QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image

from metavlm_ros.common.errors import InputError
from metavlm_ros.common.process import finish
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.models.identity import handed_model_identity, model_identity
from metavlm_ros.models.registry import resolve_options
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.ros.conversions import (
    detection_array_type,
    error_to_array,
    frame_and_scale,
    identity_status,
    prediction_to_array,
    prediction_to_detection_array,
)
from metavlm_ros.ros.managed import ManagedNode, run_managed
from metavlm_ros.ros.parameters import MODEL_PARAMETERS, ParameterRules, ParameterSpec, model_options
from metavlm_ros.ros.probe_client import PROBE_QOS, LatencyStats

__all__ = ['PARAMETERS', 'PROBE_QOS', 'RESULT_QOS', 'PerceptionNode', 'main']

NODE_NAME = 'metavlm_perception'
RESULT_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST, depth=10, reliability=QoSReliabilityPolicy.RELIABLE
)
# Bound on probes waiting for the model; beyond it the oldest (already timed out at the tester) go.
MAX_PENDING_PROBES = 4096
WARN_PERIOD_S = 5.0
DIAGNOSTICS_PERIOD_S = 1.0
DIAGNOSTIC_STATUS = 'metavlm_perception: model'
# At shutdown, how long probes already received are still answered, so that the tester's last
# generation completes and is recorded instead of being dropped.
DRAIN_S = 2.0


#: The perception node's parameters (docs/ros.md): the model's, shared with the tester, then its own.
PARAMETERS: tuple[ParameterSpec, ...] = (
    *MODEL_PARAMETERS,
    ParameterSpec(
        'batch_wait_ms', 5, 'longest wait for more probes before a model call, in ms', low=0, high=1000
    ),
    ParameterSpec(
        'image_transport',
        'raw',
        "camera topic: 'raw' (image) or 'compressed' (image/compressed)",
        True,
        choices=('raw', 'compressed'),
    ),
)


@dataclass
class _Pending:
    msg: Any
    arrived: float  # time.monotonic() at arrival: latency_ms counts queueing as well as inference


@dataclass
class PerceptionCounters:
    """What the node has done so far (read by tests and by `metavlm run`)."""

    camera_frames: int = 0
    camera_frames_replaced: int = 0  # latest frame wins: frames overwritten before inference
    predictions: int = 0
    probes: int = 0
    probes_answered: int = 0
    probes_dropped: int = 0
    probes_refused: int = 0  # answered with an error (level ERROR, the reason) instead of a prediction
    predict_calls: int = 0
    conversion_failures: int = 0
    inference_failures: int = 0
    downscaled: int = 0


class PerceptionNode(ManagedNode):
    """Judges camera frames (latest wins) and micro-batched probe frames with one VLM backend.

    A managed node: `configure` loads the model and creates the publishers, `activate` subscribes to
    the camera and the probes, `deactivate` unsubscribes (the tester sees the probe topic unmatched
    and waits), `cleanup` frees the model, `shutdown` answers the probes already received (at most
    DRAIN_S) and then ends. Inference runs on a worker thread, never in a callback, so parameter and
    lifecycle services and subscriptions stay responsive while the model works.
    """

    def __init__(self, *, backend: VLMBackend | None = None, **node_kwargs: Any) -> None:
        """Declare and check the parameters; the node starts unconfigured (`bring_up` or a launch file).

        Args:
            backend: an already loaded backend to use instead of building one at configure (one
                model shared by nodes in one process, or tests).
            **node_kwargs: passed to rclpy's LifecycleNode (context, namespace, parameter_overrides, ...).

        Raises:
            ParameterError: an invalid parameter value at start.
        """
        super().__init__(NODE_NAME, **node_kwargs)
        self.counters = PerceptionCounters()
        self._cond = threading.Condition()
        self._camera: _Pending | None = None
        self._probes: deque[_Pending] = deque()
        self._stopping = False
        self._judging = False  # the worker holds a batch
        self._worker: threading.Thread | None = None
        self._given_backend = backend
        self.backend: VLMBackend | None = None
        #: What identifies the model, as an in-process search records it; sent with every probe answer.
        self.identity: dict[str, Any] | None = None
        self._identity_status: DiagnosticStatus | None = None
        self.prediction_pub: Any = None
        self.probe_prediction_pub: Any = None
        self.detections_pub: Any = None  # vision_msgs/Detection2DArray, for a model that answers with boxes
        self.diagnostics_pub: Any = None
        self._said_no_vision_msgs = False
        self._subscriptions_active: list[Any] = []
        try:
            self._declare_parameters()
        except BaseException:
            super().destroy_node()  # a node that failed to start must not linger in its context
            raise

        self.latency = LatencyStats()
        self._reported = PerceptionCounters()  # the counters at the previous /diagnostics
        self._made: list[Any] = []  # the configured node's publishers and timer

    # -- lifecycle -------------------------------------------------------------------------------------

    def _configure(self) -> None:
        """Load the model (ModelError fails the transition), create the publishers, start the worker."""
        if self._given_backend is not None:
            self.backend = self._given_backend
            self.identity = handed_model_identity(self.backend)
        else:
            backend, model, options = model_options(self._parameter_values())
            # Read before the model loads, as `metavlm search` reads it: the tester records it as is.
            self.identity = model_identity(backend, model, options)
            self.backend = create_backend(backend, model, **{**options, 'batch_size': self._max_batch})
        self._identity_status = identity_status(self.identity)
        self.prediction_pub = self.create_transient_publisher(DiagnosticArray, 'prediction', RESULT_QOS)
        self.diagnostics_pub = self.create_transient_publisher(DiagnosticArray, '/diagnostics', RESULT_QOS)
        self.probe_prediction_pub = self.create_transient_publisher(
            DiagnosticArray, 'probe/prediction', PROBE_QOS
        )
        self.detections_pub = self._create_detections_publisher()
        self._made = [
            *([self.detections_pub] if self.detections_pub is not None else []),
            self.prediction_pub,
            self.diagnostics_pub,
            self.probe_prediction_pub,
            # The steady clock: with use_sim_time a stopped /clock must not stop /diagnostics.
            self.create_timer(
                DIAGNOSTICS_PERIOD_S, self.publish_diagnostics, clock=Clock(clock_type=ClockType.STEADY_TIME)
            ),
        ]
        self._stopping = False
        self._worker = threading.Thread(target=self._work, name='metavlm-perception', daemon=True)
        self._worker.start()
        self.get_logger().info(
            f'{self.backend.name or "model"} {self.backend.model_id!r} loaded ({self.backend.kind}); '
            f'classes {", ".join(self.backend.classes)}'
        )

    def _create_detections_publisher(self) -> Any:
        """The `detections` publisher of a model that answers with boxes; None for the other kinds,
        or where vision_msgs is not installed (said once: the boxes still go out on `prediction`)."""
        if self.backend.kind != 'detection':
            return None
        array_type = detection_array_type()
        if array_type is None:
            if not self._said_no_vision_msgs:
                self._said_no_vision_msgs = True
                self.get_logger().warning(
                    'vision_msgs is not installed: no `detections` topic (Detection2DArray); the boxes '
                    'still go out on `prediction` (its `detections` value)'
                )
            return None
        return self.create_transient_publisher(array_type, 'detections', RESULT_QOS)

    def _activate(self) -> None:
        if self._rules.value('image_transport') == 'compressed':
            camera = self.create_transient_subscription(
                CompressedImage, 'image/compressed', self._on_camera, qos_profile_sensor_data
            )
        else:
            camera = self.create_transient_subscription(
                Image, 'image', self._on_camera, qos_profile_sensor_data
            )
        probe = self.create_transient_subscription(Image, 'probe', self._on_probe, PROBE_QOS)
        self._subscriptions_active = [camera, probe]
        self.get_logger().info('active: judging camera frames and probes')

    def _deactivate(self) -> None:
        self.destroy_entities(self._subscriptions_active)
        self._subscriptions_active = []
        with self._cond:
            self._camera = None
        self.get_logger().info('inactive: camera and probe topics unsubscribed')

    def _cleanup(self) -> None:
        self._drain(DRAIN_S)
        self._stop_worker()
        self.destroy_entities(self._made)
        self._made = []
        self.prediction_pub = self.probe_prediction_pub = self.diagnostics_pub = self.detections_pub = None
        with self._cond:
            self._probes.clear()
            self._camera = None
        self.backend = None  # the model's memory goes with the last reference
        self.identity = self._identity_status = None
        gc.collect()
        self.get_logger().info('model freed')

    def prepare_shutdown(self) -> None:
        """Answer the probes already received (at most DRAIN_S): the tester's last generation completes."""
        self._drain(DRAIN_S)

    def _drain(self, timeout_s: float) -> None:
        """Let the worker answer the probes already queued, for at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._camera = None
            while (self._probes or self._judging) and self._worker is not None and self._worker.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.05))

    def _stop_worker(self) -> None:
        """Stop the worker (after the model call in progress, if any)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        worker = self._worker
        if worker is not None and worker.is_alive() and threading.current_thread() is not worker:
            worker.join()
        self._worker = None

    # -- parameters --------------------------------------------------------------------------------

    def _declare_parameters(self) -> None:
        rules = ParameterRules(self)
        self._rules = rules
        values = rules.declare_table(
            PARAMETERS, on_change={'max_batch': self._set_max_batch, 'batch_wait_ms': self._set_batch_wait}
        )
        self._max_batch = values['max_batch']
        self._batch_wait_s = values['batch_wait_ms'] / 1000.0
        # A model option the backend does not take, or refuses, fails here (one line), before any load.
        backend, _, options = model_options(self._parameter_values())
        resolve_options(backend, options)

    def _parameter_values(self) -> dict[str, Any]:
        return {spec.name: self._rules.value(spec.name) for spec in PARAMETERS}

    def _set_max_batch(self, value: int) -> None:
        with self._cond:
            self._max_batch = int(value)
            self._cond.notify_all()

    def _set_batch_wait(self, value: int) -> None:
        with self._cond:
            self._batch_wait_s = int(value) / 1000.0
            self._cond.notify_all()

    # -- callbacks: store and notify only ---------------------------------------------------------

    def _on_camera(self, msg: Image | CompressedImage) -> None:
        with self._cond:
            self.counters.camera_frames += 1
            if self._camera is not None:
                self.counters.camera_frames_replaced += 1
            self._camera = _Pending(msg, time.monotonic())
            self._cond.notify()

    def _on_probe(self, msg: Image) -> None:
        with self._cond:
            self.counters.probes += 1
            self._probes.append(_Pending(msg, time.monotonic()))
            if len(self._probes) > MAX_PENDING_PROBES:
                self._probes.popleft()
                self.counters.probes_dropped += 1
            self._cond.notify()

    # -- the worker ---------------------------------------------------------------------------------

    def _next_batch(self, camera_turn: bool) -> tuple[list[_Pending], bool] | None:
        """Wait for work; returns (batch, is_probe_batch), or None when stopping. Holds no lock after."""
        with self._cond:
            while not (self._stopping or self._probes or self._camera is not None):
                self._cond.wait()
            if self._stopping:
                return None
            # Probes come first (the tester waits for them), but a waiting camera frame gets every
            # other turn so `prediction` keeps flowing during a search.
            if self._probes and not (camera_turn and self._camera is not None):
                deadline = self._probes[0].arrived + self._batch_wait_s
                while len(self._probes) < self._max_batch and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._stopping:
                    return None
                count = min(self._max_batch, len(self._probes))
                self._judging = True
                return [self._probes.popleft() for _ in range(count)], True
            pending, self._camera = self._camera, None
            self._judging = True
            return [pending], False

    def _work(self) -> None:
        camera_turn = False
        while True:
            work = self._next_batch(camera_turn)
            if work is None:
                return
            batch, is_probe = work
            camera_turn = is_probe
            try:
                self._judge(batch, self.probe_prediction_pub if is_probe else self.prediction_pub, is_probe)
            except Exception as exc:  # the worker must outlive any one batch; shutdown ends it cleanly
                if self._stopping or not self.context.ok():
                    return
                self.get_logger().error(f'perception worker: {type(exc).__name__}: {exc}')
            finally:
                with self._cond:
                    self._judging = False
                    self._cond.notify_all()

    def _judge(self, batch: list[_Pending], publisher: Any, is_probe: bool) -> None:
        frames, kept, scales = [], [], []
        for item in batch:
            try:
                # Boxes are answered in the pixels of the image received: `scale` undoes a reduction.
                rgb, scale = frame_and_scale(item.msg)
            except InputError as exc:
                self.counters.conversion_failures += 1
                self.get_logger().warning(
                    f'{"probe" if is_probe else "camera frame"} skipped '
                    f'({self.counters.conversion_failures} unreadable so far): {exc}',
                    throttle_duration_sec=WARN_PERIOD_S,
                )
                if is_probe:
                    self._refuse([item], f'unreadable frame: {exc}')
                continue
            self.counters.downscaled += int(scale != (1.0, 1.0))
            frames.append(rgb)
            kept.append(item)
            scales.append(scale)
        if not frames:
            return
        try:
            predictions = self.backend.predict(frames)
        except Exception as exc:  # a failing model call loses its frames, never the node
            self.counters.inference_failures += len(frames)
            self.get_logger().error(
                f'model failed on {len(frames)} frame(s): {exc}', throttle_duration_sec=WARN_PERIOD_S
            )
            if is_probe:
                self._refuse(kept, f'model failed: {exc}')
            return
        finally:
            self.counters.predict_calls += 1
        done = time.monotonic()
        for item, prediction, scale in zip(kept, predictions, scales, strict=True):
            if prediction is None:
                continue
            prediction = prediction.scaled(*scale)
            latency_ms = (done - item.arrived) * 1000.0
            # A probe's answer names the model that gave it (the tester records it with its results).
            identity = self._identity_status if is_probe else None
            publisher.publish(
                prediction_to_array(prediction, item.msg.header, self.backend.model_id, latency_ms, identity)
            )
            # The camera's objects only: probes are the tester's altered frames, not the scene.
            if not is_probe and self.detections_pub is not None and not prediction.error:
                self.detections_pub.publish(prediction_to_detection_array(prediction, item.msg.header))
            self.latency.add(done - item.arrived)
            if is_probe:
                self.counters.probes_answered += 1
            else:
                self.counters.predictions += 1

    def _refuse(self, items: list[_Pending], reason: str) -> None:
        """Answer probes that cannot be judged with an error, so the tester need not wait them out."""
        for item in items:
            self.probe_prediction_pub.publish(error_to_array(item.msg.header, self.backend.model_id, reason))
            self.counters.probes_refused += 1

    # -- health ---------------------------------------------------------------------------------------

    def diagnostics(self) -> DiagnosticStatus:
        """The node's health as one DiagnosticStatus (published on /diagnostics once a second).

        WARN while frames were unreadable, probes refused or model calls failed since the last one.
        """
        now, before = self.counters, self._reported
        self._reported = PerceptionCounters(**vars(now))
        trouble = [
            f'{count} {what}'
            for count, what in (
                (now.conversion_failures - before.conversion_failures, 'unreadable frame(s)'),
                (now.probes_refused - before.probes_refused, 'probe(s) refused'),
                (now.inference_failures - before.inference_failures, 'frame(s) lost to model failures'),
            )
            if count
        ]
        level = DiagnosticStatus.WARN if trouble else DiagnosticStatus.OK
        message = ', '.join(trouble) + ' in the last period' if trouble else 'judging frames'
        values = {
            'probes': now.probes,
            'probes_answered': now.probes_answered,
            'probes_refused': now.probes_refused,
            'probes_dropped': now.probes_dropped,
            'camera_frames': now.camera_frames,
            'camera_frames_replaced': now.camera_frames_replaced,
            'predictions': now.predictions,
            'frames_unreadable': now.conversion_failures,
            'inference_failures': now.inference_failures,
            'frames_downscaled': now.downscaled,
            'pending': self.pending(),
            'latency_p50_ms': self.latency.percentile_ms(50),
            'latency_p95_ms': self.latency.percentile_ms(95),
        }
        return DiagnosticStatus(
            level=level,
            name=DIAGNOSTIC_STATUS,
            message=message,
            hardware_id=str(self.backend.model_id),
            values=[
                KeyValue(key=k, value=f'{v:.3f}' if isinstance(v, float) else str(v))
                for k, v in values.items()
            ],
        )

    def publish_diagnostics(self) -> None:
        """Publish the health status on /diagnostics."""
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [self.diagnostics()]
        self.diagnostics_pub.publish(array)

    # -- state ------------------------------------------------------------------------------------------

    def pending(self) -> int:
        """Frames waiting for the model (probes plus the camera slot)."""
        with self._cond:
            return len(self._probes) + int(self._camera is not None)

    def destroy_node(self) -> None:
        """Stop the worker (after the model call in progress, if any) and destroy the node."""
        self._stop_worker()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the perception node until SIGINT, SIGTERM or its shutdown transition.

    It starts unconfigured, as managed nodes do: the launch files configure and activate it, or
    `ros2 lifecycle set /metavlm_perception configure` (then `activate`). Returns 1 on a bad parameter.
    """
    return run_managed(PerceptionNode, NODE_NAME, args)


def entry_point() -> None:
    """The `perception_node` executable: main(), then exit with its code (common.process.finish)."""
    finish(main())


if __name__ == '__main__':
    entry_point()
