"""Acceptance criteria: a YAML file of claims about a model (existence, rate, envelope), read and checked.

The schema is docs/assurance.md's; every error names its key (`criteria[2].limit: ...`) in one line.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import directions
from metavlm_ros.method.metrics import threshold_key
from metavlm_ros.method.relations import RELATION_BY_ID

__all__ = [
    'CRITERIA_FORMAT',
    'EXAMPLE',
    'example_criteria',
    'KINDS',
    'Criteria',
    'Criterion',
    'Region',
    'load_criteria',
]

CRITERIA_FORMAT = 1
#: The example criteria for an AUR's forward camera (config/criteria/ in the source and in the
#: installed package's share directory).
EXAMPLE = 'aur_camera.yaml'
KINDS = ('existence', 'rate', 'envelope')
_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')
_TOP = {'format', 'name', 'threshold', 'confidence', 'criteria'}
_KEYS = {
    'existence': {'id', 'kind', 'claim', 'within', 'f_trans_max'},
    'rate': {'id', 'kind', 'claim', 'within', 'limit', 'confidence', 'samples'},
    'envelope': {'id', 'kind', 'claim', 'relation', 'direction', 'at_least', 'frames', 'confidence'},
}
_DIRECTIONS = ('-', '+', 'both')


@dataclass(frozen=True)
class Region:
    """Relations and their parameter intervals: changes made of those relations only, each inside its
    interval (the nominal value, for all but CLAHE, is the relation off)."""

    bounds: tuple[tuple[str, float, float], ...]

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(relation for relation, _, _ in self.bounds)

    def space(self) -> SearchSpace:
        """The search space of this region: its relations enabled, their ranges narrowed to it."""
        return SearchSpace.from_options(
            enabled=list(self.relations), ranges={r: (lo, hi) for r, lo, hi in self.bounds}
        )

    def holds(self, parameters: Mapping[str, float]) -> bool:
        """Whether a composition (its record's `parameters`) lies inside the region."""
        inside = {relation: (lo, hi) for relation, lo, hi in self.bounds}
        for name, value in parameters.items():
            if name not in RELATION_BY_ID:
                continue  # an extra (motion_blur_angle): its relation's bounds decide
            if name not in inside:
                return False
            lo, hi = inside[name]
            if not lo <= value <= hi:
                return False
        return True

    def describe(self) -> str:
        return ', '.join(f'{r} in [{lo:g}, {hi:g}]' for r, lo, hi in self.bounds)


@dataclass(frozen=True)
class Criterion:
    """One claim. Fields not of its kind are None."""

    id: str
    kind: str
    claim: str
    within: Region | None = None
    f_trans_max: float | None = None
    limit: float | None = None
    confidence: float | None = None
    samples: int | None = None
    relation: str | None = None
    direction: str | None = None
    at_least: float | None = None
    frames: float | None = None


@dataclass(frozen=True)
class Criteria:
    """A criteria file, read and checked: its claims, defaults, and the file's sha256."""

    path: Path
    sha256: str
    name: str
    threshold: float
    confidence: float
    criteria: tuple[Criterion, ...] = field(default_factory=tuple)

    def key(self, kind: str) -> str:
        """The records' violation key these criteria judge by, for a model of prediction `kind`."""
        return 'count' if kind == 'count' else threshold_key(self.threshold)


class _Reader:
    """Checks one criteria file's values, naming the key of the first bad one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, why: str) -> ParameterError:
        return ParameterError(f'{self.path}: {where}: {why}')

    def number(self, where: str, value: Any, low: float, high: float, *, open_low: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(where, f'must be a number, got {value!r}')
        below = value <= low if open_low else value < low
        if below or value > high:
            side = '(' if open_low else '['
            raise self.fail(where, f'must lie in {side}{low:g}, {high:g}], got {value!r}')
        return float(value)

    def region(self, where: str, value: Any) -> Region:
        if not isinstance(value, Mapping) or not value:
            raise self.fail(where, 'must map relation ids to [low, high], e.g. {rotation: [-5, 5]}')
        bounds = []
        for relation, interval in value.items():
            here = f'{where}.{relation}'
            if relation not in RELATION_BY_ID:
                raise self.fail(here, f'unknown relation (known: {", ".join(RELATION_BY_ID)})')
            if not isinstance(interval, (list, tuple)) or len(interval) != 2:
                raise self.fail(here, f'must be [low, high], got {interval!r}')
            spec = RELATION_BY_ID[relation]
            lo, hi = (self.number(here, v, spec.low, spec.high, open_low=False) for v in interval)
            if lo > hi:
                raise self.fail(here, f'low {lo:g} is above high {hi:g}')
            bounds.append((relation, lo, hi))
        # In the fixed relation order, so that equal regions compare equal whatever the file's order.
        order = list(RELATION_BY_ID)
        return Region(tuple(sorted(bounds, key=lambda b: order.index(b[0]))))


def _claim(item: Mapping, kind: str, region: Region | None, values: dict) -> str:
    """The claim in words, when the file gives none."""
    if kind == 'existence':
        parts = [f'f_trans <= {values["f_trans_max"]:g}'] if values.get('f_trans_max') is not None else []
        if region is not None:
            parts.append(region.describe())
        return 'no violation' + (' with ' + ' and '.join(parts) if parts else '')
    if kind == 'rate':
        return (
            f'violation rate <= {values["limit"]:.3g} within {region.describe()}, '
            f'{values["confidence"]:.0%} confidence'
        )
    side = {'both': '+-', '+': '+', '-': '-'}[values['direction']]
    return (
        f'{values["relation"]} holds to {side}{values["at_least"]:g} on >= {values["frames"]:.0%} of frames, '
        f'{values["confidence"]:.0%} confidence'
    )


def example_criteria() -> Path:
    """The shipped example criteria file: from the source checkout, else the installed share directory.

    Raises:
        ParameterError: Neither holds it.
    """
    import sys

    places = [
        Path(__file__).resolve().parents[2] / 'config' / 'criteria' / EXAMPLE,
        Path(sys.prefix) / 'share' / 'metavlm_ros' / 'config' / 'criteria' / EXAMPLE,
    ]
    for place in places:
        if place.is_file():
            return place
    raise ParameterError(f'the example criteria {EXAMPLE} are not installed (looked in {places[0].parent})')


def load_criteria(path: str | Path) -> Criteria:
    """Read and check a criteria file.

    Raises:
        ParameterError: The file is unreadable, not YAML, or a key is unknown, missing or out of range;
            the message names the key.
    """
    path = Path(path)
    reader = _Reader(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ParameterError(f'{path}: cannot read the criteria file ({exc.strerror or exc})') from None
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, 'problem_mark', None)
        where = f'line {mark.line + 1}' if mark is not None else 'YAML'
        raise ParameterError(f'{path}: {where}: not valid YAML ({getattr(exc, "problem", exc)})') from None
    if not isinstance(document, Mapping):
        raise reader.fail('top level', 'must be a mapping with format, name and criteria')
    for key in document:
        if key not in _TOP:
            raise reader.fail(str(key), f'unknown key (expected: {", ".join(sorted(_TOP))})')
    if document.get('format') != CRITERIA_FORMAT:
        raise reader.fail('format', f'must be {CRITERIA_FORMAT}, got {document.get("format")!r}')
    name = document.get('name')
    if not isinstance(name, str) or not name.strip():
        raise reader.fail('name', 'must be a non-empty text naming what the criteria are for')
    threshold = reader.number('threshold', document.get('threshold', 0.05), 0, 1)
    if threshold >= 1:
        raise reader.fail('threshold', f'must lie in (0, 1), got {threshold:g}')
    confidence = reader.number('confidence', document.get('confidence', 0.95), 0, 1)
    if confidence >= 1:
        raise reader.fail('confidence', f'must lie in (0, 1), got {confidence:g}')
    items = document.get('criteria')
    if not isinstance(items, list) or not items:
        raise reader.fail('criteria', 'must be a list of at least one criterion')
    criteria, seen = [], set()
    for n, item in enumerate(items):
        where = f'criteria[{n}]'
        if not isinstance(item, Mapping):
            raise reader.fail(where, 'must be a mapping with id and kind')
        kind = item.get('kind')
        if kind not in KINDS:
            raise reader.fail(f'{where}.kind', f'must be one of {", ".join(KINDS)}, got {kind!r}')
        for key in item:
            if key not in _KEYS[kind]:
                raise reader.fail(
                    f'{where}.{key}', f'unknown key for {kind} (expected: {", ".join(sorted(_KEYS[kind]))})'
                )
        cid = item.get('id')
        if not isinstance(cid, str) or not _ID.match(cid):
            raise reader.fail(
                f'{where}.id', f'must be letters, digits, _ . - (a JUnit test name), got {cid!r}'
            )
        if cid in seen:
            raise reader.fail(f'{where}.id', f'{cid!r} is used twice')
        seen.add(cid)
        where = f'criteria[{n}] ({cid})'
        criteria.append(_criterion(reader, where, item, kind, cid, confidence))
    return Criteria(
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        name=name.strip(),
        threshold=threshold,
        confidence=confidence,
        criteria=tuple(criteria),
    )


def _required(reader: _Reader, where: str, item: Mapping, key: str) -> Any:
    if key not in item or item[key] is None:
        raise reader.fail(f'{where}.{key}', 'missing')
    return item[key]


def _criterion(
    reader: _Reader, where: str, item: Mapping, kind: str, cid: str, confidence: float
) -> Criterion:
    values: dict[str, Any] = {}
    region = None
    if 'within' in item:
        region = reader.region(f'{where}.within', item['within'])
    if kind == 'existence':
        if 'f_trans_max' in item:
            values['f_trans_max'] = reader.number(f'{where}.f_trans_max', item['f_trans_max'], 0, 6)
        if region is None and 'f_trans_max' not in item:
            raise reader.fail(where, 'an existence claim needs within, f_trans_max or both')
    elif kind == 'rate':
        region = reader.region(f'{where}.within', _required(reader, where, item, 'within'))
        values['limit'] = reader.number(f'{where}.limit', _required(reader, where, item, 'limit'), 0, 1)
        samples = item.get('samples', 300)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise reader.fail(f'{where}.samples', f'must be a whole number of samples >= 1, got {samples!r}')
        values['samples'] = samples
    else:
        relation = _required(reader, where, item, 'relation')
        if relation not in RELATION_BY_ID:
            raise reader.fail(f'{where}.relation', f'unknown relation (known: {", ".join(RELATION_BY_ID)})')
        direction = str(item.get('direction', 'both'))
        sides = {d.name[-1]: d.end for d in directions(SearchSpace.from_options([relation]))}
        if direction not in _DIRECTIONS or (direction != 'both' and direction not in sides):
            raise reader.fail(
                f'{where}.direction', f'{relation} has the directions {", ".join(sides)}; got {direction!r}'
            )
        ends = [end for side, end in sides.items() if direction in ('both', side)]
        values.update(relation=relation, direction=direction)
        values['at_least'] = reader.number(
            f'{where}.at_least', _required(reader, where, item, 'at_least'), 0, min(ends)
        )
        values['frames'] = reader.number(f'{where}.frames', _required(reader, where, item, 'frames'), 0, 1)
    if kind != 'existence':
        values['confidence'] = confidence
        if 'confidence' in item:
            values['confidence'] = reader.number(f'{where}.confidence', item['confidence'], 0, 1)
            if values['confidence'] >= 1:
                raise reader.fail(f'{where}.confidence', 'must lie in (0, 1)')
    claim = item.get('claim')
    if claim is not None and (not isinstance(claim, str) or not claim.strip()):
        raise reader.fail(f'{where}.claim', 'must be a text')
    return Criterion(
        id=cid,
        kind=kind,
        claim=(claim or _claim(item, kind, region, values)).strip(),
        within=region,
        **values,
    )
