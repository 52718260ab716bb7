"""How a results store appends records: gzip members (format 3), or format 2 lines in an older directory."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, ClassVar

from metavlm_ros.common.directories import storage_error
from metavlm_ros.common.errors import StorageError
from metavlm_ros.common.gzip_lines import GZIP_SUFFIX, encode_member
from metavlm_ros.common.record_format import (
    EVALUATIONS,
    PARETO,
    PER_EVALUATION,
    PER_PARETO,
    SUMMARY,
    VIOLATIONS,
    encode_record,
    record_digest,
    records_file,
)

__all__ = [
    'FLUSH_ORDER',
    'FLUSH_RECORDS',
    'FLUSH_S',
    'WRITERS',
    'AppendFiles',
    'LineWriter',
    'MemberWriter',
    'RecordWriter',
]

#: A gzip member is written once this many records wait, or once the first of them waited FLUSH_S.
FLUSH_RECORDS = 64
FLUSH_S = 1.0
#: Every record file, in the order a flush writes them (evaluations first).
FLUSH_ORDER = (EVALUATIONS, PARETO, VIOLATIONS, SUMMARY)


class AppendFiles:
    """The record files of one directory, each opened once for appending; every write is one write.

    `count` is told the bytes of every write; `durable` fsyncs each one.
    """

    def __init__(self, directory: Path, *, durable: bool, count: Callable[[int], None]) -> None:
        self.directory = directory
        self.durable = durable
        self.count = count
        self._handles: dict[str, IO[bytes]] = {}

    def write(self, name: str, data: bytes) -> int:
        """Append `data` to the file `name` with one write; returns the byte offset it starts at.

        Raises:
            StorageError: The write failed (full disk): what it wrote is taken back; or the file was
                removed while open.
        """
        path = self.directory / name
        handle = self._handles.get(name)
        try:
            if handle is None:
                handle = self._handles[name] = open(path, 'ab', buffering=0)  # noqa: SIM115
            status = os.fstat(handle.fileno())
        except OSError as exc:
            raise storage_error(path, exc) from None
        if status.st_nlink == 0:
            raise StorageError(f'{path}: removed while results were written to it; nothing more is written')
        try:
            view = memoryview(data)
            while view:
                view = view[handle.write(view) :]
            if self.durable:
                os.fsync(handle.fileno())
            self.count(len(data))
        except OSError as exc:
            # Take the partial member (line) back: the file ends with the last whole one, as before.
            with contextlib.suppress(OSError):
                os.ftruncate(handle.fileno(), status.st_size)
            raise storage_error(path, exc) from None
        # One writer appends (O_APPEND): the data went where the file ended.
        return status.st_size

    def close(self) -> None:
        """Close every open file."""
        for handle in self._handles.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._handles.clear()


class RecordWriter:
    """How one results format appends records (plain JSON values, `to_jsonable`'s) to its files."""

    #: The results format it writes (docs/results.md).
    FORMAT: ClassVar[int]

    def __init__(self, files: AppendFiles) -> None:
        self.files = files

    def evaluation(self, record: dict) -> None:
        """Append one evaluation record."""
        raise NotImplementedError

    def pareto(self, record: dict) -> None:
        """Append one non-dominated solution (an evaluation record with its `rank` and `frame`)."""
        raise NotImplementedError

    def violations(self, records: list[dict]) -> None:
        """Append published violations (evaluation records with their `frame`): on disk on return."""
        raise NotImplementedError

    def summary(self, record: dict) -> None:
        """Append one search summary: on disk on return, with every record before it."""
        raise NotImplementedError

    def create(self, name: str) -> None:
        """Create the record file `name` with no record in it, unless it exists."""
        raise NotImplementedError

    def flush(self, names: Iterable[str] = FLUSH_ORDER) -> None:
        """Write the records that wait for the files `names` (all by default)."""


class MemberWriter(RecordWriter):
    """Results format 3: records wait in memory, then go into NAME.gz as one gzip member a file.

    A member is written at `flush`, with a violation or a summary, or once FLUSH_RECORDS records wait
    or the first of them waited FLUSH_S.
    """

    FORMAT = 3

    def __init__(self, files: AppendFiles) -> None:
        super().__init__(files)
        # The records that wait for the next member, by file, and since when.
        self._pending: dict[str, list[dict]] = {}
        self._pending_since: float | None = None

    def evaluation(self, record: dict) -> None:
        self._add(EVALUATIONS, record)

    def pareto(self, record: dict) -> None:
        self._add(PARETO, record)

    def violations(self, records: list[dict]) -> None:
        self._pending.setdefault(VIOLATIONS, []).extend(records)
        self.flush((VIOLATIONS,))

    def summary(self, record: dict) -> None:
        self._add(SUMMARY, record)
        self.flush()  # a search's records are on disk with its summary

    def create(self, name: str) -> None:
        # An empty gzip member: a valid, empty file for zcat, pandas and DuckDB.
        if not records_file(self.files.directory / name).exists():
            self.files.write(name + GZIP_SUFFIX, encode_member([]))

    def _add(self, name: str, record: dict) -> None:
        """Keep a record for the next member of `name`; flush when enough waited, or long enough."""
        now = time.monotonic()
        waiting = self._pending.setdefault(name, [])
        waiting.append(record)
        if self._pending_since is None:
            self._pending_since = now
        if len(waiting) >= FLUSH_RECORDS or now - self._pending_since >= FLUSH_S:
            self.flush()

    def flush(self, names: Iterable[str] = FLUSH_ORDER) -> None:
        """One gzip member each, in the order of `names`, one write each.

        Raises:
            StorageError: A member could not be written (full disk): it is taken back whole, and the
                records it held are not written (a resumed search writes them again).
        """
        members = [(name, self._pending.pop(name, None)) for name in names]
        if not any(records for records in self._pending.values()):
            self._pending_since = None
        for name, records in members:
            if records:
                self.files.write(name + GZIP_SUFFIX, encode_member(records))


class LineWriter(RecordWriter):
    """Format 2, appended to a directory an earlier version wrote (formats 1 and 2: NAME, not NAME.gz):
    one line a record, written before the call returns.

    Every line of a search repeated the same image, model, source prediction and stamps; they are
    written once per search in a header line (and again by a store that reopens the file), with the
    fields' usual values (`DEFAULTS`), so `iter_jsonl` returns each record whole (`encode_record`). A
    Pareto or violation record equal to an evaluation this writer wrote refers to it by its index.
    """

    FORMAT = 2

    def __init__(self, files: AppendFiles) -> None:
        super().__init__(files)
        # Per record file: the header line in effect at its end (this session).
        self._headers: dict[str, dict] = {}
        # The evaluations written under the header line of evaluations.jsonl at byte `_section_at`:
        # index -> digest of the whole record (None: the index came twice).
        self._section_at: int | None = None
        self._section: dict[int, bytes | None] = {}

    def evaluation(self, record: dict) -> None:
        self._append_shared(EVALUATIONS, record, PER_EVALUATION)
        index = record.get('index')
        if type(index) is int:
            self._section[index] = None if index in self._section else record_digest(record)

    def pareto(self, record: dict) -> None:
        self._append_referring(PARETO, record, frozenset({'rank', 'frame'}))

    def violations(self, records: list[dict]) -> None:
        for record in records:
            self._append_referring(VIOLATIONS, record, frozenset({'frame'}))

    def summary(self, record: dict) -> None:
        self._append(SUMMARY, record)

    def create(self, name: str) -> None:
        self.files.write(name, b'')

    def _append(self, name: str, record: dict) -> int:
        """Write one line; returns the byte offset it starts at."""
        return self.files.write(name, (json.dumps(record, separators=(',', ':')) + '\n').encode())

    def _append_referring(self, name: str, record: dict, added: frozenset) -> None:
        """Append an evaluation record plus `added` fields: as a reference to the evaluation (its
        index and `added`) when this writer wrote that evaluation, equal, in the current section of
        evaluations.jsonl; whole otherwise (a resumed search's evaluations written before)."""
        index = record.get('index')
        digest = self._section.get(index) if type(index) is int else None
        evaluation = {k: v for k, v in record.items() if k not in added}
        if digest is not None and digest == record_digest(evaluation):
            self._append_shared(
                name, record, PER_PARETO, line_fields=added | {'index'}, evaluations_at=self._section_at
            )
        else:
            self._append_shared(name, record, PER_PARETO)

    def _append_shared(self, name: str, record: dict, own: frozenset, **encoding: object) -> None:
        """Append a record as its own line, after a header line when the one in effect differs."""
        current = self._headers.get(name)
        header, line = encode_record(record, own, current=current, **encoding)
        if header is not current:
            at = self._append(name, header)
            self._headers[name] = header
            if name == EVALUATIONS:
                # A new section: the evaluations a later line may refer to are those after this header.
                self._section_at, self._section = at, {}
        self._append(name, line)


#: The writer of each results format a store appends in, by format (rosbags' `Reader.STORAGE_PLUGINS`).
WRITERS: dict[int, type[RecordWriter]] = {MemberWriter.FORMAT: MemberWriter, LineWriter.FORMAT: LineWriter}
