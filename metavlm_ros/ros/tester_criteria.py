"""The tester's acceptance criteria: each criterion's status kept current, search by search (/diagnostics)."""

from __future__ import annotations

import threading
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.judge import Tally
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS, Verdict
from metavlm_ros.common.errors import MetaVLMError
from metavlm_ros.common.results import holds_results
from metavlm_ros.method.records import evaluation_record
from metavlm_ros.method.search import SearchResult

__all__ = ['CRITERION_STATUS', 'CriteriaStatus', 'LEVELS']

#: The name of each criterion's status on /diagnostics, with its id after it.
CRITERION_STATUS = 'metavlm_tester: criterion'
#: PASS, INCONCLUSIVE, FAIL as rqt_runtime_monitor and Foxglove show them.
LEVELS = {PASS: DiagnosticStatus.OK, INCONCLUSIVE: DiagnosticStatus.WARN, FAIL: DiagnosticStatus.ERROR}


class CriteriaStatus:
    """The criteria of the tester's `criteria_file`, judged on its results directory: what it held at
    configure, then every search as it ends. Thread-safe: searches add, the diagnostics timer reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tally: Tally | None = None
        self._for: tuple[str, str] | None = None
        self._verdicts: list[Verdict] = []
        self.error = ''

    def reset(self, criteria: Criteria | None, results_dir: str, log) -> None:
        """Judge `criteria` from now on (None: none), starting from the evidence `results_dir` holds."""
        if criteria is None:
            with self._lock:
                self._tally, self._for, self._verdicts = None, None, []
            return
        key = (criteria.sha256, str(Path(results_dir).resolve()))
        if key == self._for:
            return
        tally = Tally(criteria, results_dir)
        if holds_results(results_dir):
            try:
                for run in load_evidence(results_dir).runs:
                    tally.add(run.directory, run.settings, run.records)
            except MetaVLMError as exc:
                log(f'criteria_file: the records already in {results_dir} are not judged ({exc})')
                tally = Tally(criteria, results_dir)
        with self._lock:
            self._tally, self._for = tally, key
            self._verdicts = tally.verdicts()

    def add(self, result: SearchResult, settings: dict, extra: dict, results_dir: str) -> None:
        """Judge again with one more search (its evaluation records as the store wrote them)."""
        tally = self._tally
        if tally is None or not result.evaluations:
            return
        records = [evaluation_record(ev, result, extra) for ev in result.evaluations]
        try:
            with self._lock:
                tally.add(Path(results_dir), settings, records)
                self._verdicts = tally.verdicts()
            self.error = ''
        except MetaVLMError as exc:
            self.error = str(exc)

    def statuses(self) -> list[DiagnosticStatus]:
        """One status per criterion: level by verdict, the claim and status as the message, the figures."""
        with self._lock:
            verdicts = list(self._verdicts)
        out = []
        for v in verdicts:
            values = {'status': v.status, 'kind': v.kind, 'reason': v.reason, **v.figures}
            if self.error:
                values['error'] = self.error
            out.append(
                DiagnosticStatus(
                    level=LEVELS[v.status],
                    name=f'{CRITERION_STATUS} {v.criterion}',
                    message=f'{v.status}: {v.claim}',
                    hardware_id='metavlm_tester',
                    values=[KeyValue(key=str(k), value=_text(x)) for k, x in values.items()],
                )
            )
        return out


def _text(value) -> str:
    if isinstance(value, float):
        return f'{value:.6g}'
    return 'none' if value is None else str(value)
