"""Acceptance criteria: a YAML file of claims about a model (assurance/kinds.py), read and checked.

The schema is docs/assurance.md's; every error names its key (`criteria[2].limit: ...`) in one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from metavlm_ros.assurance.criterion import Criterion, Reader, Region
from metavlm_ros.assurance.kinds import KINDS
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.answers import Thresholds, answer_for
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.water_ranges import WATER_RANGES

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
_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')
_TOP = {'format', 'name', 'threshold', 'iou_threshold', 'confidence', 'water_ranges', 'criteria'}


@dataclass(frozen=True)
class Criteria:
    """A criteria file, read and checked: its claims, defaults, and the file's sha256."""

    path: Path
    sha256: str
    name: str
    threshold: float
    confidence: float
    criteria: tuple[Criterion, ...] = field(default_factory=tuple)
    #: Detections: a matched box below this IoU is displaced (docs/method.md §13).
    iou_threshold: float = DEFAULT_IOU_THRESHOLD
    #: Where MR12 `water` takes each pixel's range: 'prior' or 'truth' (the footage's range maps).
    water_ranges: str = 'prior'

    def key(self, kind: str) -> str:
        """The records' violation key these criteria judge by, for a model of prediction `kind`: the
        most demanding of that kind's keys at these criteria's thresholds (method/answers.py)."""
        return answer_for(kind).refining_key(Thresholds((self.threshold,), self.iou_threshold))


def example_criteria(name: str = EXAMPLE) -> Path:
    """A shipped criteria file (`EXAMPLE` unless named): from the source checkout, else the installed
    share directory.

    Raises:
        ParameterError: Neither holds it.
    """
    import sys

    places = [
        Path(__file__).resolve().parents[2] / 'config' / 'criteria' / name,
        Path(sys.prefix) / 'share' / 'metavlm_ros' / 'config' / 'criteria' / name,
    ]
    for place in places:
        if place.is_file():
            return place
    raise ParameterError(f'the example criteria {name} are not installed (looked in {places[0].parent})')


def load_criteria(path: str | Path) -> Criteria:
    """Read and check a criteria file.

    Raises:
        ParameterError: The file is unreadable, not YAML, or a key is unknown, missing or out of range;
            the message names the key.
    """
    path = Path(path)
    reader = Reader(path)
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
    iou_threshold = reader.number('iou_threshold', document.get('iou_threshold', DEFAULT_IOU_THRESHOLD), 0, 1)
    confidence = reader.number('confidence', document.get('confidence', 0.95), 0, 1)
    water_ranges = document.get('water_ranges', 'prior')
    if water_ranges not in WATER_RANGES:
        raise reader.fail('water_ranges', f'must be one of {", ".join(WATER_RANGES)}, got {water_ranges!r}')
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
        kind = KINDS.get(item.get('kind'))
        if kind is None:
            raise reader.fail(f'{where}.kind', f'must be one of {", ".join(KINDS)}, got {item.get("kind")!r}')
        for key in item:
            if key not in kind.keys:
                raise reader.fail(
                    f'{where}.{key}',
                    f'unknown key for {kind.kind} (expected: {", ".join(sorted(kind.keys))})',
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
        criterion = kind.read(reader, where, item, cid, confidence)
        claim = item.get('claim')
        if claim is not None and (not isinstance(claim, str) or not claim.strip()):
            raise reader.fail(f'{where}.claim', 'must be a text')
        criteria.append(dataclasses.replace(criterion, claim=(claim or criterion.default_claim()).strip()))
    return Criteria(
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        name=name.strip(),
        threshold=threshold,
        confidence=confidence,
        criteria=tuple(criteria),
        iou_threshold=iou_threshold,
        water_ranges=water_ranges,
    )
