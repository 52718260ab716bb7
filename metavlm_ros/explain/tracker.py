"""A catalogue kept current as evidence grows, at a bounded cost: learnt from a uniform sample of it."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from metavlm_ros.assurance.evidence import Run
from metavlm_ros.common.record_format import iter_jsonl
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, read_identity
from metavlm_ros.explain.catalogue import Catalogue, CatalogueSettings, build_catalogue
from metavlm_ros.explain.changes import answer_changes
from metavlm_ros.explain.features import feature_table

__all__ = ['DEFAULT_SAMPLE', 'Learnt', 'ModeTracker']

#: Evaluations a tracker keeps by default. Measured (bench/modes.py, 2 shared cores): a catalogue of
#: 50,000 evaluations takes 1 to 2 s and the sample about 50 MiB; a tester hour at the defaults
#: judges about 460,000 (docs/results.md): `metavlm modes` on all of them took 33 s and 2.6 GiB.
DEFAULT_SAMPLE = 50_000

# What the catalogue reads of a record (explain/features.py, changes.py, catalogue.py): the rest of a
# record (genotype, texts, criteria, strengths) is not kept.
_KEPT = (
    'kind', 'image', 'algorithm', 'seed', 'run', 'index', 'order', 'composition', 'parameters',
    'f_trans', 'f_pred', 'source', 'followup', 'boxes', 'followup_detections',
)  # fmt: skip
_SUMMARY_KEPT = ('image', 'algorithm', 'seed', 'run', 'source_frame', 'source_sha256')


@dataclass(frozen=True)
class Learnt:
    """A catalogue and what it was learnt from.

    Attributes:
        catalogue: The catalogue (None: nothing to learn from yet).
        seen: Evaluations the tracker was given (failed ones and identities too).
        sampled: Evaluations the catalogue was learnt from: a uniform sample of the usable ones seen.
        violations: Usable evaluations seen with an answer change at the catalogue's threshold.
        seconds: How long learning took (the sample's feature table and the trees).
        at: `time.monotonic()` when it was learnt.
    """

    catalogue: Catalogue | None
    seen: int
    sampled: int
    violations: int
    seconds: float
    at: float


class ModeTracker:
    """The failure modes of one results directory as it grows, learnt again on demand at a bounded cost.

    Every evaluation added is counted; the catalogue learns from at most `capacity` of them, a uniform
    sample of every usable evaluation seen (reservoir sampling, Vitter's Algorithm R, seeded): memory
    and the time one catalogue takes stay bounded however long the evidence grows, and the rates
    inside and outside each rule are those of the whole evidence, estimated from the sample. Until
    `capacity` evaluations were seen the sample is all of them, and the catalogue is exactly
    `metavlm modes` on the directory. Records are kept slimmed to what the catalogue reads; each
    source frame's look is measured once. Thread-safe: one thread adds, another learns.
    """

    def __init__(self, directory: str | Path, settings: CatalogueSettings, capacity: int = DEFAULT_SAMPLE):
        self.directory = Path(directory)
        self.settings = settings
        self.capacity = capacity
        self._threshold = settings.threshold or 0.0
        self._lock = threading.Lock()
        self._random = random.Random(settings.seed)
        self._sample: list[dict] = []
        self._summaries: list[dict] = []
        self._frames: dict[str, dict[str, float]] = {}
        self._sources: dict[tuple, dict] = {}  # each search's source answer, once
        self._identity: dict | None = None
        self.seen = 0
        self.usable = 0
        self.violations = 0
        #: Violations added since the catalogue was last learnt.
        self.pending = 0

    def load(self) -> None:
        """Add what the directory already holds, streamed (never all its records in memory at once)."""
        self.add_search(iter_jsonl(self.directory / SUMMARY), iter_jsonl(self.directory / EVALUATIONS))

    def add_search(self, summaries: Iterable[dict], records: Iterable[dict]) -> None:
        """Add the summary records and the evaluation records of searches (whole records, as stored)."""
        if self._identity is None:
            self._identity = read_identity(self.directory)
        with self._lock:
            self._summaries += [{k: s.get(k) for k in _SUMMARY_KEPT} for s in summaries]
            for record in records:
                self._add(record)

    def _add(self, record: dict) -> None:
        self.seen += 1
        if record.get('failed') or not record.get('order') or not isinstance(record.get('parameters'), dict):
            return  # never in a feature table (explain/features.py)
        if answer_changes(record, self._threshold):
            self.violations += 1
            self.pending += 1
        slim = self._slim(record)
        self.usable += 1
        if len(self._sample) < self.capacity:
            self._sample.append(slim)
            return
        # Algorithm R: the t-th usable evaluation replaces a kept one with probability capacity / t.
        j = self._random.randrange(self.usable)
        if j < self.capacity:
            self._sample[j] = slim

    def _slim(self, record: dict) -> dict:
        """The record as the sample keeps it: the fields the catalogue reads, its names interned and a
        search's source answer shared (a record read from JSON has its own copy of every name)."""
        slim = {k: record[k] for k in _KEPT if k in record}
        for k in ('image', 'algorithm', 'kind', 'composition'):
            if isinstance(slim.get(k), str):
                slim[k] = sys.intern(slim[k])
        for k in ('followup', 'parameters'):
            if isinstance(slim.get(k), dict):
                slim[k] = {sys.intern(name): value for name, value in slim[k].items()}
        source = slim.get('source')
        if isinstance(source, dict):
            try:
                key = tuple(source.items())
                slim['source'] = self._sources.setdefault(key, {sys.intern(n): v for n, v in source.items()})
            except TypeError:  # an answer that is not plain numbers: kept as it is
                pass
        return slim

    @property
    def sample(self) -> list[dict]:
        """The evaluations kept now (their records slimmed to what the catalogue reads), a copy."""
        with self._lock:
            return list(self._sample)

    def learn(self) -> Learnt:
        """Learn the catalogue of the sample now (seconds for a full sample: call it off any hot path)."""
        started = time.perf_counter()
        with self._lock:
            sample, summaries = list(self._sample), list(self._summaries)
            seen, violations, self.pending = self.seen, self.violations, 0
        catalogue = None
        if sample:
            run = Run(self.directory, self._identity, sample, summaries)
            table = feature_table([run], self._frames)
            catalogue = build_catalogue(table, self.settings) if len(table.records) else None
        seconds = time.perf_counter() - started
        return Learnt(catalogue, seen, len(sample), violations, seconds, time.monotonic())
