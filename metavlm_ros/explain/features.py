"""Interpretable features of evaluations: each relation's signed deviation, the order, the source's look,
and its objects where the footage has ground truth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.results import read_source_frame
from metavlm_ros.footage.ground_truth import GroundTruthLookup
from metavlm_ros.footage.truth import GroundTruth
from metavlm_ros.method.relations import RELATION_BY_ID, RELATIONS
from metavlm_ros.method.underwater import UNDERWATER_PARAMETERS

__all__ = [
    'FRAME_ATTRIBUTES',
    'TRUTH_ATTRIBUTES',
    'Feature',
    'FeatureTable',
    'feature_table',
    'frame_attributes',
    'truth_attributes',
]

#: The source frame's attributes: name -> (what it is, unit), all from the frame's CIELAB means.
FRAME_ATTRIBUTES: dict[str, tuple[str, str]] = {
    'brightness': ('mean lightness L*/100 of the source frame', ''),
    'contrast': ('standard deviation of L*/100 over the source frame', ''),
    'cast_a': ('mean a* of the source frame (+ red, - green)', ''),
    'cast_b': ('mean b* of the source frame (+ yellow, - blue)', ''),
}

#: What the ground truth says of the source frame, where its footage has one (the project's scenes, a
#: bag with /metavlm/ground_truth): name -> (what it is, unit). Columns only when some frame has it.
TRUTH_ATTRIBUTES: dict[str, tuple[str, str]] = {
    'objects': ('objects visible in the source frame (ground truth)', ''),
    'object_area': ('share of the frame the largest visible object covers (ground truth)', ''),
    'object_x': ("the largest object's centre across the frame, 0 left to 1 right (ground truth)", ''),
    'object_y': ("the largest object's centre down the frame, 0 top to 1 bottom (ground truth)", ''),
}

# Units short enough for a rule; the underwater relations state theirs in their table.
_UNITS = {'rotation': 'deg'} | {rid: row[1] for rid, row in UNDERWATER_PARAMETERS.items()}


@dataclass(frozen=True)
class Feature:
    """One column of the table: a relation's deviation, an extra's value, the order or a frame attribute.

    `kind`: 'relation' (signed deviation of the parameter from its nominal value, 0 when off; a rule
    shows the parameter's value, nominal + deviation), 'active' (1 when a relation that changes a
    frame at its nominal value is on: CLAHE), 'extra' (a relation's secondary parameter, its nominal
    value when off), 'order' or 'frame'.
    """

    name: str
    kind: str
    label: str
    unit: str = ''
    nominal: float = 0.0
    relation: str | None = None

    def as_record(self) -> dict:
        return {'feature': self.name, 'kind': self.kind, 'label': self.label, 'unit': self.unit,
                'relation': self.relation}  # fmt: skip


def frame_attributes(rgb: np.ndarray) -> dict[str, float]:
    """Brightness, contrast and colour cast (a*, b*) of an RGB uint8 frame, from its CIELAB values."""
    import cv2

    lab = cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB).reshape(-1, 3).astype(np.float64)
    # OpenCV's 8-bit LAB: L* * 255 / 100, a* + 128, b* + 128.
    lightness = lab[:, 0] / 255.0
    return {
        'brightness': float(lightness.mean()),
        'contrast': float(lightness.std()),
        'cast_a': float(lab[:, 1].mean() - 128.0),
        'cast_b': float(lab[:, 2].mean() - 128.0),
    }


def truth_attributes(truth: GroundTruth, width: int, height: int) -> dict[str, float]:
    """How many objects a frame's ground truth shows, and the size and place of the largest (by its
    visible area): the object attributes a failure mode can name."""
    if not truth.boxes:
        return {'objects': 0.0, 'object_area': 0.0, 'object_x': np.nan, 'object_y': np.nan}
    largest = max(truth.boxes, key=lambda b: b['area'])
    x0, y0, x1, y1 = largest['box']
    return {
        'objects': float(len(truth.boxes)),
        'object_area': float(largest['area']),
        'object_x': (x0 + x1) / 2 / width,
        'object_y': (y0 + y1) / 2 / height,
    }


def _label(rid: str, parameter: str) -> str:
    return rid if parameter == rid else f'{rid} {parameter}'


def _relation_features(relation_ids: Sequence[str]) -> list[Feature]:
    features = []
    for rid in relation_ids:
        relation = RELATION_BY_ID[rid]
        unit = _UNITS.get(rid, '')
        features.append(
            Feature(rid, 'relation', _label(rid, relation.parameter), unit, relation.nominal, rid)
        )
        if relation.changes_at_nominal:
            features.append(Feature(f'{rid}_active', 'active', f'{rid} on', '', 0.0, rid))
        for extra, extra_id in zip(relation.extras, relation.extra_ids, strict=True):
            features.append(Feature(extra_id, 'extra', f'{rid} {extra.name}', '', extra.nominal, rid))
    return features


@dataclass
class FeatureTable:
    """The evaluations the catalogue learns from, one row each, with their features and where they lie.

    Attributes:
        features: The columns of `values`.
        values: One row per evaluation (NaN: a frame attribute of a source frame that is not stored).
        records: (results directory, record) of each row.
        searches: Each row's search, as an index into `search_names`.
        notes: What was left out, and why.
    """

    features: list[Feature]
    values: np.ndarray
    records: list[tuple[Path, dict]]
    searches: np.ndarray
    search_names: list[str]
    notes: list[str] = field(default_factory=list)

    def column(self, name: str) -> np.ndarray:
        return self.values[:, [f.name for f in self.features].index(name)]


def _search_key(record: dict) -> tuple:
    return (record.get('image'), record.get('algorithm'), record.get('seed'), record.get('run'))


def feature_table(runs: Sequence, frames: dict[str, dict[str, float]] | None = None) -> FeatureTable:
    """The feature table of every usable evaluation of `runs` (assurance/evidence.py `Run`s).

    Failed evaluations (no answer), the identity (order 0: never a violation) and records without
    `parameters` (written before records carried them) are left out and counted in the notes.

    Args:
        runs: The results directories' records and summaries.
        frames: Source frames' attributes already measured, by sha256, filled in as frames are read:
            a caller that builds tables again and again (the tester) reads each source frame once.
    """
    used = {rid for run in runs for rid in run.space.enabled_ids}
    relation_ids = [r.id for r in RELATIONS if r.id in used]
    features = _relation_features(relation_ids) + [Feature('order', 'order', 'order')]
    features += [Feature(name, 'frame', name, unit) for name, (_, unit) in FRAME_ATTRIBUTES.items()]
    column = {f.name: k for k, f in enumerate(features)}
    attributes: dict[str, dict[str, float]] = {} if frames is None else frames
    rows: list[list[float]] = []
    records: list[tuple[Path, dict]] = []
    search_ids: list[int] = []
    search_names: dict[tuple, int] = {}
    failed = identity = unplaced = unstored = 0
    lookup = GroundTruthLookup()
    truth_rows: list[dict[str, float]] = []
    for run in runs:
        sources = {}
        truths: dict[tuple, dict[str, float]] = {}
        for summary in run.summaries:
            truth = lookup.at(summary.get('frame_file'), summary.get('stamp_ns') or 0)
            if truth is not None and summary.get('source_size'):
                truths[_search_key(summary)] = truth_attributes(truth, *summary['source_size'])
            sha = summary.get('source_sha256')
            if sha and sha not in attributes:
                try:
                    attributes[sha] = frame_attributes(read_source_frame(run.directory, summary))
                except ResultsError:
                    attributes[sha] = {}
            sources[_search_key(summary)] = attributes.get(sha or '', {})
        for record in run.records:
            if record.get('failed'):
                failed += 1
                continue
            if not record.get('order'):
                identity += 1
                continue
            parameters = record.get('parameters')
            if not isinstance(parameters, dict):
                unplaced += 1
                continue
            row = [np.nan] * len(features)
            for feature in features[: column['order']]:
                # Off: no deviation, not on; an extra at its nominal value.
                row[column[feature.name]] = feature.nominal if feature.kind == 'extra' else 0.0
            for feature in features[: column['order']]:
                value = parameters.get(feature.name if feature.kind != 'active' else feature.relation)
                if value is None:
                    continue
                if feature.kind == 'relation':
                    row[column[feature.name]] = float(value) - feature.nominal
                elif feature.kind == 'active':
                    row[column[feature.name]] = 1.0
                else:
                    row[column[feature.name]] = float(value)
            row[column['order']] = float(record['order'])
            looks = sources.get(_search_key(record), {})
            if not looks:
                unstored += 1
            for name in FRAME_ATTRIBUTES:
                row[column[name]] = looks.get(name, np.nan)
            truth_rows.append(truths.get(_search_key(record), {}))
            key = (str(run.directory), *_search_key(record))
            search_ids.append(search_names.setdefault(key, len(search_names)))
            rows.append(row)
            records.append((run.directory, record))
    notes = []
    if failed:
        notes.append(f'{failed} failed evaluations (no readable answer) left out')
    if identity:
        notes.append(f'{identity} identity evaluations (order 0, never a violation) left out')
    if unplaced:
        notes.append(f'{unplaced} evaluations without parameters (an earlier format) left out')
    if unstored:
        notes.append(
            f'{unstored} evaluations of searches whose source frame is not stored: no frame attributes, '
            'outside every rule that names one'
        )
    values = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(features))
    if any(truth_rows):
        features += [Feature(name, 'frame', name, unit) for name, (_, unit) in TRUTH_ATTRIBUTES.items()]
        known = np.array(
            [[row.get(name, np.nan) for name in TRUTH_ATTRIBUTES] for row in truth_rows], dtype=np.float64
        )
        values = np.hstack([values, known.reshape(len(rows), len(TRUTH_ATTRIBUTES))])
        missing = sum(not row for row in truth_rows)
        if missing:
            notes.append(
                f'{missing} evaluations of frames without ground truth: outside every rule on objects'
            )
    names = ['/'.join(str(part) for part in key if part is not None) for key in search_names]
    return FeatureTable(features, values, records, np.asarray(search_ids, dtype=np.int64), names, notes)
