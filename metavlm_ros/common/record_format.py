"""The results' record format: file names, layouts on disk, record keys and the one records reader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.gzip_lines import (
    GZIP_SUFFIX,
    TailRepair,
    is_gzip,
    iter_gzip_records,
    repair_torn_member,
)
from metavlm_ros.common.record_lines import (
    DEFAULTS,
    FORMAT,
    HEADER,
    Evaluations,
    Header,
    encode_record,
    is_header,
    parse_line,
    record_digest,
)

__all__ = [
    'DEFAULTS',
    'EVALUATIONS',
    'FORMAT',
    'FRAMES',
    'GZIP_SUFFIX',
    'HEADER',
    'IDENTITY',
    'IDENTITY_FORMAT',
    'MANIFEST',
    'PARETO',
    'PER_EVALUATION',
    'PER_PARETO',
    'RECORD_FILES',
    'RESULT_NAMES',
    'SEARCH_SOURCE',
    'SOURCES',
    'SUMMARY',
    'VIOLATIONS',
    'encode_record',
    'iter_jsonl',
    'pareto_key',
    'read_jsonl',
    'record_digest',
    'records_file',
    'record_key',
    'repair_torn_tail',
    'search_key',
    'to_jsonable',
]


# The record files by name. On disk each is NAME.gz (results format 3: whole records, one JSON object
# a line, in gzip members, docs/results.md) or, in a directory an earlier version wrote, NAME itself
# (formats 1 and 2: JSON Lines with header lines). `records_file` says which; every reader takes NAME.
EVALUATIONS = 'evaluations.jsonl'
PARETO = 'pareto.jsonl'
SUMMARY = 'summary.jsonl'
VIOLATIONS = 'violations.jsonl'  # the tester's published violations
IDENTITY = 'search.json'
FRAMES = 'frames'
# Source frames, one lossless PNG per distinct frame searched (named by its pixels' sha256).
SOURCES = 'sources'
RECORD_FILES = (EVALUATIONS, PARETO, SUMMARY)
# The checksums of every file of the directory, as `sha256sum -c` verifies them (common/manifest.py),
# written when a command that writes results ends.
MANIFEST = 'SHA256SUMS'
# What a results directory may hold: --overwrite replaces nothing else (the tester adds violations).
RESULT_NAMES = frozenset(
    {
        *(name + suffix for name in (*RECORD_FILES, VIOLATIONS) for suffix in ('', GZIP_SUFFIX)),
        IDENTITY,
        FRAMES,
        SOURCES,
        MANIFEST,
    }
)
# 2: one shape for every command that searches (settings, model, source); 1: before it (issue 28),
# read as 2 where it says as much (common/directories.py).
IDENTITY_FORMAT = 2
#: The source part of an identity record (how the searched frames reach the model) for a process that
#: reads its frames itself and judges them in process, as they are (`metavlm search`, the demo's Rand
#: searches): no ROS endpoint, no transport reduction, no camera transport, nothing published. The
#: tester names its own (ros/tester_identity.py tester_source).
SEARCH_SOURCE = MappingProxyType(
    {'endpoint': 'inprocess', 'transport_size': 0, 'image_transport': None, 'report_threshold': None}
)
# The fields of an evaluation record that change from one evaluation to the next; every other field
# (image, model, source prediction, stamps...) is the search's, written once in a header line
# (`{"header": {...}}`) that the records after it share, and put back by `iter_jsonl` (record_lines).
PER_EVALUATION = frozenset(
    {
        'index', 'generation', 'genotype', 'composition', 'order', 'parameters', 'f_trans', 'f_pred',
        'followup', 'followup_text', 'violation', 'strength', 'cached', 'failed',
        # A few evaluations' (an answer that does not parse), or a served model's (its latency):
        # in a header line they would start a new one for each evaluation (format 1 did).
        'parse_error', 'request',
    }
)  # fmt: skip
# pareto.jsonl lines add their rank and PNG.
PER_PARETO = PER_EVALUATION | {'rank', 'frame'}


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


def pareto_key(record: dict) -> tuple:
    """What identifies one non-dominated solution record: its evaluation and its rank."""
    return (*record_key(record), record.get('rank'))


def records_file(path: str | Path) -> Path:
    """The file on disk that holds the records named `path` (NAME or NAME.gz, e.g. evaluations.jsonl).

    NAME.gz where it exists (results format 3), else NAME where it exists (what earlier versions
    wrote), else NAME.gz: where a new store writes them.
    """
    path = Path(path)
    name = path.name[: -len(GZIP_SUFFIX)] if path.name.endswith(GZIP_SUFFIX) else path.name
    compressed, plain = path.with_name(name + GZIP_SUFFIX), path.with_name(name)
    if compressed.exists() or not plain.exists():
        return compressed
    return plain


def repair_torn_tail(path: str | Path) -> TailRepair | None:
    """Make the records file named `path` end with its last whole record; what was repaired, or None.

    A gzip member or a line cut short by a kill or a full disk is removed; a whole record that only
    lacks its newline gets it.
    """
    path = records_file(path)
    if not path.is_file():
        return None
    if path.name.endswith(GZIP_SUFFIX):
        return repair_torn_member(path)
    with open(path, 'rb+') as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return None
        handle.seek(size - 1)
        if handle.read(1) == b'\n':
            return None
        # Find the start of the last line, reading backwards in blocks.
        start, block = size, 1 << 16
        while start > 0:
            begin = max(0, start - block)
            handle.seek(begin)
            chunk = handle.read(start - begin)
            cut = chunk.rfind(b'\n')
            if cut >= 0:
                start = begin + cut + 1
                break
            start = begin
        handle.seek(start)
        tail = handle.read()
        try:
            whole = isinstance(json.loads(tail), dict)
        except (UnicodeDecodeError, json.JSONDecodeError):
            whole = False
        if whole:
            handle.seek(0, os.SEEK_END)
            handle.write(b'\n')
            return TailRepair(path, 0)
        handle.truncate(start)
    return TailRepair(path, len(tail))


def iter_jsonl(path: str | Path, *, strict: bool = False) -> Iterator[dict]:
    """Yield the records of a results file whole, skipping a last member or line cut short by a kill.

    The one reader of results, for every layout written (docs/results.md): format 3, whole records in
    gzip members (NAME.gz); and what earlier versions wrote (NAME): lines that are whole records;
    header lines (`{"header": {...}}`, the fields a search's records share, put back into every record
    after it); and format 2 headers' `defaults`, `float32` and `evaluations_at` (pareto.jsonl and
    violations.jsonl lines that hold an evaluation's `index` and what they add to it: the evaluation
    comes from the directory's evaluations.jsonl).

    Args:
        path: The file, by NAME or NAME.gz (`records_file`); a missing file yields nothing.
        strict: Raise on a damaged line that is not the last one (instead of skipping it).

    Raises:
        ResultsError: `strict` and a line before the last one is not a JSON record; a line refers
            to an evaluation that evaluations.jsonl does not hold (in any mode: the record cannot be
            read whole); a header line is damaged or of a newer format.
    """
    path = records_file(path)
    if not path.exists():
        return
    if is_gzip(path):
        yield from iter_gzip_records(path, strict=strict)
        return
    evaluations = Evaluations(path.parent / EVALUATIONS)
    with open(path, encoding='utf-8', errors='replace') as handle:
        damaged: int | None = None
        header: Header | None = None
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            if damaged is not None and strict:
                raise ResultsError(
                    f'{path}: line {damaged} is damaged (not a JSON record) and records follow it'
                )
            record = parse_line(line)
            if record is None:
                damaged = number  # a partial record from an interrupted write; everything else is intact
                continue
            damaged = None
            if is_header(record):
                # The fields the search's records share, for the lines after it (docs/results.md).
                header = Header(record, f'{path}: line {number}')
            elif header is None:
                yield record  # written before header lines
            elif header.evaluations_at is None:
                yield header.restore(record)
            else:
                where = f'{path}: line {number}'
                yield header.restore(record, evaluations.get(header, record.get('index'), where))


def read_jsonl(path: str | Path) -> list[dict]:
    """Read every complete record of a JSON Lines file (missing file: empty list)."""
    return list(iter_jsonl(path))
