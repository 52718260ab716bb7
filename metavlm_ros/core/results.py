"""The results store: JSON Lines records appended and flushed one by one, plus follow-up PNGs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import cv2
import numpy as np

from metavlm_ros.core.errors import InputError
from metavlm_ros.core.scratch import LEGACY_FRAME_SCRATCH, remove_stale, scratch_path

__all__ = [
    'EVALUATIONS',
    'PARETO',
    'SUMMARY',
    'ResultsStore',
    'free_disk_bytes',
    'iter_jsonl',
    'read_jsonl',
    'record_key',
    'search_key',
    'to_jsonable',
]

EVALUATIONS = 'evaluations.jsonl'
PARETO = 'pareto.jsonl'
SUMMARY = 'summary.jsonl'


def to_jsonable(value: Any) -> Any:
    """Turn numpy scalars and arrays (and nested containers of them) into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        # JSON has no NaN: a missing value is null.
        return None if value != value else value
    return value


class ResultsStore:
    """Append-only JSON Lines files under one directory.

    Every record is written as one line and flushed (and fsync'ed when `durable`) before the call
    returns, so a killed run keeps everything it finished. Reopening a directory appends: nothing
    already written is ever truncated, unless `overwrite` asks for a clean directory.

    `reserve_bytes` keeps free space on the directory's file system for the rest of the machine
    (onboard, the robot's own logs share the disk): while less than that is free, follow-up PNGs,
    by far the largest results, are not written (`save_frame` returns None and counts them in
    `frames_skipped`). Records are always written; they are small.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        overwrite: bool = False,
        durable: bool = False,
        resume: bool = False,
        reserve_bytes: int = 0,
    ) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise InputError(f'{self.directory}: results path exists and is not a directory')
        if overwrite and self.directory.exists():
            for name in (EVALUATIONS, PARETO, SUMMARY):
                (self.directory / name).unlink(missing_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.frames_dir = self.directory / 'frames'
        # PNGs a killed run was writing: never evidence (they were not renamed into place yet).
        remove_stale(self.frames_dir, legacy=LEGACY_FRAME_SCRATCH)
        self.durable = durable
        self.reserve_bytes = reserve_bytes
        self.frames_skipped = 0
        self._files: dict[str, IO[str]] = {}
        # On resume, a search that was cut short is run again from its seed; the evaluations it
        # had already written are recognised by their key and not written twice.
        self._written: set[tuple] = set()
        if resume:
            self._written = {record_key(r) for r in iter_jsonl(self.directory / EVALUATIONS)}

    def has_results(self) -> bool:
        """Whether the directory already holds evaluation records."""
        path = self.directory / EVALUATIONS
        return path.exists() and path.stat().st_size > 0

    def completed_searches(self) -> set[tuple]:
        """Keys (image, algorithm, seed, model) of the searches whose summary was written."""
        return {search_key(r) for r in iter_jsonl(self.directory / SUMMARY)}

    def _append(self, name: str, record: dict) -> None:
        handle = self._files.get(name)
        if handle is None:
            path = self.directory / name
            _repair_truncated_tail(path)
            handle = self._files[name] = open(path, 'a', encoding='utf-8')  # noqa: SIM115
        handle.write(json.dumps(to_jsonable(record), separators=(',', ':')) + '\n')
        handle.flush()
        if self.durable:
            os.fsync(handle.fileno())

    def append_evaluation(self, record: dict) -> None:
        """Append one evaluation record to evaluations.jsonl (once: a resumed search skips its own)."""
        if self._written:
            key = record_key(record)
            if key in self._written:
                return
        self._append(EVALUATIONS, record)

    def append_pareto(self, record: dict) -> None:
        """Append one non-dominated solution to pareto.jsonl."""
        self._append(PARETO, record)

    def append_summary(self, record: dict) -> None:
        """Append one search summary to summary.jsonl."""
        self._append(SUMMARY, record)

    def low_on_space(self) -> bool:
        """Whether the results file system has less free space than `reserve_bytes` (never when 0)."""
        return self.reserve_bytes > 0 and free_disk_bytes(self.directory) < self.reserve_bytes

    def save_frame(self, name: str, rgb: np.ndarray) -> Path | None:
        """Write an RGB frame as PNG under frames/ and return its path (None: skipped, see low_on_space)."""
        if self.low_on_space():
            self.frames_skipped += 1
            return None
        self.frames_dir.mkdir(exist_ok=True)
        path = self.frames_dir / f'{name}.png'
        tmp = scratch_path(path, '.png')
        # Write then rename, so a killed run never leaves a half-written PNG under the final name
        # (the scratch file it leaves is removed when the directory is next opened).
        if not cv2.imwrite(str(tmp), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
            raise InputError(f'{path}: could not write PNG')
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Close the open files (records are already flushed)."""
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_disk_bytes(path: str | Path) -> int:
    """Free bytes (for an unprivileged writer) on the file system of `path` or its nearest existing parent."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def search_key(record: dict) -> tuple:
    """What identifies one search: the image, algorithm, seed and model (and run, for campaigns)."""
    return (
        record.get('image'),
        record.get('algorithm'),
        record.get('seed'),
        record.get('model'),
        record.get('run'),
    )


def record_key(record: dict) -> tuple:
    """What identifies one evaluation record: its search and its index."""
    return (*search_key(record), record.get('index'))


def _repair_truncated_tail(path: Path) -> None:
    """End a file whose last line was cut by a kill with a newline, so appends start a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, 'rb+') as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) != b'\n':
            handle.write(b'\n')


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Yield the records of a JSON Lines file, skipping a line cut short by a killed writer."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding='utf-8') as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a partial record from an interrupted write; everything else is intact


def read_jsonl(path: str | Path) -> list[dict]:
    """Read every complete record of a JSON Lines file (missing file: empty list)."""
    return list(iter_jsonl(path))
