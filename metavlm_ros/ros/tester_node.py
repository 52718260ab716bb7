"""The tester node (`metavlm_tester`): a managed node that searches camera frames for violations."""

from __future__ import annotations

import gc
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.parameter import Parameter
from rclpy.qos import (
    QoSDurabilityPolicy,
    QoSHistoryPolicy,
    QoSProfile,
    QoSReliabilityPolicy,
    qos_profile_sensor_data,
)
from sensor_msgs.msg import CompressedImage, Image
from std_srvs.srv import Trigger

from metavlm_ros.common.errors import InputError, MetaVLMError, ResultsError, StorageError
from metavlm_ros.common.process import finish
from metavlm_ros.common.results import (
    IDENTITY,
    VIOLATIONS,
    ResultsStore,
    WriteRate,
    free_disk_bytes,
    read_identity,
    write_identity,
)
from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.method.search import (
    Evaluation,
    SearchResult,
    evaluation_record,
    prepare_frame,
    run_search,
)
from metavlm_ros.models.vlm import create_backend
from metavlm_ros.ros.conversions import image_msg_to_rgb, rgb_to_image_msg, stamp_to_ns
from metavlm_ros.ros.managed import ManagedNode, run_managed
from metavlm_ros.ros.parameters import ParameterRules
from metavlm_ros.ros.probe_client import ProbesReleased, RosProbeBackend, TransportSizeBackend
from metavlm_ros.ros.tester_settings import (
    NODE_NAME,
    PARAMETERS,
    TesterSettings,
    check_identity,
    published_flag,
    settings_from_parameters,
    violation_status,
)
from metavlm_ros.ros.visualisation import violation_image

__all__ = ['TesterNode', 'main']

DIAGNOSTIC_STATUS = 'metavlm_tester: search'
# Consecutive probe rounds with no answer at all after which a search is given up (its results are
# kept) and the tester waits for the perception node instead of recording failure after failure.
FAILED_ROUNDS_TO_PAUSE = 3
# How long a stopping tester lets the generation in progress finish before it abandons its probes
# (then drops that generation and finishes the search with what it recorded). With the wait for the
# search's last records, a stop stays inside the 5 s `ros2 launch` allows between SIGINT and SIGTERM.
STOP_GRACE_S = 2.5
# After the probes are abandoned: the most a stop waits for the summary and Pareto records.
FINISH_WAIT_S = 2.0
# Least seconds between two warnings about unreadable camera frames (a broken camera sends many).
WARN_PERIOD_S = 5.0
MIB = 1024 * 1024

# Violations and their images are results: RELIABLE, so rqt_image_view and rviz both receive them.
RESULT_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.VOLATILE,
)


class _Job:
    """The search in progress: its frame and what it has produced so far."""

    def __init__(
        self,
        frame: np.ndarray,
        msg: Any,
        stamp_ns: int,
        image_id: str,
        settings: TesterSettings,
        backend: TransportSizeBackend,
    ):
        self.frame = frame  # the source frame at its working size, as searched
        self.backend = backend  # the model as this search sends it frames (its transport size)
        self.header = msg.header
        self.stamp_ns = stamp_ns
        self.image_id = image_id
        self.settings = settings
        self.started = time.monotonic()
        self.evaluations = 0
        self.violation_pngs = 0  # follow-up PNGs written for this search's published violations
        # Added to every stored record of this search.
        self.extra = {'source_stamp': stamp_ns, 'endpoint': settings.endpoint}
        self.stop_reason = ''  # set when asked to stop (stop_search service, deactivate, shutdown)


class TesterNode(ManagedNode):
    """Searches camera frames for violations, one search at a time, and publishes what it finds.

    A managed node: `configure` builds the endpoint (the probe topics, or loads the inprocess model)
    and opens the results; `activate` subscribes to the camera and starts testing; `deactivate`
    unsubscribes and stops the running search after its current generation (its summary is
    written); `cleanup` closes the results and frees the model; `shutdown` does what is needed of
    both. The camera callback only keeps the newest message in a one-slot buffer (older unsearched
    frames are counted as dropped); a timer hands it to a worker thread at most every
    `frame_period_s`; the worker runs `core.search.run_search`, whose results are stored before
    anything is published. Services `~/search_now` and `~/stop_search` (std_srvs/Trigger) search the
    newest frame at once and stop the running search.
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
        self._job: _Job | None = None
        self._busy = False
        self._last_start = -math.inf
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._pending: tuple[Any, TesterSettings] | None = None
        self._store: ResultsStore | None = None
        self._worker: threading.Thread | None = None
        self.backend: VLMBackend | None = None  # the model: the probe topics or an inprocess one
        self.probe: RosProbeBackend | None = None
        self._camera: Any = None
        self._made: list[Any] = []  # publishers and timers of the configured node
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
        # Before a model loads: what is known of the identity already (an inprocess model's id).
        known = settings.endpoint == 'inprocess' and self._given_backend is None
        check_identity(settings, settings.model['model'] if known else None)
        self.backend = self._make_backend(settings)
        try:
            check_identity(settings, *self._model_identity(settings))
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
        self.violations_pub = self.create_transient_publisher(DiagnosticArray, 'violations', RESULT_QOS)
        self.violation_image_pub = self.create_transient_publisher(Image, 'violation_image', RESULT_QOS)
        self.diagnostics_pub = self.create_transient_publisher(DiagnosticArray, '/diagnostics', RESULT_QOS)
        self._made = [
            self.violations_pub,
            self.violation_image_pub,
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
        if self._worker is not None:
            self._worker.join(FINISH_WAIT_S)
            if self._worker.is_alive():
                self.get_logger().warning('the search worker is still busy; cleaned up without it')
            self._worker = None
        if self._store is not None:
            self._store.close()
            self._store = None
        self.destroy_entities(self._made)
        self._made = []
        self._release_backend()
        self.state = 'unconfigured'

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

    def _model_identity(self, settings: TesterSettings) -> tuple[str | None, str | None]:
        """The model part of the identity known now: (model id, weights sha256), None where not known."""
        if self.backend is None:
            return None, None
        if settings.endpoint == 'ros':
            return self.backend.model_id or None, None
        digest = getattr(self.backend, 'weights_hash', None)
        return self.backend.model_id, (digest() if callable(digest) else '') or None

    def _parameter_values(self) -> dict[str, Any]:
        names = self.list_parameters([], 0).names
        return {param.name: param.value for param in self.get_parameters(names)}

    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        values = self._parameter_values()
        values.update({p.name: p.value for p in parameters})
        try:
            settings = settings_from_parameters(values)
            if self.backend is not None:  # configured: the next search writes into results_dir
                check_identity(settings, *self._model_identity(settings))
        except MetaVLMError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, parameters: list[Parameter]) -> None:
        # Only once every check has passed and the values are set: the settings never hold a refused value.
        settings = settings_from_parameters(self._parameter_values())
        with self._lock:
            self.settings = settings  # taken by the next search; the running one keeps its own

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

    def _storage_failed(self, exc: StorageError) -> None:
        """Results could not be written: pause searches (logged once) until the disk has room again."""
        first = self.storage_failure is None
        self.storage_failure = exc
        self._free_at_failure = free_disk_bytes(self.settings.results_dir)
        self._error(str(exc))
        self.state = 'paused: results cannot be written'
        if first:
            self.get_logger().error(f'search stopped: {exc}; searches pause until the results disk has room')

    def _storage_paused(self, settings: TesterSettings) -> bool:
        if self.storage_failure is None:
            return False
        if free_disk_bytes(settings.results_dir) > self._free_at_failure + MIB:
            self.storage_failure = None
            self.get_logger().info('the results disk has room again: searches resume')
            return False
        return True

    def _search(self, msg: Any, settings: TesterSettings) -> None:
        if self._check_disk(settings) or self._storage_paused(settings):
            self.searches_paused_disk += 1
            if self.storage_failure is None:
                self.state = 'paused: results disk below min_free_disk_mb'
            return
        # Run-time changes of the transport size take effect here, between searches, never within one:
        # each search sends its frames through a reduction of its own.
        backend = TransportSizeBackend(self.backend, settings.transport_size)
        try:
            # The frame's one check and its one resize, where it enters: what the search would refuse
            # (a 1x1 frame) is unreadable. The auto working size follows the transport size.
            camera = image_msg_to_rgb(msg)
            prepared = prepare_frame(camera, settings.search, backend.input_size)
        except InputError as exc:
            self.frames_unreadable += 1
            self._error(f'camera frame unreadable: {exc}')
            self.get_logger().warning(
                f'camera frame skipped ({self.frames_unreadable} unreadable so far): {exc}',
                throttle_duration_sec=WARN_PERIOD_S,
            )
            return
        if self.probe is not None:
            self.probe.timeout_s = settings.probe_timeout_s
        stamp_ns = stamp_to_ns(msg.header.stamp)
        image_id = f'{msg.header.frame_id or "camera"}@{stamp_ns}'
        self.state = 'judging the source frame'
        # The source prediction doubles as a health check of the perception node.
        source = backend.predict([prepared.rgb])[0]
        if source is None and self.probe is not None and 0 in self.probe.errors:
            self.frames_unreadable += 1
            self._error(f'the perception node refused the frame: {self.probe.errors[0]}')
            self.get_logger().warning(self.last_error, throttle_duration_sec=WARN_PERIOD_S)
            return
        if source is None:
            self.state = 'perception node not answering'
            self.get_logger().warning('the perception node did not answer; frame skipped, waiting for it')
            return
        # The model that answered is known now: the directory holds this search's identity, or none yet.
        identity = check_identity(settings, *self._model_identity(settings))
        store = self._results(settings.results_dir)
        if read_identity(store.directory) is None:
            write_identity(store.directory, identity)
            store.count_written((store.directory / IDENTITY).stat().st_size)
        store.reserve_bytes = settings.min_free_disk_mb * MIB
        store.max_bytes = settings.results_max_mb * MIB
        self._stopped_for_disk = False
        job = _Job(prepared.rgb, msg, stamp_ns, image_id, settings, backend)
        job.extra['model'] = backend.model_id
        # Which camera pixels were searched (once per search): the frame part of the searches' identity.
        job.extra['frame_sha256'] = frame_digest(camera)
        with self._lock:
            self._job = job
        self.state = 'searching'
        result = run_search(
            prepared,
            backend,
            settings.search,
            image_id=image_id,
            store=store,
            on_evaluation=self._on_evaluation,
            should_stop=self._should_stop,
            extra_fields=job.extra,
            source=source,
        )
        self._finish(result, job)

    def _should_stop(self) -> bool:
        job = self._job
        if self._stopping.is_set() or not self.active or (job is not None and job.stop_reason):
            return True
        if job is not None and self._check_disk(job.settings):
            self._stopped_for_disk = True
            return True
        return self.probe is not None and self.probe.consecutive_failed_rounds >= FAILED_ROUNDS_TO_PAUSE

    def _check_disk(self, settings: TesterSettings) -> bool:
        """Measure the results disk's free space; True while it is below min_free_disk_mb (never when 0).

        Each change between enough and too little space is logged once.
        """
        free = free_disk_bytes(settings.results_dir) / MIB
        self.disk_free_mb = free
        low = settings.min_free_disk_mb > 0 and free < settings.min_free_disk_mb
        if low and not self._disk_low:
            self.get_logger().warning(
                f'only {free:.0f} MiB free on the disk of {settings.results_dir}, below min_free_disk_mb '
                f'{settings.min_free_disk_mb}: searches pause and follow-up PNGs are not written '
                'until space is freed'
            )
        elif self._disk_low and not low:
            self.get_logger().info(f'{free:.0f} MiB free on the results disk again: searches resume')
        self._disk_low = low
        return low

    def _error(self, text: str) -> None:
        self.last_error, self.last_error_time = text, time.monotonic()

    def _finish(self, result: SearchResult, job: _Job) -> None:
        self.searches_done += 1
        if not result.stopped:
            # A search that ran to its end shows that the error is past: /diagnostics clears it.
            self.last_error, self.last_error_time = '', None
        self.last_hypervolume = result.hypervolume
        self.last_rate = len(result.evaluations) / max(result.seconds, 1e-9)
        if result.stopped:
            self.searches_stopped += 1
            if job.stop_reason:
                reason = job.stop_reason
            elif self._stopped_for_disk:
                reason = 'the results disk fell below min_free_disk_mb'
            else:
                reason = 'the perception node stopped answering'
            self.state = 'search stopped: ' + reason
            text = (
                f'search of {job.image_id} stopped after {len(result.evaluations)} evaluations ({reason}); '
                'its results are kept'
            )
            # A stop that was asked for is news, not a problem; the other two are. (One call site per
            # severity: rclpy refuses a logging call whose severity changes between calls.)
            if job.stop_reason:
                self.get_logger().info(text)
            else:
                self.get_logger().warning(text)
        else:
            self.state = 'idle'
        store = self._store
        if store is not None and store.over_budget() != self._over_budget:
            self._over_budget = store.over_budget()
            if self._over_budget:
                self.get_logger().warning(
                    f'{store.directory} reached results_max_mb {job.settings.results_max_mb}: no more '
                    'follow-up PNGs are written (each can be rendered again); records go on, none deleted'
                )
        self.get_logger().info(
            f'searched {job.image_id}: {len(result.evaluations)} evaluations in {result.seconds:.1f} s, '
            f'hypervolume {result.hypervolume:.4f}'
        )

    def _results(self, directory: str) -> ResultsStore:
        if self._store is None or self._store.directory != Path(directory):
            if self._store is not None:
                self._store.close()
            self._store = ResultsStore(directory)
            # violations.jsonl exists from configure on (empty until a violation), as users know it;
            # the store appends to it.
            (self._store.directory / VIOLATIONS).touch()
        return self._store

    def _on_evaluation(self, ev: Evaluation, result: SearchResult) -> None:
        job = self._job
        self.evaluations += 1
        if job is not None:
            job.evaluations += 1
        if ev.failed:
            self.evaluations_failed += 1
            return
        if ev.composition.order == 0:
            return
        self.judged += 1
        key = published_flag(ev.violation, job.settings.report_threshold if job else 0.05)
        if not ev.violation.get(key) or job is None:
            return
        self.violations += 1
        if ev.cached:
            return  # already published when this composition was first judged on this frame
        self._publish_violation(ev, result, job)

    def _publish_violation(self, ev: Evaluation, result: SearchResult, job: _Job) -> None:
        # The very pixels the search judged (its own warp), never rendered again.
        followup = ev.followup_frame
        store = self._results(job.settings.results_dir)
        name = f'{_safe(job.image_id)}_violation_e{ev.index:05d}'
        path = None
        # PNGs are bounded per search: a model that breaks on everything must not fill the disk. The
        # search writes its Pareto set's PNGs itself; the record of every violation is always kept.
        if job.violation_pngs < job.settings.violation_pngs_per_search:
            path = store.save_frame(name, followup)  # None: the disk reserve was reached
            job.violation_pngs += path is not None
        else:
            self.violation_pngs_skipped += 1
        relative = None if path is None else str(path.relative_to(store.directory))
        record = {**evaluation_record(ev, result, job.extra), 'frame': relative}
        # Stored and flushed before it is published: what subscribers saw is always on disk.
        store.append_violation(record)
        array = DiagnosticArray()
        array.header = job.header
        array.status = [
            violation_status(ev, result.source, job.stamp_ns, image=job.image_id, frame=relative or '')
        ]
        self.violations_pub.publish(array)
        if job.settings.publish_violation_images:
            # Both frames as the model was sent them (the search's transport size).
            picture = violation_image(
                job.backend.reduce(job.frame),
                job.backend.reduce(followup),
                ev.composition.label,
                result.source.values,
                ev.followup.values if ev.followup else {},
                kind=result.source.kind,
                f_trans=ev.f_trans,
                f_pred=ev.f_pred,
                height=job.settings.violation_image_height,
            )
            self.violation_image_pub.publish(rgb_to_image_msg(picture, job.header))

    # -- health ---------------------------------------------------------------------------------------

    def diagnostics(self) -> DiagnosticStatus:
        """The tester's health as one DiagnosticStatus (published on /diagnostics about once a second)."""
        job = self._job
        if job is not None:
            elapsed = time.monotonic() - job.started
            rate = job.evaluations / elapsed if elapsed > 0 else float('nan')
        else:
            rate = self.last_rate
        answering = self.perception_answering
        level, message = DiagnosticStatus.OK, self.state
        if self._check_disk(self.settings):
            level = DiagnosticStatus.WARN
            message = f'results disk nearly full: {self.disk_free_mb:.0f} MiB free, searches paused'
        elif self._over_budget:
            level = DiagnosticStatus.WARN
            message = f'results_max_mb reached: no more PNGs, records go on ({self.state})'
        elif self.probe is not None and not self._endpoint_ready():
            level, message = DiagnosticStatus.WARN, 'perception node absent: probe topics not matched'
        elif answering is False and self.probe is not None and self.probe.sent > 0:
            level, message = DiagnosticStatus.WARN, 'perception node not answering probes'
        latency = self.probe.latency if self.probe is not None else None
        store = self._store
        size = store.size_bytes if store is not None else 0
        mb_per_min = self._write_rate.update(size) if store is not None else float('nan')
        max_bytes = self.settings.results_max_mb * MIB
        values = {
            'state': self.state,
            'endpoint': self.settings.endpoint,
            'searches_done': self.searches_done,
            'searches_stopped': self.searches_stopped,
            'evaluations': self.evaluations,
            'evaluations_failed': self.evaluations_failed,
            'evaluations_per_s': rate,
            'violations': self.violations,
            'violation_rate': self.violations / self.judged if self.judged else float('nan'),
            'last_hypervolume': self.last_hypervolume,
            'probe_latency_p50_ms': latency.percentile_ms(50) if latency else float('nan'),
            'probe_latency_p95_ms': latency.percentile_ms(95) if latency else float('nan'),
            'frames_received': self.frames_received,
            'frames_dropped': self.frames_dropped,
            'frames_unreadable': self.frames_unreadable,
            'disk_free_mb': self.disk_free_mb,
            'searches_paused_disk': self.searches_paused_disk,
            'frames_not_saved': self._store.frames_skipped if self._store is not None else 0,
            'results_mb': size / 1e6,
            'results_mb_per_min': mb_per_min,
            'results_hours_left': WriteRate.hours_left(size, max_bytes, mb_per_min),
            'frames_over_budget': store.frames_over_budget if store is not None else 0,
            'violation_pngs_skipped': self.violation_pngs_skipped,
            'camera_callback_max_ms': self.camera_callback_max_s * 1000.0,
            'perception_answering': 'n/a' if answering is None else str(answering).lower(),
            'last_error': self.last_error,
            'last_error_age_s': (
                float('nan') if self.last_error_time is None else time.monotonic() - self.last_error_time
            ),
        }
        return DiagnosticStatus(
            level=level,
            name=DIAGNOSTIC_STATUS,
            message=message,
            hardware_id=NODE_NAME,
            values=[KeyValue(key=k, value=_text(v)) for k, v in values.items()],
        )

    def publish_diagnostics(self) -> None:
        """Publish the health status on /diagnostics."""
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [self.diagnostics()]
        self.diagnostics_pub.publish(array)

    def destroy_node(self) -> None:
        """Stop the search worker (if the node was not shut down first), then destroy the node."""
        if not self.finalized and self._worker is not None:
            self.stop_search('the node is destroyed')
            self._cleanup()
        super().destroy_node()


def _text(value: Any) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.6g}'
    return str(value)


def _safe(name: str) -> str:
    return ''.join(c if c.isalnum() or c in '-_.' else '_' for c in name)


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
