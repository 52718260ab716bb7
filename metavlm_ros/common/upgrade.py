"""Upgrade a results directory of an earlier version (formats 1, 2) to results format 3, leaving it as it is.

The new directory is built aside (a scratch sibling), checked record for record against the old one
and only then renamed into place: a refused or failed upgrade leaves nothing behind, and the old
directory is only ever read.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.common.directories import build_aside
from metavlm_ros.common.errors import InputError, ResultsError
from metavlm_ros.common.gzip_lines import GZIP_SUFFIX, encode_member
from metavlm_ros.common.record_format import (
    RECORD_FILES,
    VIOLATIONS,
    iter_jsonl,
    records_file,
    repair_torn_tail,
)
from metavlm_ros.common.record_writers import FLUSH_RECORDS

__all__ = ['MEMBER_RECORDS', 'Upgrade', 'legacy_files', 'upgrade_results', 'write_upgraded']

#: Records per gzip member in an upgraded file: what a live store writes at most per flush.
MEMBER_RECORDS = FLUSH_RECORDS
_NAMES = (*RECORD_FILES, VIOLATIONS)


@dataclass
class Upgrade:
    """What an upgrade wrote: records per file, the PNGs copied, and what it said about the old files."""

    records: dict[str, int] = field(default_factory=dict)
    pngs: int = 0
    notes: list[str] = field(default_factory=list)


def legacy_files(directory: str | Path) -> list[str]:
    """The record files of `directory` written in an earlier format (NAME, not NAME.gz), by name."""
    directory = Path(directory)
    return [name for name in _NAMES if records_file(directory / name).name == name]


def _check_old(old: Path) -> None:
    if not old.is_dir():
        raise InputError(f'{old}: no such results directory')
    present = [name for name in _NAMES if records_file(old / name).is_file()]
    if not present:
        raise InputError(f'{old}: not a results directory (none of {", ".join(_NAMES)})')
    if not legacy_files(old):
        raise InputError(
            f'{old}: already results format 3 (every record file is *.jsonl.gz): nothing to upgrade'
        )


def _chunks(records: Iterator[dict], size: int) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def write_upgraded(old: Path, staged: Path, *, log: Callable[[str], None] | None = None) -> Upgrade:
    """Write the records of the results directory `old` into the empty directory `staged` in results
    format 3, checked against the old files record for record, and copy everything else as it is.

    A torn last line of an old file (a killed writer's) is not carried over, and said; a line damaged
    before the last one is refused, as `--resume` refuses it. `old` is only read.

    Raises:
        ResultsError: An old record file is damaged, or the new one does not read back the same.
        OSError: Writing failed.
    """
    log = log or (lambda message: None)
    done = Upgrade()
    # The old record files are copied first, so that a torn tail can be cut (and said) on the copy,
    # the way a store reopening the directory would cut it, without touching the old directory.
    copies = staged / '.old'
    copies.mkdir()
    for name in _NAMES:
        path = records_file(old / name)
        if path.is_file():
            shutil.copy2(path, copies / path.name)
            repair = repair_torn_tail(copies / name)
            if repair:
                # Said of the old file: its copy is what was cut, the old one is only read.
                cut = f', not carried over; {repair.cause}' if repair.cut else ''
                done.notes.append(f'{old / repair.path.name}: {repair.done}{cut}')
    for name in _NAMES:
        source = records_file(copies / name)
        if not source.is_file():
            continue
        target = staged / (name + GZIP_SUFFIX)
        if source.name.endswith(GZIP_SUFFIX):  # already format 3 (a tester's violations.jsonl.gz)
            shutil.copy2(source, target)
        else:
            with open(target, 'xb') as handle:
                handle.write(encode_member([]))  # a file with no record is still a valid gzip file
                for chunk in _chunks(iter_jsonl(copies / name, strict=True), MEMBER_RECORDS):
                    handle.write(encode_member(chunk))
                handle.flush()
                os.fsync(handle.fileno())
        done.records[name] = _same_records(copies / name, target)
    shutil.rmtree(copies)
    for message in done.notes:
        log(message)
    # Everything else (search.json, frames/, sources/, a campaign cell's cell.json) as it is; the
    # scratch files and folders of killed writers (hidden names) are never evidence.
    records = {records_file(old / name).name for name in _NAMES}
    for entry in sorted(old.iterdir()):
        if entry.name in records or entry.name.startswith('.'):
            continue
        if entry.is_dir():
            shutil.copytree(entry, staged / entry.name, ignore=_hidden)
            done.pngs += sum(1 for _ in (staged / entry.name).rglob('*.png'))
        else:
            shutil.copy2(entry, staged / entry.name)
    return done


def _text(record: dict | None) -> str:
    # Compared as JSON text: a NaN equals itself there.
    return json.dumps(record, sort_keys=True)


def _hidden(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if name.startswith('.')]


def _same_records(old: Path, new: Path) -> int:
    """How many records `new` holds, once checked equal, one by one, to what the reader gets from `old`."""
    count = 0
    theirs = iter_jsonl(old, strict=True)
    for count, record in enumerate(iter_jsonl(new, strict=True), 1):
        if _text(next(theirs, None)) != _text(record):
            raise ResultsError(
                f'{new}: record {count} does not read back as {old.name} holds it; nothing written'
            )
    if next(theirs, None) is not None:
        raise ResultsError(f'{new}: holds {count} records, fewer than {old.name}; nothing written')
    return count


def upgrade_results(old: str | Path, new: str | Path, *, log: Callable[[str], None] | None = None) -> Upgrade:
    """Write the results directory `old` (formats 1 and 2) as a new directory `new` in results format 3.

    `new` must not exist; it appears whole (renamed in once written and checked) or not at all.

    Raises:
        InputError: `old` is not a results directory, or has nothing to upgrade; `new` exists.
        ResultsError: A record file of `old` is damaged (see `write_upgraded`).
        StorageError: `new` could not be written (full disk, no permission).
    """
    old, new = Path(old), Path(new)
    _check_old(old)
    return build_aside(new, lambda staged: write_upgraded(old, staged, log=log), outside=old)
