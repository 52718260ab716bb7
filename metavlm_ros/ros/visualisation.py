"""Violation images for rqt_image_view and rviz: source and follow-up side by side; the follow-up overlaid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.records import detections_record
from metavlm_ros.viewer.boxes import ROLE_RGBA, Outline, draw_outlines, violation_outlines
from metavlm_ros.viewer.channels import OVERLAY_RGBA, overlay_lines

__all__ = ['detection_outlines', 'followup_overlay', 'format_change', 'violation_image']

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_TEXT = (255, 255, 255)
_CHANGED = (255, 190, 60)  # amber: the classes whose value moved
_BACKGROUND = (24, 24, 24)
_OVERLAY = np.round(255 * np.array(OVERLAY_RGBA[:3], np.float32))  # the red of Foxglove's overlay
_OVERLAY_ALPHA = OVERLAY_RGBA[3]


def format_change(cls: str, source: float, followup: float, kind: str) -> str:
    """One line saying how a class changed: 'animal 2 -> 0 (-2)' or 'trash 0.210 -> 0.262 (+0.052)'."""
    delta = followup - source
    if kind == 'count':
        return f'{cls} {source:g} -> {followup:g} ({delta:+g})'
    return f'{cls} {source:.3f} -> {followup:.3f} ({delta:+.3f})'


def detection_outlines(
    source: Prediction, boxes: Mapping | None, followup: Prediction | None, scale: tuple[float, float]
) -> tuple[list[Outline], list[Outline]]:
    """The boxes of a detection evaluation to draw on the source and on the follow-up panel.

    Args:
        source: The source prediction (its objects go on the source panel).
        boxes: The evaluation's match (`Evaluation.boxes`): the expected boxes, lost, new, ...
        followup: The follow-up prediction (its objects go on the follow-up panel).
        scale: Pixels of the pictures drawn per pixel of the boxes, across and down.
    """
    if source.kind != 'detection':
        return [], []
    sx, sy = scale
    on_source = [Outline('expected', d.cls, d.scaled(sx, sy).box) for d in source.detections]
    return on_source, violation_outlines(boxes, detections_record(followup), scale)


def _fit_height(frame: np.ndarray, height: int) -> np.ndarray:
    if frame.shape[0] == height:
        return frame
    width = max(1, round(frame.shape[1] * height / frame.shape[0]))
    return cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA)


def violation_image(
    source: np.ndarray,
    followup: np.ndarray,
    label: str,
    source_values: Mapping[str, float],
    followup_values: Mapping[str, float],
    *,
    kind: str = 'confidence',
    f_trans: float | None = None,
    f_pred: float | None = None,
    height: int = 360,
    source_outlines: Sequence[Outline] = (),
    followup_outlines: Sequence[Outline] = (),
) -> np.ndarray:
    """Draw the source and follow-up frames side by side with the composition and the per-class change.

    Args:
        source: The source frame, RGB uint8.
        followup: The follow-up frame, RGB uint8 (any size; scaled to the same height).
        label: The composition label, e.g. '{2,3}'.
        source_values: The source prediction, class -> count or confidence.
        followup_values: The follow-up prediction, class -> count or confidence.
        kind: 'count' or 'confidence' (how values are printed).
        f_trans: The transformation distance, printed in the title when given.
        f_pred: The prediction change, printed in the title when given.
        height: The height of each panel in pixels (frames are shrunk or enlarged to it).
        source_outlines: Boxes drawn on the source (`detection_outlines`), in its pixels.
        followup_outlines: Boxes drawn on the follow-up, in its pixels: expected and found, lost
            and new marked (viewer/boxes.py's colours, named in a legend line).

    Returns:
        The labelled image, RGB uint8: a title bar, the two panels, one line per class below.
    """
    height = max(32, int(height))
    left = _fit_height(source, height).copy()
    right = _fit_height(followup, height).copy()
    gap = np.full((height, 4, 3), _BACKGROUND, np.uint8)
    panels = np.concatenate([left, gap, right], axis=1)
    width = panels.shape[1]

    scale = max(0.35, min(1.0, width / 1400))
    line_h = int(30 * scale) + 6
    thickness = 1 if scale < 0.6 else 2
    title = f'composition {label}'
    if f_trans is not None:
        title += f'  f_trans {f_trans:.3f}'
    if f_pred is not None:
        title += f'  f_pred {f_pred:.3f}'
    classes = list(source_values)
    boxed = bool(source_outlines or followup_outlines)
    footer_lines = max(1, len(classes)) + boxed
    draw_outlines(left, source_outlines, height / source.shape[0], scale)
    draw_outlines(right, followup_outlines, height / followup.shape[0], scale)
    panels = np.concatenate([left, gap, right], axis=1)

    canvas = np.full((line_h + height + line_h * footer_lines + 4, width, 3), _BACKGROUND, np.uint8)
    canvas[line_h : line_h + height] = panels
    baseline = int(line_h * 0.72)
    cv2.putText(canvas, title, (6, baseline), _FONT, scale, _TEXT, thickness, cv2.LINE_AA)
    # Panel captions sit on the frames themselves, on a dark strip so they read on any footage.
    for x0, caption in ((0, 'source'), (left.shape[1] + gap.shape[1], 'follow-up')):
        (tw, th), _ = cv2.getTextSize(caption, _FONT, scale, thickness)
        cv2.rectangle(canvas, (x0, line_h), (x0 + tw + 10, line_h + th + 10), _BACKGROUND, -1)
        cv2.putText(canvas, caption, (x0 + 5, line_h + th + 5), _FONT, scale, _TEXT, thickness, cv2.LINE_AA)
    for row, cls in enumerate(classes):
        src = float(source_values[cls])
        fol = float(followup_values.get(cls, float('nan')))
        text = format_change(cls, src, fol, kind)
        colour = _CHANGED if abs(fol - src) > 0 else _TEXT
        y = line_h + height + line_h * row + baseline
        cv2.putText(canvas, text, (6, y), _FONT, scale, colour, thickness, cv2.LINE_AA)
    if boxed:
        x, y = 6, line_h + height + line_h * len(classes) + baseline
        for role, rgba in ROLE_RGBA.items():
            colour = tuple(int(round(255 * c)) for c in rgba[:3])
            cv2.putText(canvas, role, (x, y), _FONT, scale, colour, thickness, cv2.LINE_AA)
            x += cv2.getTextSize(role + '  ', _FONT, scale, thickness)[0][0]
    return canvas


def _wrap(text: str, width: int, scale: float, thickness: int) -> list[str]:
    """`text` in lines no wider than `width` pixels, broken between words (a long word stays whole)."""
    lines: list[str] = []
    for word in text.split(' '):
        candidate = f'{lines[-1]} {word}' if lines else word
        if lines and cv2.getTextSize(candidate, _FONT, scale, thickness)[0][0] <= width:
            lines[-1] = candidate
        else:
            lines.append(word)
    return lines


def followup_overlay(followup: np.ndarray, record: dict, *, height: int = 360) -> np.ndarray:
    """The follow-up frame with the overlay Foxglove draws on it (`overlay_lines`), drawn into its pixels.

    Args:
        followup: The follow-up frame, RGB uint8 (scaled to `height`).
        record: The violation's evaluation record (docs/results.md).
        height: The height of the picture in pixels.

    Returns:
        RGB uint8: the frame with, at its top left, one line each for the evaluation, the composition
        and its parameters, f_trans and f_pred, and the classes that changed, white on red, wrapped
        to the frame's width.
    """
    canvas = _fit_height(followup, max(32, int(height))).copy()
    width = canvas.shape[1]
    scale = max(0.3, min(0.7, width / 1000))
    thickness = 1
    (_, text_h), descent = cv2.getTextSize('Ag', _FONT, scale, thickness)
    step = text_h + descent + 6
    lines = [wrapped for line in overlay_lines(record) for wrapped in _wrap(line, width - 10, scale, 1)]
    y = 2
    for line in lines:
        if y + step > canvas.shape[0]:
            break  # a frame too small for every line keeps those that fit
        text_w = min(width - 2, cv2.getTextSize(line, _FONT, scale, thickness)[0][0] + 8)
        box = canvas[y : y + step - 2, 2 : 2 + text_w].astype(np.float32)
        canvas[y : y + step - 2, 2 : 2 + text_w] = (
            box * (1 - _OVERLAY_ALPHA) + _OVERLAY * _OVERLAY_ALPHA
        ).astype(np.uint8)
        baseline = y + text_h + 2
        cv2.putText(canvas, line, (6, baseline), _FONT, scale, _TEXT, thickness, cv2.LINE_AA)
        y += step
    return canvas
