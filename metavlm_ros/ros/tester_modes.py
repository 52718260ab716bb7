"""The tester's failure modes on /diagnostics: the top modes of its results, learnt again as they grow."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from metavlm_ros.common.errors import MetaVLMError
from metavlm_ros.common.results import holds_results
from metavlm_ros.explain.catalogue import CatalogueSettings
from metavlm_ros.explain.tracker import Learnt, ModeTracker
from metavlm_ros.method.records import evaluation_record, summary_record
from metavlm_ros.method.search import SearchResult
from metavlm_ros.ros.tester_settings import NODE_NAME, TesterSettings

__all__ = ['MODES_STATUS', 'SHOWN_MODES', 'ModesStatus']

#: The name of the status that carries the tester's failure modes.
MODES_STATUS = 'metavlm_tester: failure modes'
#: The modes /diagnostics names, best first (`metavlm modes` on the results directory has them all).
SHOWN_MODES = 3
# How often the learner thread looks for new searches when nothing wakes it.
_POLL_S = 1.0


class _Learner:
    """One results directory's tracker, the searches handed to it, and the thread that learns from them."""

    def __init__(self, tracker: ModeTracker, period_s: float, log: Callable[[str], None]) -> None:
        self.tracker, self.period_s, self.log = tracker, period_s, log
        self.wake = threading.Condition()
        self.queue: deque[tuple[SearchResult, dict, object]] = deque()
        self.stopped = threading.Event()
        self.learnt: Learnt | None = None
        self.error = ''
        self.thread = threading.Thread(target=self._run, name='metavlm-modes', daemon=True)
        self.thread.start()

    def add(self, result: SearchResult, extra: dict, backend: object) -> None:
        with self.wake:
            self.queue.append((result, extra, backend))
            self.wake.notify()

    def stop(self) -> None:
        self.stopped.set()
        with self.wake:
            self.wake.notify_all()

    def _run(self) -> None:
        tracker = self.tracker
        try:
            if holds_results(tracker.directory):
                tracker.load()
        except (MetaVLMError, OSError) as exc:
            self.log(f'failure modes: the records already in {tracker.directory} are not read ({exc})')
        last = -math.inf
        while not self.stopped.is_set():
            with self.wake:
                searches = list(self.queue)
                self.queue.clear()
            for result, extra, backend in searches:
                # The records as the store wrote them, made here: the search worker only hands over.
                records = [evaluation_record(ev, result, extra) for ev in result.evaluations]
                tracker.add_search([summary_record(result, backend, extra)], records)
            wait = last + self.period_s - time.monotonic()
            if tracker.pending and wait <= 0:
                try:
                    self.learnt, self.error = tracker.learn(), ''
                except Exception as exc:  # a bug in learning must not end the thread nor the node
                    self.error = f'{type(exc).__name__}: {exc}'
                    self.log(f'failure modes not learnt: {self.error}')
                last = time.monotonic()
                continue
            with self.wake:
                if not self.queue and not self.stopped.is_set():
                    self.wake.wait(min(_POLL_S, wait) if tracker.pending else _POLL_S)


class ModesStatus:
    """The failure modes of the tester's results directory, kept current in a thread of their own.

    `reset` (configure, a parameter change) starts a learner thread on `results_dir` with a fresh
    `ModeTracker`: it first adds what the directory already holds, then each search handed over by
    `add` as it ends. The catalogue is learnt again at most every `modes_period_s`, once new violations
    arrived, from a uniform sample of at most `modes_sample` evaluations: its cost is bounded whatever
    the length of the dive, and it never runs in a callback or in the search worker. `statuses` (the
    diagnostics timer) only reads the last catalogue.
    """

    def __init__(self) -> None:
        self._learner: _Learner | None = None
        self._for: tuple | None = None

    def reset(self, settings: TesterSettings, log: Callable[[str], None]) -> None:
        """Follow `settings` from now on: off when modes_period_s is 0; a new tracker (the directory read
        again) when results_dir, report_threshold or modes_sample changed; else only the period."""
        key = (str(Path(settings.results_dir).resolve()), settings.report_threshold, settings.modes_sample)
        learner = self._learner
        if learner is not None and key == self._for and settings.modes_period_s > 0:
            learner.period_s = settings.modes_period_s
            with learner.wake:
                learner.wake.notify()  # a shorter period takes effect now
            return
        if learner is not None:
            learner.stop()  # not waited for here (a parameter callback): it ends after its catalogue
        self._learner, self._for = None, None
        if settings.modes_period_s > 0:
            tracker = ModeTracker(
                settings.results_dir,
                CatalogueSettings(threshold=settings.report_threshold),
                capacity=settings.modes_sample,
            )
            self._learner, self._for = _Learner(tracker, settings.modes_period_s, log), key

    def add(self, result: SearchResult, extra: dict, backend: object) -> None:
        """Hand over a finished search (its records are made in the learner thread, not here)."""
        learner = self._learner
        if learner is not None and result.evaluations:
            learner.add(result, extra, backend)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the learner thread, waiting at most `timeout_s` for the catalogue it may be learning."""
        learner, self._learner, self._for = self._learner, None, None
        if learner is not None:
            learner.stop()
            learner.thread.join(timeout_s)

    def statuses(self) -> list[DiagnosticStatus]:
        """The modes' status (none while off): the top modes' rules, support and rates as values."""
        learner = self._learner
        if learner is None:
            return []
        tracker, learnt = learner.tracker, learner.learnt
        values: dict[str, object] = {
            'modes': 0,
            'evaluations_seen': tracker.seen,
            'evaluations_sampled': min(tracker.usable, tracker.capacity),
            'violations_seen': tracker.violations,
            'violations_pending': tracker.pending,
            'learnt_from': 0,
            'learnt_age_s': float('nan'),
            'learn_s': float('nan'),
            'period_s': learner.period_s,
        }
        message, modes = 'none learnt yet', []
        if learnt is not None:
            modes = learnt.catalogue.modes if learnt.catalogue is not None else []
            values.update(
                modes=len(modes),
                learnt_from=learnt.sampled,
                learnt_age_s=time.monotonic() - learnt.at,
                learn_s=learnt.seconds,
            )
            message = f'{len(modes)} mode(s)' + (f'; 1. {modes[0].rule}' if modes else '')
        for rank, mode in enumerate(modes[:SHOWN_MODES], start=1):
            example = mode.example
            values.update({
                f'mode_{rank}': mode.rule,
                f'mode_{rank}_change': mode.change.label,
                f'mode_{rank}_relations': ','.join(sorted({c.feature.relation for c in mode.conditions
                                                           if c.feature.relation})),
                f'mode_{rank}_violations': mode.violations_inside,
                f'mode_{rank}_evaluations': mode.evaluations_inside,
                f'mode_{rank}_rate_inside': mode.rate_inside,
                f'mode_{rank}_rate_outside': mode.rate_outside,
                f'mode_{rank}_frames': mode.frames,
                f'mode_{rank}_searches': mode.searches,
                f'mode_{rank}_example': example['render'] if example else '',
            })  # fmt: skip
        level = DiagnosticStatus.OK
        if learner.error:
            level, values['error'] = DiagnosticStatus.WARN, learner.error
        return [
            DiagnosticStatus(
                level=level,
                name=MODES_STATUS,
                message=message,
                hardware_id=NODE_NAME,
                values=[KeyValue(key=k, value=_text(v)) for k, v in values.items()],
            )
        ]


def _text(value: object) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.6g}'
    return str(value)
