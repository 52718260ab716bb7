"""The tester's searches and what it keeps and publishes of them: results, violations, /diagnostics."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.qos import (
    QoSDurabilityPolicy,
    QoSHistoryPolicy,
    QoSProfile,
    QoSReliabilityPolicy,
)

from metavlm_ros.common.errors import InputError, ParameterError, StorageError
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
from metavlm_ros.method.search import (
    Evaluation,
    SearchResult,
    evaluation_record,
    prepare_frame,
    run_search,
)
from metavlm_ros.ros.conversions import image_msg_to_rgb, rgb_to_image_msg, stamp_to_ns
from metavlm_ros.ros.probe_client import TransportSizeBackend
from metavlm_ros.ros.tester_identity import check_identity
from metavlm_ros.ros.tester_settings import NODE_NAME, TesterSettings
from metavlm_ros.ros.tester_violations import published_flag, violation_status
from metavlm_ros.ros.visualisation import detection_outlines, followup_overlay, violation_image
from metavlm_ros.viewer.live import LiveResults, LiveServer

__all__ = ['DIAGNOSTIC_STATUS', 'RESULT_QOS', 'SearchJob', 'TesterOutput']

DIAGNOSTIC_STATUS = 'metavlm_tester: search'
# Consecutive probe rounds with no answer at all after which a search is given up (its results are
# kept) and the tester waits for the perception node instead of recording failure after failure.
FAILED_ROUNDS_TO_PAUSE = 3
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


class SearchJob:
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


class TesterOutput:
    """The search of one camera frame and what the tester keeps and publishes of it: a part of
    TesterNode, apart from its lifecycle, services, parameters and scheduling."""

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
        identity = check_identity(settings, self._model_identity(settings))
        store = self._results(settings.results_dir)
        if read_identity(store.directory) is None:
            write_identity(store.directory, identity)
            store.count_written((store.directory / IDENTITY).stat().st_size)
        store.reserve_bytes = settings.min_free_disk_mb * MIB
        store.max_bytes = settings.results_max_mb * MIB
        self._stopped_for_disk = False
        job = SearchJob(prepared.rgb, msg, stamp_ns, image_id, settings, backend)
        job.extra['model'] = backend.model_id
        # Which camera pixels were searched (once per search): the frame part of the searches' identity.
        job.extra['frame_sha256'] = frame_digest(camera)
        with self._lock:
            self._job = job
        self.state = 'searching'
        live = self.live_results(store)
        if live is not None:
            # Sent to Foxglove should the store keep no source frame; boxes are in the camera's pixels.
            live.next_source(prepared.rgb, prepared.source_size)
        result = run_search(
            prepared,
            backend,
            settings.search,
            image_id=image_id,
            store=store if live is None else live,
            on_generation=self._on_generation,
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

    def _error(self, text: str) -> None:
        self.last_error, self.last_error_time = text, time.monotonic()

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

    def _finish(self, result: SearchResult, job: SearchJob) -> None:
        self.searches_done += 1
        settings = job.settings
        self.criteria_status.add(result, settings.search.identity(), job.extra, settings.results_dir)
        self.modes_status.add(result, job.extra, job.backend)
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
            elif getattr(self.backend, 'failure', ''):
                # An inprocess served model says why it stopped (its server went away): /diagnostics
                # shows it until a search runs to its end again, as when the server is back.
                reason = str(self.backend.failure)
                self._error(reason)
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
            # violations.jsonl(.gz) exists from configure on (no record until a violation), as users
            # know it; the store appends to it.
            self._store.create(VIOLATIONS)
        return self._store

    def _on_generation(self, batch: list[Evaluation], result: SearchResult) -> None:
        """Count a generation's evaluations and publish its new violations, once they are on disk:
        their records as one gzip member (violations.jsonl), written before any of them goes out."""
        job = self._job
        if job is not None:  # a detection search's box figures (/diagnostics); other kinds add nothing
            self.boxes_status.add(batch, job.settings.search.iou_threshold)
        published = []
        for ev in batch:
            self.evaluations += 1
            if job is not None:
                job.evaluations += 1
            if ev.failed:
                self.evaluations_failed += 1
                continue
            if ev.composition.order == 0:
                continue
            self.judged += 1
            key = published_flag(ev.violation, job.settings.report_threshold if job else 0.05)
            if not ev.violation.get(key) or job is None:
                continue
            self.violations += 1
            if not ev.cached:  # a cached one went out when this composition was first judged on this frame
                published.append(ev)
        if not published:
            return
        store = self._results(job.settings.results_dir)
        records = [self._violation_record(ev, result, job, store) for ev in published]
        # Stored and flushed before they are published: what subscribers saw is always on disk.
        live = self.live_results(store)
        if live is not None:
            live.append_violations(records, [ev.followup_frame for ev in published])  # and to Foxglove
        else:
            store.append_violations(records)
        for ev, record in zip(published, records, strict=True):
            self._publish_violation(ev, result, job, record)

    def _violation_record(self, ev: Evaluation, result: SearchResult, job: SearchJob, store) -> dict:
        """The violations.jsonl record of a violation about to be published, its follow-up PNG written
        first while the search's cap allows (`violation_pngs_per_search`)."""
        path = None
        # PNGs are bounded per search: a model that breaks on everything must not fill the disk. The
        # search writes its Pareto set's PNGs itself; the record of every violation is always kept.
        if job.violation_pngs < job.settings.violation_pngs_per_search:
            # The very pixels the search judged (its own warp), never rendered again.
            name = f'{_safe(job.image_id)}_violation_e{ev.index:05d}'
            path = store.save_frame(name, ev.followup_frame)  # None: the disk reserve was reached
            job.violation_pngs += path is not None
        else:
            self.violation_pngs_skipped += 1
        relative = None if path is None else str(path.relative_to(store.directory))
        return {**evaluation_record(ev, result, job.extra), 'frame': relative}

    def _publish_violation(self, ev: Evaluation, result: SearchResult, job: SearchJob, record: dict) -> None:
        followup = ev.followup_frame
        array = DiagnosticArray()
        array.header = job.header
        array.status = [
            violation_status(
                ev,
                result.source,
                job.stamp_ns,
                image=job.image_id,
                frame=record['frame'] or '',
                boxes=record.get('boxes'),
                found=record.get('followup_detections'),
            )
        ]
        self.violations_pub.publish(array)
        if job.settings.publish_violation_images:
            # Both frames as the model was sent them (the search's transport size), boxes with them.
            sent, sent_followup = job.backend.reduce(job.frame), job.backend.reduce(followup)
            shrink = (sent.shape[1] / job.frame.shape[1], sent.shape[0] / job.frame.shape[0])
            outlines = detection_outlines(result.source, ev.boxes, ev.followup, shrink)
            picture = violation_image(
                sent,
                sent_followup,
                ev.composition.label,
                result.source.values,
                ev.followup.values if ev.followup else {},
                kind=result.source.kind,
                f_trans=ev.f_trans,
                f_pred=ev.f_pred,
                height=job.settings.violation_image_height,
                source_outlines=outlines[0],
                followup_outlines=outlines[1],
            )
            self.violation_image_pub.publish(rgb_to_image_msg(picture, job.header))
            if self.violation_followup_pub.get_subscription_count():  # drawn only for a subscriber
                # The follow-up with the overlay Foxglove draws on it, as pixels for rqt and rviz.
                overlaid = followup_overlay(sent_followup, record, height=job.settings.violation_image_height)
                self.violation_followup_pub.publish(rgb_to_image_msg(overlaid, job.header))

    # -- Foxglove ------------------------------------------------------------------------------------

    def _start_live(self, settings: TesterSettings) -> LiveServer | None:
        """The Foxglove server `foxglove_port` asks for (None: 0, off)."""
        if not settings.foxglove_port:
            return None
        try:
            live = LiveServer(settings.foxglove_port, settings.foxglove_host)
        except ParameterError as exc:
            raise ParameterError(f'parameter foxglove_port: {exc}') from None
        self.get_logger().info(f'serving the searches live to Foxglove at {live.url}')
        return live

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None
        self._live_results = None

    def live_results(self, store: ResultsStore) -> LiveResults | None:
        """The results store as the Foxglove server publishes it (None: no server)."""
        if self.live is None:
            return None
        if self._live_results is None or self._live_results[0] is not store:
            # The tester's violations are those it publishes (its report threshold), as the export
            # of its results directory shows them.
            self._live_results = (store, LiveResults(store, self.live, published=True))
        return self._live_results[1]

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
            'foxglove': self.live.url if self.live is not None else 'off',
            'foxglove_viewers': self.live.viewers if self.live is not None else 0,
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
        array.status = [
            self.diagnostics(),
            *self.criteria_status.statuses(),
            *self.modes_status.statuses(),
            *self.boxes_status.statuses(),
        ]
        self.diagnostics_pub.publish(array)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.6g}'
    return str(value)


def _safe(name: str) -> str:
    return ''.join(c if c.isalnum() or c in '-_.' else '_' for c in name)
