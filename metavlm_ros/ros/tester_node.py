"""The tester node (`metavlm_tester`): a managed node that searches camera frames for violations."""

from __future__ import annotations

import gc
import math
import threading
import time
from pathlib import Path
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.parameter import Parameter
from rclpy.qos import (
    qos_profile_sensor_data,
)
from sensor_msgs.msg import CompressedImage, Image
from std_srvs.srv import Trigger

from metavlm_ros.common.errors import InputError, MetaVLMError, ResultsError, StorageError
from metavlm_ros.common.manifest import write_manifest
from metavlm_ros.common.process import finish
from metavlm_ros.common.results import (
    ResultsStore,
    WriteRate,
)
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.ros.conversions import stamp_to_ns
from metavlm_ros.ros.managed import ManagedNode, run_managed
from metavlm_ros.ros.parameters import ParameterRules
from metavlm_ros.ros.probe_client import ProbesReleased, RosProbeBackend
from metavlm_ros.ros.tester_boxes import BoxTally
from metavlm_ros.ros.tester_criteria import CriteriaStatus
from metavlm_ros.ros.tester_identity import check_identity, tester_model_identity
from metavlm_ros.ros.tester_modes import ModesStatus
from metavlm_ros.ros.tester_output import RESULT_QOS, SearchJob, TesterOutput
from metavlm_ros.ros.tester_settings import (
    NODE_NAME,
    PARAMETERS,
    TesterSettings,
    settings_from_parameters,
)
from metavlm_ros.viewer.live import LiveResults, LiveServer

__all__ = ['TesterNode', 'main']

# How long a stopping tester lets the generation in progress finish before it abandons its probes
# (then drops that generation and finishes the search with what it recorded). With the wait for the
# search's last records, a stop stays inside the 5 s `ros2 launch` allows between SIGINT and SIGTERM.
STOP_GRACE_S = 2.5
# After the probes are abandoned: the most a stop waits for the summary and Pareto records.
FINISH_WAIT_S = 2.0


class TesterNode(TesterOutput, ManagedNode):
    """Searches camera frames for violations, one search at a time, and publishes what it finds.

    A managed node: `configure` starts the Foxglove server (`foxglove_port`), builds the endpoint
    (the probe topics, or loads the inprocess model) and opens the results; `activate` subscribes to
    the camera and starts testing; `deactivate` unsubscribes and stops the running search after its
    current generation (its summary is written); `cleanup` closes the results, frees the model and
    stops the Foxglove server; `shutdown` does what is needed of both. A viewer stays connected while
    the node is inactive: a pause is not a disconnection. The camera callback only keeps the newest
    message in a one-slot buffer (older unsearched frames are counted as dropped); a timer hands it
    to a worker thread at most every `frame_period_s`; the worker runs `core.search.run_search`,
    whose results are stored before anything is published. Services `~/search_now` and
    `~/stop_search` (std_srvs/Trigger) search the newest frame at once and stop the running search.
    """

    def __init__(self, *, backend: VLMBackend | None = None, **kwargs: Any) -> None:
        """Declare and validate the parameters; the node starts unconfigured (`bring_up` or a launch file).

        Args:
            backend: a ready model for the inprocess endpoint (instead of loading `model` at configure).
            **kwargs: passed to rclpy's LifecycleNode (context, parameter_overrides, namespace, ...).

        Raises:
            ParameterError: a parameter is invalid (the message names it and says why).
        """
        super().__init__(NODE_NAME, **kwargs)
        self._given_backend = backend
        self._lock = threading.Lock()
        try:
            self._declare_parameters()
            self.settings = settings_from_parameters(self._parameter_values())
        except BaseException:
            super().destroy_node()  # a node that failed to start must not linger in its context
            raise
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

        # Counters, read by /diagnostics and by `metavlm run`.
        self.frames_received = 0
        self.frames_dropped = 0
        self.frames_unreadable = 0
        self.searches_done = 0
        # The criteria_file's criteria, judged on results_dir as searches end (/diagnostics).
        self.criteria_status = CriteriaStatus()
        self.modes_status = ModesStatus()  # results_dir's failure modes, learnt in a thread of their own
        self.boxes_status = BoxTally()  # how the boxes of detection searches changed, for the node's life
        self.searches_stopped = 0
        self.evaluations = 0
        self.evaluations_failed = 0
        self.violations = 0
        self.judged = 0  # non-failed evaluations of order > 0: the violation rate's denominator
        self.last_hypervolume = float('nan')
        self.last_rate = float('nan')
        self.last_error = ''
        self.last_error_time: float | None = None  # time.monotonic() of last_error
        self.searches_paused_disk = 0  # frames not searched because the results disk was below its reserve
        # Set when results could not be written (disk full, read-only, directory gone): searches pause
        # until the disk has room again; `metavlm run` ends with it.
        self.storage_failure: StorageError | None = None
        self._free_at_failure = 0
        self.violation_pngs_skipped = 0  # published violations whose follow-up PNG was not written (cap)
        self.disk_free_mb = float('nan')
        self._write_rate = WriteRate()  # the results directory's growth, for /diagnostics
        self._over_budget = False
        self._disk_low = False
        self._stopped_for_disk = False
        self.camera_callback_max_s = 0.0
        self.state = 'unconfigured'

        self._slot: Any = None
        self._latest: Any = None  # the newest camera message, for ~/search_now
        self._job: SearchJob | None = None
        self._busy = False
        self._last_start = -math.inf
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._pending: tuple[Any, TesterSettings] | None = None
        self._store: ResultsStore | None = None
        self._worker: threading.Thread | None = None
        self.backend: VLMBackend | None = None  # the model: the probe topics or an inprocess one
        self.probe: RosProbeBackend | None = None
        self._model_part: dict[str, Any] | None = None  # an inprocess model's identity, read at configure
        self._camera: Any = None
        self._made: list[Any] = []  # publishers and timers of the configured node
        self.live: LiveServer | None = None  # the Foxglove server, from configure to cleanup
        self._live_results: tuple[ResultsStore, LiveResults] | None = None  # the store it publishes
        # Timers run on the steady clock: with use_sim_time a stopped /clock (a bag that ended) must
        # not stop the scheduling nor /diagnostics.
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._camera_group = MutuallyExclusiveCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        services = MutuallyExclusiveCallbackGroup()
        self.create_service(Trigger, '~/search_now', self._on_search_now, callback_group=services)
        self.create_service(Trigger, '~/stop_search', self._on_stop_search, callback_group=services)

    # -- lifecycle ----------------------------------------------------------------------------------

    def _configure(self) -> None:
        settings = self.settings
        # Before a model loads, the whole identity of an inprocess model its parameters name (its
        # weights read as `metavlm search` reads them); the perception node's model once it answers.
        self._model_part = None
        if settings.endpoint == 'inprocess' and self._given_backend is None:
            self._model_part = tester_model_identity(settings)
        check_identity(settings, self._model_identity(settings))
        # A port that cannot be bound refuses configure before a model loads.
        self.live = self._start_live(settings)
        try:
            self._configure_node(settings)
        except BaseException:
            self._stop_live()
            raise

    def _configure_node(self, settings: TesterSettings) -> None:
        self.backend = self._make_backend(settings)
        try:
            check_identity(settings, self._model_identity(settings))
        except ResultsError:
            self._release_backend()
            raise
        try:
            self._results(settings.results_dir)
        except (OSError, MetaVLMError) as exc:
            self._release_backend()
            raise InputError(
                f'parameter results_dir: cannot write to {settings.results_dir} ({exc})'
            ) from None
        self.criteria_status.reset(settings.criteria, settings.results_dir, self.get_logger().warning)
        self.modes_status.reset(settings, self.get_logger().warning)
        self.violations_pub = self.create_transient_publisher(DiagnosticArray, 'violations', RESULT_QOS)
        self.violation_image_pub = self.create_transient_publisher(Image, 'violation_image', RESULT_QOS)
        self.violation_followup_pub = self.create_transient_publisher(Image, 'violation_followup', RESULT_QOS)
        self.diagnostics_pub = self.create_transient_publisher(DiagnosticArray, '/diagnostics', RESULT_QOS)
        self._made = [
            self.violations_pub,
            self.violation_image_pub,
            self.violation_followup_pub,
            self.diagnostics_pub,
            self.create_timer(0.05, self._schedule, callback_group=self._timer_group, clock=self._steady),
            self.create_timer(
                1.0, self.publish_diagnostics, callback_group=self._timer_group, clock=self._steady
            ),
        ]
        self._stopping.clear()
        self._worker = threading.Thread(target=self._work, name='metavlm-search', daemon=True)
        self._worker.start()
        self.state = 'inactive'
        self.get_logger().info(f'configured: {settings.endpoint} endpoint, results in {settings.results_dir}')

    def _activate(self) -> None:
        if self.probe is not None:
            self.probe.reopen()
        if self.settings.image_transport == 'compressed':
            self._camera = self.create_transient_subscription(
                CompressedImage,
                'image/compressed',
                self._on_camera,
                qos_profile_sensor_data,
                callback_group=self._camera_group,
            )
        else:
            self._camera = self.create_transient_subscription(
                Image, 'image', self._on_camera, qos_profile_sensor_data, callback_group=self._camera_group
            )
        self.state = 'waiting for frames'
        self.get_logger().info('active: testing camera frames')

    def _deactivate(self) -> None:
        if self._camera is not None:
            self.destroy_subscription(self._camera)
            self._camera = None
        with self._lock:
            self._slot = None
        reason = 'shutting down' if self.shutting_down else 'deactivated'
        self.stop_search(reason)
        self.state = 'inactive'
        self.get_logger().info('inactive: camera unsubscribed, no search runs')

    def _cleanup(self) -> None:
        self._stopping.set()
        with self._wake:
            self._wake.notify_all()
        busy = False
        if self._worker is not None:
            self._worker.join(FINISH_WAIT_S)
            busy = self._worker.is_alive()
            if busy:
                self.get_logger().warning('the search worker is still busy; cleaned up without it')
            self._worker = None
        if self._store is not None:
            self._store.close()
            if not busy:  # nothing writes there any more: the directory as it is left
                self._seal(self._store.directory)
            self._store = None
        self.modes_status.close()
        self.destroy_entities(self._made)
        self._made = []
        self._release_backend()
        self._stop_live()
        self.state = 'unconfigured'

    def _seal(self, directory: Path) -> None:
        """Write the results directory's SHA256SUMS (docs/assurance.md); a failure is said, not raised."""
        try:
            write_manifest(directory)
        except OSError as exc:
            self.get_logger().warning(f'{directory}: SHA256SUMS not written ({exc.strerror or exc})')

    def _release_backend(self) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None
        self.backend = None  # an inprocess model's memory goes with the last reference
        gc.collect()

    # -- services -----------------------------------------------------------------------------------

    def _on_search_now(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        with self._lock:
            if not self.active:
                response.success, response.message = False, f'not active ({self.state})'
            elif self._busy:
                job = self._job
                response.success = False
                response.message = f'a search is running ({job.image_id if job else "starting"})'
            elif self._slot is None and self._latest is None:
                response.success, response.message = False, 'no camera frame received yet'
            else:
                if self._slot is None:
                    self._slot = self._latest
                self._last_start = -math.inf  # frame_period_s does not hold this one back
                response.success = True
                response.message = f'searching the frame of {stamp_to_ns(self._slot.header.stamp)} ns'
        return response

    def _on_stop_search(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        job = self._job
        if job is None:
            response.success, response.message = False, 'no search is running'
        else:
            job.stop_reason = job.stop_reason or 'asked to stop (~/stop_search)'
            response.success = True
            response.message = f'the search of {job.image_id} stops after its current generation'
        return response

    def prepare_shutdown(self) -> None:
        """Stop the running search while probe answers can still arrive (its summary is written)."""
        self.stop_search('shutting down')

    def stop_search(self, reason: str, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop the running search after its current generation; its records and summary are kept.

        The generation in progress gets `grace_s` to finish; then its probes are abandoned (it is
        not recorded) and the search finishes with what it has. Returns whether no search runs.
        """
        with self._lock:
            job = self._job
            if job is not None and not job.stop_reason:
                job.stop_reason = reason
            with self._wake:
                if self._pending is not None:
                    self._pending = None
                    self._busy = False
        if not self._wait_idle(grace_s) and self.probe is not None:
            self.probe.release()
            self._wait_idle(FINISH_WAIT_S)
        return not self._busy

    def _wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._busy

    # -- parameters -----------------------------------------------------------------------------

    def _declare_parameters(self) -> None:
        rules = ParameterRules(self)
        self._rules = rules
        rules.declare_table(PARAMETERS)

    def _model_identity(self, settings: TesterSettings) -> dict[str, Any]:
        """The model part of the identity known now (the model parameters are read-only: it holds)."""
        if self._model_part is not None:
            return self._model_part
        return tester_model_identity(
            settings, self.probe if settings.endpoint == 'ros' else self._given_backend
        )

    def _parameter_values(self) -> dict[str, Any]:
        names = self.list_parameters([], 0).names
        return {param.name: param.value for param in self.get_parameters(names)}

    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        values = self._parameter_values()
        values.update({p.name: p.value for p in parameters})
        try:
            settings = settings_from_parameters(values)
            if self.backend is not None:  # configured: the next search writes into results_dir
                check_identity(settings, self._model_identity(settings))
        except MetaVLMError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, parameters: list[Parameter]) -> None:
        # Only once every check has passed and the values are set: the settings never hold a refused value.
        settings = settings_from_parameters(self._parameter_values())
        with self._lock:
            self.settings = settings  # taken by the next search; the running one keeps its own
        if self.backend is not None:  # configured: the criteria follow the new file or results_dir
            self.criteria_status.reset(settings.criteria, settings.results_dir, self.get_logger().warning)
            self.modes_status.reset(settings, self.get_logger().warning)

    # -- the model endpoint ---------------------------------------------------------------------

    def _make_backend(self, settings: TesterSettings) -> VLMBackend:
        if settings.endpoint == 'ros':
            self.probe = RosProbeBackend(
                self,
                timeout_s=settings.probe_timeout_s,
                classes=settings.model['resolved']['classes'],
                callback_group=MutuallyExclusiveCallbackGroup(),
            )
            return self.probe
        self.probe = None
        if self._given_backend is not None:
            return self._given_backend
        model = settings.model
        return create_backend(model['backend'], model['model'], **model['options'])

    @property
    def perception_answering(self) -> bool | None:
        """Whether the perception node answers probes (None for the inprocess endpoint)."""
        if self.probe is None:
            return None
        return self.probe.answering

    def _endpoint_ready(self) -> bool:
        return self.probe is None or self.probe.connected

    # -- camera and scheduling ----------------------------------------------------------------------

    def _on_camera(self, msg: Image | CompressedImage) -> None:
        # Only keep a reference: no conversion, no lock held for long, never a wait on the search.
        started = time.perf_counter()
        with self._lock:
            self.frames_received += 1
            if self._slot is not None:
                self.frames_dropped += 1
            self._slot = msg
            self._latest = msg
        self.camera_callback_max_s = max(self.camera_callback_max_s, time.perf_counter() - started)

    def _schedule(self) -> None:
        with self._lock:
            if self._busy or self._slot is None or self._stopping.is_set() or not self.active:
                return
            settings = self.settings
            if time.monotonic() - self._last_start < settings.frame_period_s:
                return
            if not self._endpoint_ready():
                self.state = 'waiting for the perception node'
                return
            msg, self._slot = self._slot, None
            self._busy = True
            self._last_start = time.monotonic()
        with self._wake:
            self._pending = (msg, settings)
            self._wake.notify()

    @property
    def busy(self) -> bool:
        """Whether a search is running (or about to)."""
        return self._busy

    @property
    def has_pending_frame(self) -> bool:
        """Whether a camera frame waits in the buffer for the next search."""
        return self._slot is not None

    # -- the search worker --------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stopping.is_set():
            with self._wake:
                while self._pending is None and not self._stopping.is_set():
                    self._wake.wait(0.5)
                job, self._pending = self._pending, None
            if job is None:
                continue
            try:
                self._search(*job)
            except ProbesReleased:
                # Stopped while the source frame was being judged: nothing of this search was recorded.
                self.state = 'search stopped before it began'
                self.get_logger().info('search stopped before its source frame was judged; nothing recorded')
            except StorageError as exc:
                self._storage_failed(exc)
            except MetaVLMError as exc:
                self._error(str(exc))
                self.get_logger().error(f'search failed: {exc}')
            except Exception as exc:  # a bug in one search must not end the node
                self._error(f'{type(exc).__name__}: {exc}')
                self.get_logger().error(f'search failed: {self.last_error}')
            finally:
                with self._lock:
                    self._busy = False
                    self._job = None

    def destroy_node(self) -> None:
        """Stop the search worker (if the node was not shut down first), then destroy the node."""
        if not self.finalized and self._worker is not None:
            self.stop_search('the node is destroyed')
            self._cleanup()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the tester node until SIGINT, SIGTERM or its shutdown transition.

    It starts unconfigured, as managed nodes do: the launch files configure and activate it, or
    `ros2 lifecycle set /metavlm_tester configure` (then `activate`). Invalid parameters: a one-line
    error and exit code 1.
    """
    return run_managed(TesterNode, NODE_NAME, args)


def entry_point() -> None:
    """The `tester_node` executable: main(), then exit with its code (metavlm_ros.common.process.finish)."""
    finish(main())


if __name__ == '__main__':
    entry_point()
