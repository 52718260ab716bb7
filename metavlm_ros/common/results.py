"""The results store: whole JSON records appended in flushed gzip members, plus follow-up PNGs."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from metavlm_ros.common.directories import (
    build_aside,
    check_output_dir,
    check_results_dir,
    holds_results,
    identity_differences,
    read_identity,
    replace_directory,
    storage_error,
    write_file_atomic,
    write_identity,
)
from metavlm_ros.common.errors import InputError, ResultsError, StorageError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.range_maps import encode_ranges_png, ranges_digest
from metavlm_ros.common.record_format import (
    EVALUATIONS,
    FRAMES,
    GZIP_SUFFIX,
    IDENTITY,
    PARETO,
    RECORD_FILES,
    SOURCES,
    SUMMARY,
    VIOLATIONS,
    iter_jsonl,
    pareto_key,
    read_jsonl,
    record_key,
    records_file,
    repair_torn_tail,
    search_key,
    to_jsonable,
)
from metavlm_ros.common.record_writers import FLUSH_ORDER, WRITERS, AppendFiles
from metavlm_ros.common.scratch import LEGACY_FRAME_SCRATCH, remove_stale

# The store's neighbours' public names too: `metavlm_ros.common.results` stays the one import of the
# results for callers (commands, nodes, campaigns, the tests).
__all__ = [
    'EVALUATIONS',
    'IDENTITY',
    'PARETO',
    'SUMMARY',
    'SOURCES',
    'VIOLATIONS',
    'ResultsStore',
    'WriteRate',
    'check_output_dir',
    'check_results_dir',
    'directory_bytes',
    'free_disk_bytes',
    'holds_results',
    'identity_differences',
    'iter_jsonl',
    'read_identity',
    'read_jsonl',
    'read_source_frame',
    'record_key',
    'records_file',
    'replace_directory',
    'search_key',
    'source_digest',
    'storage_error',
    'to_jsonable',
    'write_file_atomic',
    'write_identity',
]


class ResultsStore:
    """Append-only record files under one directory (results format 3, docs/results.md).

    Every record is whole (no other line is needed to read it) and goes into NAME.gz in gzip members:
    records wait in memory until `flush` (a search calls it after every generation), a violation or a
    summary is appended, FLUSH_RECORDS records wait or the first waited FLUSH_S; then each file gets
    one member, with one write (fsync'ed when `durable`). So a killed run keeps every member it
    flushed, and zcat, pandas and DuckDB read the files as they are; a write that fails (disk full) is
    taken back whole, so no torn member is left. Reopening a directory appends: nothing already
    written is ever truncated, except a torn last member (or line) that an interrupted write left,
    which is removed (and reported through `log`) before anything is appended. A directory an earlier
    version wrote (formats 1 and 2: NAME, JSON Lines with header lines) is appended to in its own
    format, one line a record, written before the call returns. The writer of the format is chosen
    once, when the store opens (`WRITERS`, common/record_writers.py).

    `overwrite` replaces the whole directory (old frames included), once this store opens: the new
    directory is built under a temporary name and renamed in. It replaces results only: a directory
    holding other files is refused.

    `identity` (settings, model, weights) is kept in search.json; with `resume`, the directory must
    hold the same identity, and each record already written is recognised by its key and not
    written twice: evaluations (which must then be reproduced exactly), non-dominated solutions
    and summaries alike.

    `reserve_bytes` keeps free space on the directory's file system for the rest of the machine
    (onboard, the robot's own logs share the disk): while less than that is free, follow-up PNGs,
    by far the largest results, are not written (`save_frame` returns None and counts them in
    `frames_skipped`). Records are always written; they are small.

    `max_bytes` is the directory's disk budget (0: none): once the directory holds that much (what
    was there when it opened plus what this store wrote), no more PNGs are written (`save_frame`
    and `save_source` return None, counted in `frames_over_budget`) while the JSON Lines records
    go on; nothing written is ever deleted to make room. Every follow-up stays re-renderable from
    its search's source frame (`metavlm render`), so a missing PNG loses no evidence unless the
    source frame itself was refused.

    Raises (constructor):
        StorageError, ParameterError, ResultsError: see `check_results_dir`; ResultsError too for a
            record damaged in the middle of a file that `resume` would continue.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        overwrite: bool = False,
        durable: bool = False,
        resume: bool = False,
        reserve_bytes: int = 0,
        max_bytes: int = 0,
        identity: dict | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.frames_dir = self.directory / FRAMES
        self.sources_dir = self.directory / SOURCES
        self.reserve_bytes = reserve_bytes
        self.max_bytes = max_bytes
        self.frames_skipped = 0
        self.frames_over_budget = 0
        #: Bytes this store wrote (records and PNGs); with `initial_bytes`, the directory's size.
        self.bytes_written = 0
        self.log = log or (lambda message: None)
        check_results_dir(self.directory, overwrite=overwrite, resume=resume, identity=identity)
        existing = self.directory.is_dir()
        earlier = (
            existing
            and not overwrite
            and any(
                records_file(self.directory / name).suffix != GZIP_SUFFIX
                for name in (*RECORD_FILES, VIOLATIONS)
            )
        )
        #: The results format appended: 3, or 2 in a directory an earlier version wrote (formats 1, 2).
        self.format = 2 if earlier else 3
        # Chosen once: every append goes to the writer of that format.
        self._files = AppendFiles(self.directory, durable=durable, count=self.count_written)
        self._writer = WRITERS[self.format](self._files)
        # On resume, a search that was cut short is run again from its seed; what it had already
        # written is recognised by its key and not written twice.
        self._written: dict[tuple, int] = {}
        self._pareto: set[tuple] = set()
        self._summaries: set[tuple] = set()
        self._frame_digests: dict[str, set[str]] = {}
        if resume and existing:
            for record in iter_jsonl(self.directory / EVALUATIONS, strict=True):
                self._written[record_key(record)] = _evaluation_hash(record)
                if record.get('frame_sha256'):
                    self._frame_digests.setdefault(record.get('image'), set()).add(record['frame_sha256'])
            self._pareto = {pareto_key(r) for r in iter_jsonl(self.directory / PARETO, strict=True)}
            self._summaries = {
                search_key(r)
                for r in iter_jsonl(self.directory / SUMMARY, strict=True)
                if not r.get('stopped')
            }
        try:
            if overwrite and existing:
                self._replace(identity)
            elif not existing:
                self._create(identity)
            else:
                # PNGs a killed run was writing: never evidence (they were not renamed into place yet).
                remove_stale(self.frames_dir, legacy=LEGACY_FRAME_SCRATCH)
                for name in (*RECORD_FILES, VIOLATIONS):  # the tester's too: it reopens its directory
                    repair = repair_torn_tail(self.directory / name)
                    if repair:
                        self.log(repair.message)
                if identity is not None and not holds_results(self.directory):
                    write_identity(self.directory, identity)
        except OSError as exc:
            raise storage_error(self.directory, exc) from None
        # Measured once: from here on every byte this store writes is counted as it goes.
        self.initial_bytes = directory_bytes(self.directory)

    @property
    def size_bytes(self) -> int:
        """The directory's size: what it held when opened plus what this store wrote since."""
        return self.initial_bytes + self.bytes_written

    def count_written(self, nbytes: int) -> None:
        """Count bytes written into the directory by another writer (search.json)."""
        self.bytes_written += nbytes

    def over_budget(self) -> bool:
        """Whether the directory has reached `max_bytes` (never when 0): no more PNGs are written."""
        return self.max_bytes > 0 and self.size_bytes >= self.max_bytes

    def _create(self, identity: dict | None) -> None:
        if identity is None:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            self.directory.mkdir()
            return
        # Built aside and renamed in: the directory appears with its identity record.
        build_aside(self.directory, lambda staged: write_identity(staged, identity))

    def _replace(self, identity: dict | None) -> None:
        fill = None if identity is None else (lambda staged: write_identity(staged, identity))
        replace_directory(self.directory, fill=fill, log=self.log)

    def has_results(self) -> bool:
        """Whether the directory already holds records or frames."""
        return holds_results(self.directory)

    def frame_digests(self) -> dict[str, set[str]]:
        """On resume: frame id -> the `frame_sha256` values its records carry (what was searched)."""
        return {image: set(digests) for image, digests in self._frame_digests.items()}

    def completed_searches(self) -> set[tuple]:
        """Keys (image, algorithm, seed, model, run) of the searches whose summary was written."""
        return {search_key(r) for r in iter_jsonl(self.directory / SUMMARY) if not r.get('stopped')}

    def append_evaluation(self, record: dict) -> None:
        """Append one evaluation record to evaluations.jsonl (once: a resumed search skips its own).

        Raises:
            ResultsError: A resumed search judged another genotype, or got other objectives, than
                the record written under this key (another frame, device or thread count).
        """
        if self._written:
            key = record_key(record)
            stored = self._written.get(key)
            if stored is not None:
                if stored != _evaluation_hash(record):
                    raise ResultsError(
                        f'{self.directory}: the resumed search of {record.get("image")} does not reproduce '
                        f'evaluation {record.get("index")} written before (another frame, device or thread '
                        'count?); nothing more is written: use another --out'
                    )
                return
        self._writer.evaluation(to_jsonable(record))

    def append_pareto(self, record: dict) -> None:
        """Append one non-dominated solution to pareto.jsonl (once: a resumed search skips its own)."""
        if pareto_key(record) in self._pareto:
            return
        self._writer.pareto(to_jsonable(record))

    def append_violation(self, record: dict) -> None:
        """Append one published violation (its evaluation record and `frame`) to violations.jsonl;
        on disk when this returns (`append_violations`)."""
        self.append_violations([record])

    def append_violations(self, records: list[dict]) -> None:
        """Append violations about to be published (each its evaluation record and `frame`) to
        violations.jsonl, as one gzip member (the tester's: those of one generation).

        They are on disk when this returns: they are published next. Each record is whole, so what
        is published is on disk whatever evaluations still wait (a search flushes a generation's
        evaluations before it hands them over: `run_search`'s on_generation).
        """
        if records:
            self._writer.violations([to_jsonable(r) for r in records])

    def append_summary(self, record: dict) -> None:
        """Append one search summary to summary.jsonl (once: a resumed search skips its own)."""
        if not record.get('stopped') and search_key(record) in self._summaries:
            return
        self._writer.summary(to_jsonable(record))

    def create(self, name: str) -> None:
        """Create the record file `name` with no record in it, unless it exists (an empty gzip member
        in format 3: a valid, empty file for zcat, pandas and DuckDB)."""
        self._writer.create(name)

    def flush(self, names: tuple[str, ...] = FLUSH_ORDER) -> None:
        """Write the records waiting for the files `names` (all by default): one gzip member each, in
        that order (evaluations first), one write each (nothing waits in format 2).

        Raises:
            StorageError: A member could not be written (full disk): it is taken back whole, and the
                records it held are not written (a resumed search writes them again).
        """
        self._writer.flush(names)

    def low_on_space(self) -> bool:
        """Whether the results file system has less free space than `reserve_bytes` (never when 0)."""
        return self.reserve_bytes > 0 and free_disk_bytes(self.directory) < self.reserve_bytes

    def save_frame(self, name: str, rgb: np.ndarray) -> Path | None:
        """Write an RGB frame as PNG under frames/ and return its path (None: skipped, see low_on_space).

        Raises:
            StorageError: The PNG cannot be written (nothing is left under its name).
        """
        return self._save_png(self.frames_dir / f'{name}.png', rgb)

    def save_source(self, rgb: np.ndarray) -> tuple[str, str] | None:
        """Store a search's source frame once, lossless, under sources/; returns (relative path, sha256).

        The name is the sha256 of the frame's shape and pixels (`source_digest`), so searches of one
        frame share one file and a file already there is not written again. None: the disk reserve
        or the budget kept it from being written (a new search then has no re-renderable follow-ups).

        Raises:
            StorageError: The PNG cannot be written (nothing is left under its name).
        """
        digest = source_digest(rgb)
        path = self.sources_dir / f'{digest}.png'
        if not path.is_file() and self._save_png(path, rgb) is None:
            return None
        return f'{SOURCES}/{path.name}', digest

    def save_source_ranges(self, ranges: np.ndarray) -> tuple[str, str] | None:
        """Store a search's range map once under sources/ (a 16-bit PNG of millimetres, common/range_maps.py),
        named by its sha256; returns (relative path, sha256), None where the disk kept it out."""
        digest = ranges_digest(ranges)
        path = self.sources_dir / f'{digest}.ranges.png'
        if not path.is_file() and self._save_png(path, ranges, encode=encode_ranges_png) is None:
            return None
        return f'{SOURCES}/{path.name}', digest

    def _save_png(self, path: Path, rgb: np.ndarray, encode=encode_png) -> Path | None:
        if self.low_on_space():
            self.frames_skipped += 1
            return None
        if self.over_budget():
            self.frames_over_budget += 1
            return None
        try:
            data = encode(rgb)
        except InputError as exc:
            raise StorageError(f'{path}: {exc}') from None
        try:
            path.parent.mkdir(exist_ok=True)
            # Written aside then renamed: a killed run never leaves a half-written PNG under its name.
            write_file_atomic(path, data)
        except OSError as exc:
            raise storage_error(path, exc) from None
        self.bytes_written += len(data)
        return path

    def close(self) -> None:
        """Write the records that wait, then close the open files."""
        try:
            self.flush()
        finally:
            self._files.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
            return
        # Leaving on an error or an interrupt: what waits is written all the same, and a failure to
        # write it (the disk that failed first) does not hide the error that got us here.
        with contextlib.suppress(StorageError):
            self.close()


def _evaluation_hash(record: dict) -> int:
    # What a resumed search must reproduce exactly: the genotype and both objectives.
    values = to_jsonable([record.get('genotype') or [], record.get('f_trans'), record.get('f_pred')])
    return hash(json.dumps(values))


class WriteRate:
    """MB written per minute over a sliding window, and the hours left to a budget at that rate."""

    def __init__(self, window_s: float = 600.0) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def update(self, size_bytes: int, now: float | None = None) -> float:
        """Add a sample of the directory's size; returns MB (10^6 bytes) per minute (nan: one sample)."""
        now = time.monotonic() if now is None else now
        self._samples.append((now, size_bytes))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / 1e6 / ((t1 - t0) / 60.0) if t1 > t0 else float('nan')

    @staticmethod
    def hours_left(size_bytes: int, max_bytes: int, mb_per_min: float) -> float:
        """Hours until `max_bytes` at `mb_per_min` (nan: no budget or no rate yet; inf: nothing written)."""
        if max_bytes <= 0:
            return float('nan')
        if size_bytes >= max_bytes:
            return 0.0
        if mb_per_min != mb_per_min:
            return float('nan')
        if mb_per_min <= 0:
            return float('inf')
        return (max_bytes - size_bytes) / 1e6 / mb_per_min / 60.0


def source_digest(rgb: np.ndarray) -> str:
    """The sha256 (hex) of a frame's shape and pixels: what names and checks a stored source frame."""
    digest = hashlib.sha256(str(tuple(rgb.shape)).encode())
    digest.update(np.ascontiguousarray(rgb).tobytes())
    return digest.hexdigest()


def read_source_frame(directory: str | Path, summary: dict) -> np.ndarray:
    """The source frame of a finished search, as it was searched, checked against its sha256.

    Args:
        directory: The results directory.
        summary: The search's summary record (its `source_frame` and `source_sha256`).

    Raises:
        ResultsError: The summary names no source frame (written before they were stored, or the
            disk budget refused it), or the file is missing, damaged or holds other pixels.
    """
    import cv2

    relative, expected = summary.get('source_frame'), summary.get('source_sha256')
    what = f'{summary.get("image")} ({summary.get("algorithm")}, seed {summary.get("seed")})'
    if not relative or not expected:
        raise ResultsError(
            f'{directory}: the search of {what} stored no source frame, so it cannot be rendered'
        )
    path = Path(directory) / relative
    if not path.is_file():
        raise ResultsError(f'{path}: the source frame of {what} is missing')
    bgr = cv2.imdecode(np.frombuffer(path.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    rgb = None if bgr is None else np.ascontiguousarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    # The sha256 of the pixels is the check: a damaged file cannot decode to the recorded frame.
    if rgb is None or source_digest(rgb) != expected:
        raise ResultsError(f'{path}: its pixels do not match the sha256 the search of {what} recorded')
    return rgb


def directory_bytes(directory: str | Path) -> int:
    """Bytes the regular files under a directory take (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def free_disk_bytes(path: str | Path) -> int:
    """Free bytes (for an unprivileged writer) on the file system of `path` or its nearest existing parent."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free
