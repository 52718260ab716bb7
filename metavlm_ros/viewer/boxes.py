"""The boxes a detection violation is drawn with: expected and found, lost, new and changed ones marked.

One list of outlines, from a record's `boxes` and `followup_detections` (docs/results.md), for every
picture of a violation: the tester's `violation_image` (ros/visualisation.py) and Foxglove's
ImageAnnotations (viewer/channels.py) draw the same boxes in the same colours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ['HIGHLIGHTED', 'ROLE_RGBA', 'Outline', 'draw_outlines', 'violation_outlines']

#: Colour of each role, RGBA in [0, 1]: expected boxes green, found ones blue; what went wrong warm.
ROLE_RGBA: dict[str, tuple[float, float, float, float]] = {
    'expected': (0.25, 0.85, 0.35, 1.0),  # a source object where the warp put it, found there
    'lost': (1.0, 0.15, 0.15, 1.0),  # expected, not found
    'found': (0.3, 0.7, 1.0, 1.0),  # found where expected
    'new': (1.0, 0.25, 0.95, 1.0),  # found, not expected
    'changed': (1.0, 0.75, 0.2, 1.0),  # found, but of another class or displaced (IoU below the bar)
}
#: Roles drawn thicker: the objects that make the violation.
HIGHLIGHTED = frozenset({'lost', 'new', 'changed'})


@dataclass(frozen=True)
class Outline:
    """One box to draw: its role (a key of ROLE_RGBA), a short label, x1, y1, x2, y2 in pixels."""

    role: str
    label: str
    box: tuple[float, float, float, float]

    @property
    def highlighted(self) -> bool:
        return self.role in HIGHLIGHTED


def violation_outlines(
    boxes: Mapping | None, found: Sequence[Mapping] | None, scale: tuple[float, float] = (1.0, 1.0)
) -> list[Outline]:
    """The outlines of a detection evaluation: expected boxes first, then the found ones.

    Args:
        boxes: The record's `boxes` (expected boxes and the match's lost, new, reclassed, displaced
            indices); None draws no expected box.
        found: The record's `followup_detections` (class, score, box); None draws none.
        scale: Image pixels per box pixel, across and down (the record's boxes are in source-frame
            pixels; a follow-up image may be smaller).
    """
    sx, sy = scale

    def scaled(box: Sequence[float]) -> tuple[float, float, float, float]:
        x1, y1, x2, y2 = (float(v) for v in box)
        return (x1 * sx, y1 * sy, x2 * sx, y2 * sy)

    boxes = boxes or {}
    expected = boxes.get('expected') or ()
    lost = set(boxes.get('lost') or ())
    new = set(boxes.get('new') or ())
    changed = {int(j): f'was {expected[int(i)]["class"]}' for i, j in boxes.get('reclassed') or ()}
    changed.update({int(row[1]): f'IoU {float(row[2]):.2f}' for row in boxes.get('displaced') or ()})
    # An expected box with no source object is the one object insertion pasted (docs/method.md §13).
    outlines = [
        Outline(
            'lost' if i in lost else 'expected',
            f'{"lost " if i in lost else ""}{"pasted " if e.get("source", 0) is None else ""}{e["class"]}',
            scaled(e['box']),
        )
        for i, e in enumerate(expected)
    ]
    for j, d in enumerate(found or ()):
        text = f'{d["class"]} {float(d["score"]):.2f}'
        if j in new:
            outlines.append(Outline('new', f'new {text}', scaled(d['box'])))
        elif j in changed:
            outlines.append(Outline('changed', f'{text} ({changed[j]})', scaled(d['box'])))
        else:
            outlines.append(Outline('found', text, scaled(d['box'])))
    return outlines


def draw_outlines(
    picture: np.ndarray, outlines: Sequence[Outline], zoom: float = 1.0, text: float = 1.0
) -> None:
    """Draw outlines into an RGB picture (in place): boxes in the pixels of the frame it shows, `zoom`
    times smaller; highlighted roles thicker; each labelled, its text `text` times the base size."""
    import cv2

    for outline in outlines:
        colour = tuple(int(round(255 * c)) for c in ROLE_RGBA[outline.role][:3])
        x1, y1, x2, y2 = (int(round(v * zoom)) for v in outline.box)
        cv2.rectangle(picture, (x1, y1), (x2, y2), colour, 3 if outline.highlighted else 1, cv2.LINE_AA)
        corner = (x1 + 2, max(y1 - 3, 10))
        font = cv2.FONT_HERSHEY_SIMPLEX
        cv2.putText(picture, outline.label, corner, font, text * 0.6, colour, 1, cv2.LINE_AA)
