"""The Foxglove channels of a results directory, shared by the MCAP export and the live server."""

from __future__ import annotations

import json
from typing import Any

import foxglove
from foxglove.channels import CompressedImageChannel, ImageAnnotationsChannel
from foxglove.messages import (
    Color,
    CompressedImage,
    ImageAnnotations,
    Point2,
    PointsAnnotation,
    PointsAnnotationType,
    TextAnnotation,
    Timestamp,
)

from metavlm_ros.viewer.boxes import ROLE_RGBA, violation_outlines

__all__ = [
    'OVERLAY_RGBA',
    'SUMMARY_SCHEMA',
    'TOPICS',
    'VIOLATION_SCHEMA',
    'ViolationChannels',
    'box_annotations',
    'changed_classes',
    'image_size',
    'overlay_lines',
    'topic_names',
]

#: Topic suffixes under the prefix (`/metavlm`, or `/metavlm/<subfolder>` for a demo's models).
TOPICS = {
    'source': 'source/image',
    'followup': 'followup/image',
    'annotations': 'followup/annotations',
    'violations': 'violations',
    'summary': 'summary',
}

_NUMBER = {'type': 'number'}
_VALUES = {'type': 'object', 'additionalProperties': _NUMBER}
#: What names a search, in a violation's record and in a summary alike.
_SEARCH = {
    'image': {'type': 'string'},
    'algorithm': {'type': 'string'},
    'seed': {'type': 'integer'},
    'model': {'type': 'string'},
}
#: The evaluation record of a violation (docs/results.md) plus where the export put it; further
#: record fields pass through (commands add some), so the schema names what every record has.
VIOLATION_SCHEMA = {
    'title': 'metavlm.Violation',
    'type': 'object',
    'properties': {
        **_SEARCH,
        'index': {'type': 'integer'},
        'composition': {'type': 'string'},
        'order': {'type': 'integer'},
        'parameters': _VALUES,
        'f_trans': _NUMBER,
        'f_pred': _NUMBER,
        'kind': {'type': 'string', 'enum': ['count', 'confidence', 'detection']},
        'source': _VALUES,
        'followup': _VALUES,
        'violation': {'type': 'object', 'additionalProperties': {'type': 'boolean'}},
        'changed': {'type': 'array', 'items': {'type': 'string'}},
        'stamp_ns': {'type': 'integer'},
        'frame': {'type': ['string', 'null']},
    },
    'required': [
        'image',
        'index',
        'composition',
        'order',
        'f_trans',
        'f_pred',
        'kind',
        'changed',
        'stamp_ns',
    ],
    'additionalProperties': True,
}
SUMMARY_SCHEMA = {
    'title': 'metavlm.SearchSummary',
    'type': 'object',
    'properties': {
        **_SEARCH,
        'evaluations': {'type': 'integer'},
        'violations': {'type': 'integer'},
        'hypervolume': _NUMBER,
        'seconds': _NUMBER,
        'stopped': {'type': 'boolean'},
        'stamp_ns': {'type': 'integer'},
    },
    'required': ['image', 'evaluations', 'violations', 'stamp_ns'],
    'additionalProperties': True,
}
#: The overlay's background, RGBA in [0, 1]: violations in red, readable on murky water (also drawn
#: into the pixels of the tester's violation_followup, ros/visualisation.py).
OVERLAY_RGBA = (0.75, 0.1, 0.1, 0.8)
_TEXT = Color(r=1.0, g=1.0, b=1.0, a=1.0)
_BACKGROUND = Color(r=OVERLAY_RGBA[0], g=OVERLAY_RGBA[1], b=OVERLAY_RGBA[2], a=OVERLAY_RGBA[3])
_FONT = 12.0


def topic_names(prefix: str = '/metavlm') -> dict[str, str]:
    """The topic of each channel under `prefix`."""
    return {key: f'{prefix.rstrip("/")}/{suffix}' for key, suffix in TOPICS.items()}


def changed_classes(record: dict) -> list[str]:
    """The classes whose value changed enough to make the record a violation.

    Counts (Eq. 4): a count that differs by at least 1. Confidences (Eq. 5): a difference of at
    least the smallest threshold at which the record is a violation. Detections (§13): the classes
    of the objects lost, new, re-classed or displaced.
    """
    source, followup = record.get('source') or {}, record.get('followup') or {}
    if record.get('kind') == 'detection':
        return _changed_objects(record)
    if record.get('kind') == 'count':
        limit = 1.0
    else:
        hits = [float(t) for t, hit in (record.get('violation') or {}).items() if hit]
        if not hits:
            return []
        limit = min(hits)
    return [
        name
        for name in source
        if name in followup and abs(float(followup[name]) - float(source[name])) >= limit - 1e-12
    ]


def _changed_objects(record: dict) -> list[str]:
    boxes = record.get('boxes') or {}
    expected, found = boxes.get('expected') or [], record.get('followup_detections') or []
    names = [expected[i]['class'] for i in boxes.get('lost') or ()]
    names += [found[j]['class'] for j in boxes.get('new') or ()]
    names += [
        expected[row[0]]['class']
        for row in [*(boxes.get('reclassed') or ()), *(boxes.get('displaced') or ())]
    ]
    return list(dict.fromkeys(names))


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG from its header; None for another format."""
    if data[:8] != b'\x89PNG\r\n\x1a\n' or len(data) < 24:
        return None
    return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')


def box_annotations(
    record: dict, when: Timestamp, scale: tuple[float, float]
) -> tuple[list[PointsAnnotation], list[TextAnnotation]]:
    """A detection violation's boxes on its follow-up (viewer/boxes.py): expected and found outlines,
    lost and new ones thicker, each labelled; `scale`: image pixels per record (source-frame) pixel."""
    points, texts = [], []
    for outline in violation_outlines(record.get('boxes'), record.get('followup_detections'), scale):
        colour = Color(**dict(zip('rgba', ROLE_RGBA[outline.role], strict=True)))
        x1, y1, x2, y2 = outline.box
        points.append(
            PointsAnnotation(
                timestamp=when,
                type=PointsAnnotationType.LineLoop,
                points=[Point2(x=x1, y=y1), Point2(x=x2, y=y1), Point2(x=x2, y=y2), Point2(x=x1, y=y2)],
                outline_color=colour,
                thickness=4.0 if outline.highlighted else 2.0,
            )
        )
        texts.append(
            TextAnnotation(
                timestamp=when,
                position=Point2(x=x1, y=max(y1 - 2.0, _FONT)),
                text=outline.label,
                font_size=_FONT,
                text_color=colour,
                background_color=Color(r=0.0, g=0.0, b=0.0, a=0.6),
            )
        )
    return points, texts


def overlay_lines(record: dict) -> list[str]:
    """The text drawn on a violation's follow-up: evaluation, relations, parameters, objectives, changes."""
    parameters = ', '.join(f'{k}={v:.4g}' for k, v in (record.get('parameters') or {}).items())
    source, followup = record.get('source') or {}, record.get('followup') or {}
    changes = ', '.join(
        f'{name} {source[name]:.3g}->{followup[name]:.3g}' for name in changed_classes(record)
    )
    run = f', run {record["run"]}' if record.get('run') is not None else ''
    return [
        # What `metavlm render` needs to make this follow-up again, and what names it in the table.
        f'evaluation {record.get("index")} of {record.get("image")} '
        f'({record.get("algorithm")}, seed {record.get("seed")}{run})',
        f'composition {record.get("composition")} (order {record.get("order")}): {parameters or "-"}',
        f'f_trans {record.get("f_trans", 0.0):.4f}  f_pred {record.get("f_pred", 0.0):.4f}',
        f'changed: {changes or "-"}',
    ]


def _timestamp(ns: int) -> Timestamp:
    return Timestamp(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000)


class ViolationChannels:
    """The channels one results directory (or one live search) logs to, in one SDK context.

    The same class feeds an MCAP writer (export) and a WebSocket server (live): both see the same
    topics, schemas and overlay text. A message nobody receives (a live server without a subscriber
    to its channel) is not built: the search pays for a viewer only while one watches.
    """

    def __init__(self, context: foxglove.Context, prefix: str = '/metavlm') -> None:
        """Create the channels under `prefix` in `context`."""
        self.topics = topic_names(prefix)
        self.source = CompressedImageChannel(self.topics['source'], context=context)
        self.followup = CompressedImageChannel(self.topics['followup'], context=context)
        self.annotations = ImageAnnotationsChannel(self.topics['annotations'], context=context)
        self.violations = foxglove.Channel(
            self.topics['violations'], schema=VIOLATION_SCHEMA, context=context
        )
        self.summary = foxglove.Channel(self.topics['summary'], schema=SUMMARY_SCHEMA, context=context)

    def log_source(self, stamp_ns: int, png: bytes) -> None:
        """A source frame (PNG bytes) at its camera time."""
        if not self.source.has_sinks():
            return
        message = CompressedImage(timestamp=_timestamp(stamp_ns), frame_id='source', data=png, format='png')
        self.source.log(message, log_time=stamp_ns)

    def log_violation(
        self,
        record: dict,
        stamp_ns: int,
        image: bytes | None = None,
        image_format: str = 'png',
        box_scale: tuple[float, float] | None = None,
    ) -> None:
        """A violation's record, and its follow-up frame with the overlay when its image is given
        (`box_scale`: see `log_followup`)."""
        if self.violations.has_sinks():
            message = {**record, 'changed': changed_classes(record), 'stamp_ns': int(stamp_ns)}
            message.setdefault('frame', None)
            self.violations.log(_jsonable(message), log_time=stamp_ns)
        if image is not None:
            self.log_followup(record, stamp_ns, image, image_format, box_scale)

    def log_followup(
        self,
        record: dict,
        stamp_ns: int,
        image: bytes,
        image_format: str = 'png',
        box_scale: tuple[float, float] | None = None,
    ) -> None:
        """A violating follow-up frame (PNG, or `image_format`, bytes) and its overlay, at the source
        frame's time; a detection record's boxes too, given `box_scale` (the image's pixels per
        source-frame pixel, across and down: the records' boxes are in the source frame's)."""
        if not self.wants_followups():
            return
        when = _timestamp(stamp_ns)
        self.followup.log(
            CompressedImage(timestamp=when, frame_id='followup', data=image, format=image_format),
            log_time=stamp_ns,
        )
        texts = [
            TextAnnotation(
                timestamp=when,
                position=Point2(x=4.0, y=4.0 + (_FONT + 4.0) * (row + 1)),
                text=line,
                font_size=_FONT,
                text_color=_TEXT,
                background_color=_BACKGROUND,
            )
            for row, line in enumerate(overlay_lines(record))
        ]
        points: list[PointsAnnotation] = []
        if record.get('kind') == 'detection' and box_scale is not None:
            points, labels = box_annotations(record, when, box_scale)
            texts += labels
        self.annotations.log(ImageAnnotations(timestamp=when, points=points, texts=texts), log_time=stamp_ns)

    def wants_sources(self) -> bool:
        """Whether a source frame would reach anyone (a live server without a subscriber: no)."""
        return self.source.has_sinks()

    def wants_followups(self) -> bool:
        """Whether a follow-up would reach anyone: callers skip making its PNG when not."""
        return self.followup.has_sinks() or self.annotations.has_sinks()

    def log_summary(self, summary: dict, violations: int, stamp_ns: int) -> None:
        """A search's summary record with its violation count."""
        if not self.summary.has_sinks():
            return
        message = {**summary, 'violations': int(violations), 'stamp_ns': int(stamp_ns)}
        self.summary.log(_jsonable(message), log_time=stamp_ns)

    def close(self) -> None:
        """Close every channel (a live server unadvertises them)."""
        for channel in (self.source, self.followup, self.annotations, self.violations, self.summary):
            channel.close()


def _jsonable(message: dict) -> bytes:
    # Serialised once, here (the SDK would dump a dict again); numpy leftovers of live records become lists.
    return json.dumps(message, default=_plain).encode()


def _plain(value: Any) -> Any:
    if hasattr(value, 'tolist'):
        return value.tolist()
    raise TypeError(f'not JSON: {type(value).__name__}')
