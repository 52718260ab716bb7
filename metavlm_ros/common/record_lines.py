"""How records are laid out in lines: header lines, defaults, float32 values, references to evaluations."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ResultsError

__all__ = [
    'DEFAULTS',
    'ENTRY_DEFAULTS',
    'FLOAT32',
    'FORMAT',
    'HEADER',
    'Header',
    'Evaluations',
    'encode_record',
    'is_header',
    'parse_line',
    'record_digest',
]

HEADER = 'header'
# The layout a header line declares (its `format`; absent: 1, as header lines were first written).
# 1: `header`, the fields of the search that the lines after it share. 2 (issue 30): also
# `defaults`, `float32` and, in pareto.jsonl and violations.jsonl, `evaluations_at` (below).
FORMAT = 2
# What most lines hold (a CLIP model's empty answer text, an evaluation neither cached nor failed, a
# solution without a PNG): a line leaves such a field out, and its header names it in `defaults`.
DEFAULTS = {'followup_text': '', 'cached': False, 'failed': False, 'frame': None}
# Fields of one value per criterion (a threshold, or `count`) that mostly hold this value: a line
# holds only the criteria that differ (none: no field); its header's `defaults` holds them all.
ENTRY_DEFAULTS = {'violation': False, 'strength': None}
# Fields a float32 model fills (CLIP's similarities): when a header names one in `float32`, each of
# its floats is written in the shortest form that reads back, through float32, as the same value.
FLOAT32 = ('followup',)
_HEADER_KEYS = frozenset({HEADER, 'format', 'defaults', 'float32', 'evaluations_at'})
_ABSENT = object()


def _same(value: Any, default: Any) -> bool:
    # 0 == False in Python: a default stands only for a value of its own type.
    return type(value) is type(default) and value == default


def _widen(value: Any) -> Any:
    """A float written in float32's shortest form, as the float32 value it names (others unchanged)."""
    if type(value) is not float:
        return value
    with np.errstate(over='ignore'):
        return float(np.float32(value))


def _float32_exact(value: Any) -> bool:
    """Whether every float of a field's dict is a float32 value (None: nothing to widen)."""
    if value is None:
        return True
    return isinstance(value, dict) and all(_widen(x) == x for x in value.values() if type(x) is float)


def _shortest(value: Any) -> Any:
    """A float32 value as the float of its shortest decimal form, when that widens back to it."""
    if type(value) is not float:
        return value
    short = float(str(np.float32(value)))
    return short if _widen(short) == value else value


def record_digest(record: dict) -> bytes:
    """A digest of a record's fields and values (JSON values), whatever their order."""
    text = json.dumps(record, sort_keys=True, separators=(',', ':'))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _new_header(shared: dict, part: dict, evaluations_at: int | None) -> dict:
    header: dict[str, Any] = {HEADER: shared, 'format': FORMAT}
    defaults = {k: v for k, v in DEFAULTS.items() if k in part}
    for key, value in ENTRY_DEFAULTS.items():
        if isinstance(part.get(key), dict):
            defaults[key] = dict.fromkeys(part[key], value)
    if defaults:
        header['defaults'] = defaults
    float32 = [
        k
        for k in FLOAT32
        if isinstance(part.get(k), dict)
        and any(type(x) is float for x in part[k].values())
        and _float32_exact(part[k])
    ]
    if float32:
        header['float32'] = float32
    if evaluations_at is not None:
        header['evaluations_at'] = evaluations_at
    return header


def _fits(header: dict | None, shared: dict, part: dict, evaluations_at: int | None) -> bool:
    """Whether the lines under `header` can hold a record (its `part`) exactly."""
    if header is None or header[HEADER] != shared or header.get('evaluations_at') != evaluations_at:
        return False
    for key, default in header.get('defaults', {}).items():
        value = part.get(key, _ABSENT)
        if value is _ABSENT:
            return False  # the reader would add the field
        if isinstance(default, dict) and not (isinstance(value, dict) and value.keys() == default.keys()):
            return False
    return all(_float32_exact(part.get(k)) for k in header.get('float32', ()))


def encode_record(
    record: dict,
    own: frozenset,
    *,
    line_fields: frozenset | None = None,
    evaluations_at: int | None = None,
    current: dict | None = None,
) -> tuple[dict, dict]:
    """The header line a record's line needs and the line itself (format 2, docs/results.md).

    Args:
        record: The whole record, JSON values only (`to_jsonable`).
        own: The fields that are the record's own; every other field is its search's, in the header.
        line_fields: The fields the line holds (default `own`).
        evaluations_at: The line refers to the evaluation of its `index` in the section of
            evaluations.jsonl whose header line starts at this byte: it holds only `line_fields`,
            what it adds to that evaluation record (which must equal the rest of `record`).
        current: The header line in effect where the line goes; kept when the line fits under it.

    Returns:
        (header, line): `current` itself when it serves, else a new header line to write first; the
        line leaves out what the header holds. `iter_jsonl` puts them together into `record`.
    """
    fields = own if line_fields is None else line_fields
    part = {k: v for k, v in record.items() if k in fields}
    shared = {k: v for k, v in record.items() if k not in own}
    header = current
    if not _fits(current, shared, part, evaluations_at):
        header = _new_header(shared, part, evaluations_at)
    defaults, float32 = header.get('defaults', {}), header.get('float32', ())
    line = {}
    for key, value in part.items():
        default = defaults.get(key, _ABSENT)
        if isinstance(default, dict):
            value = {e: x for e, x in value.items() if not _same(x, default[e])}
            if not value:
                continue
        elif default is not _ABSENT and _same(value, default):
            continue
        if key in float32 and isinstance(value, dict):
            value = {e: _shortest(x) for e, x in value.items()}
        line[key] = value
    return header, line


def parse_line(line: bytes | str) -> dict | None:
    """A line's JSON object, or None when it is not one (damaged, or cut short by a kill)."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def is_header(record: dict) -> bool:
    """Whether a parsed line is a header line (of any format)."""
    return isinstance(record.get(HEADER), dict) and record.keys() <= _HEADER_KEYS


class Header:
    """A header line as read: what it puts back into each line after it."""

    def __init__(self, line: dict, where: str) -> None:
        """Read a header line (`where`: file and line, for errors).

        Raises:
            ResultsError: A damaged header line, or one of a newer format than this reader's.
        """
        version = line.get('format', 1)
        self.shared: dict = line[HEADER]
        self.defaults = line.get('defaults', {})
        self.float32 = line.get('float32', [])
        self.evaluations_at = line.get('evaluations_at')
        if type(version) is int and version > FORMAT:
            raise ResultsError(
                f'{where} is in results format {version}, newer than this metavlm reads ({FORMAT}): '
                'read it with the metavlm that wrote it'
            )
        at = self.evaluations_at
        if (
            type(version) is not int
            or version < 1
            or not isinstance(self.defaults, dict)
            or not isinstance(self.float32, list)
            or (at is not None and (type(at) is not int or at < 0))
        ):
            raise ResultsError(f'{where} is a damaged header line')

    def restore(self, line: dict, evaluation: dict | None = None) -> dict:
        """The whole record of a line under this header (`evaluation`: the one it refers to)."""
        record = {**(evaluation or {}), **self.shared}
        for key, default in self.defaults.items():
            record[key] = dict(default) if isinstance(default, dict) else default
        for key, value in line.items():
            if key in self.float32 and isinstance(value, dict):
                value = {e: _widen(x) for e, x in value.items()}
            default = self.defaults.get(key)
            if isinstance(default, dict) and isinstance(value, dict):
                value = {**default, **value}
            record[key] = value
        return record


class Evaluations:
    """The evaluations that pareto.jsonl and violations.jsonl lines refer to: one search's section of
    the directory's evaluations.jsonl at a time (its header line and the lines up to the next one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at: int | None = None
        self.records: dict[Any, dict] = {}

    def get(self, header: Header, index: Any, where: str) -> dict:
        """The evaluation record `index` of the section `header` refers to, of the same search.

        Raises:
            ResultsError: The section or the evaluation is not there (a damaged or missing file).
        """
        at, shared = header.evaluations_at, header.shared
        if at != self.at:
            self.records, self.at = {}, None  # one search's section in memory at a time
            self.records, self.at = self._read(at, shared, where), at
        record = self.records.get(index) if type(index) is int else None
        if record is None:
            raise ResultsError(
                f'{where} refers to evaluation {index!r} of {shared.get("image")}, which {self.path} '
                'does not hold (damaged or missing)'
            )
        return record

    def _read(self, at: int, shared: dict, where: str) -> dict[Any, dict]:
        try:
            handle = open(self.path, 'rb')  # noqa: SIM115
        except OSError as exc:
            raise ResultsError(f'{where} refers to {self.path}, unreadable ({exc.strerror})') from None
        records: dict[Any, dict] = {}
        with handle:
            handle.seek(at)
            line = parse_line(handle.readline())
            if line is None or not is_header(line) or line[HEADER] != shared or 'evaluations_at' in line:
                raise ResultsError(
                    f'{where} refers to the evaluations of {shared.get("image")} at byte {at} of '
                    f'{self.path}, which holds no such header line there (damaged or replaced)'
                )
            header = Header(line, f'{self.path}: byte {at}')
            for raw in handle:
                line = parse_line(raw)
                if line is None:
                    continue  # damaged: an evaluation a line refers to is then missing, and named
                if is_header(line):
                    break
                records.setdefault(line.get('index'), header.restore(line))
        return records
