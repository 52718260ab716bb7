"""JSON Lines in gzip members: one member per flush, read back member by member, a torn last one cut.

A file of concatenated gzip members is one valid gzip file: `zcat`, Python's gzip, pandas and DuckDB
read it whole. Each flush appends one member holding whole lines, so a process killed between two
flushes leaves only whole members; one killed inside a write may leave a torn last member, which
the readers here skip (and `repair_torn_member` cuts) without touching the members before it.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from metavlm_ros.common.errors import ResultsError

__all__ = [
    'GZIP_SUFFIX',
    'Member',
    'TailRepair',
    'encode_member',
    'is_gzip',
    'iter_gzip_records',
    'iter_members',
    'repair_torn_member',
]

GZIP_SUFFIX = '.gz'
_MAGIC = b'\x1f\x8b'
_BLOCK = 1 << 16


def encode_member(records: Iterable[dict]) -> bytes:
    """One gzip member holding each record as one JSON line (compact, full precision, no timestamp)."""
    text = ''.join(json.dumps(record, separators=(',', ':')) + '\n' for record in records)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


@dataclass(frozen=True)
class Member:
    """One gzip member of a file: where it starts and ends, its text, and what is wrong with it.

    `problem` is None for a whole member; 'torn' when the file ends inside it (a write cut short);
    'damaged' when it does not decompress (it then ends where the next member starts, or at the
    file's end). `data` is None unless the member is whole.
    """

    start: int
    end: int
    data: bytes | None
    problem: str | None = None


def _next_member(handle, after: int) -> int | None:
    """Where the next gzip member that decompresses starts after byte `after`, or None."""
    handle.seek(after)
    rest = handle.read()
    at = rest.find(_MAGIC + b'\x08', 1)
    while at >= 0:
        decoder = zlib.decompressobj(wbits=31)
        try:
            decoder.decompress(rest[at:])
        except zlib.error:
            at = rest.find(_MAGIC + b'\x08', at + 1)
            continue
        if decoder.eof:
            return after + at
        at = rest.find(_MAGIC + b'\x08', at + 1)
    return None


def iter_members(path: str | Path) -> Iterator[Member]:
    """The members of a file of concatenated gzip members, in order, streamed in blocks."""
    with open(path, 'rb') as handle:
        size = os.fstat(handle.fileno()).st_size
        start = 0
        while start < size:
            handle.seek(start)
            pending = handle.read(_BLOCK)
            decoder = zlib.decompressobj(wbits=31)
            parts: list[bytes] = []
            consumed = 0  # bytes of this member read so far
            try:
                while True:
                    parts.append(decoder.decompress(pending))
                    if decoder.eof:
                        consumed += len(pending) - len(decoder.unused_data)
                        break
                    consumed += len(pending)
                    pending = handle.read(_BLOCK)
                    if not pending:
                        yield Member(start, size, None, 'torn')  # the file ends inside it
                        return
            except zlib.error:
                following = _next_member(handle, start)
                yield Member(start, size if following is None else following, None, 'damaged')
                if following is None:
                    return
                start = following
                continue
            yield Member(start, start + consumed, b''.join(parts))
            start += consumed


def iter_gzip_records(path: str | Path, *, strict: bool = False) -> Iterator[dict]:
    """Yield the records (JSON objects, one a line) of every whole member of `path`.

    A torn last member is skipped: the records before it are all yielded. A damaged member is
    skipped too, and the members after it are read, unless `strict`.

    Raises:
        ResultsError: `strict`, and a member is damaged, or a line in a whole member is not a JSON
            object.
    """
    for member in iter_members(path):
        if member.problem == 'damaged' and strict:
            raise ResultsError(
                f'{path}: the gzip member at byte {member.start} is damaged (does not decompress)'
            )
        if member.data is None:
            continue
        for number, line in enumerate(member.data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                record = None
            if not isinstance(record, dict):
                if strict:
                    raise ResultsError(
                        f'{path}: line {number} of the gzip member at byte {member.start} is not a JSON '
                        'record'
                    )
                continue
            yield record


@dataclass(frozen=True)
class TailRepair:
    """What a repair did to the end of a records file: the facts, and the message built from them.

    `cut` bytes were removed: a torn (or damaged) last gzip member (`member`) after `whole_members`
    whole members holding `records` records, or a torn last line. `cut` 0: nothing was removed, the
    last record only lacked its newline, which was added.
    """

    path: Path
    cut: int
    problem: str = 'torn'
    member: bool = False
    whole_members: int = 0
    records: int = 0

    @property
    def done(self) -> str:
        """What was done to the file, without its name or the cause."""
        if not self.cut:
            return 'its last record lacked its newline; added'
        if self.member:
            return (
                f'removed a {self.problem} last gzip member ({self.cut} bytes after {self.whole_members} '
                f'whole members, {self.records} records)'
            )
        return f'removed a {self.problem} last line ({self.cut} bytes)'

    @property
    def cause(self) -> str:
        """What left the end to cut ('' when nothing was cut)."""
        return 'left by an interrupted write' if self.cut else ''

    @property
    def message(self) -> str:
        """The one-line report: the file, what was done and, for a cut, its cause."""
        return f'{self.path}: {self.done} {self.cause}'.rstrip()


def repair_torn_member(path: str | Path) -> TailRepair | None:
    """Cut a torn (or damaged) last member off `path`, keeping every whole member; what was cut, or None.

    A damaged member that whole members follow is left as it is: nothing after it is ever cut.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    whole = records = 0
    last = None
    for member in iter_members(path):
        last = member
        if member.data is not None:
            whole += 1
            records += member.data.count(b'\n')
    if last is None or last.problem is None:
        return None
    with open(path, 'rb+') as handle:
        handle.truncate(last.start)
        handle.flush()
        os.fsync(handle.fileno())
    return TailRepair(
        path, last.end - last.start, last.problem, member=True, whole_members=whole, records=records
    )


def is_gzip(path: str | Path) -> bool:
    """Whether a file starts as gzip does."""
    with open(path, 'rb') as handle:
        return handle.read(2) == _MAGIC
