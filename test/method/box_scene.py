"""The box oracle's test scene and its perfect detector: a frame of known objects and each object's true
box in any follow-up (its own mask moved by the composition's warp, as the frame's pixels are, less
what a pasted object hides)."""

from __future__ import annotations

import cv2
import numpy as np

from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.relations import RELATIONS, apply_composition

__all__ = ['HEIGHT', 'OBJECTS', 'WIDTH', 'draw_shape', 'geometry_of', 'scene_frame', 'true_boxes']

WIDTH, HEIGHT = 480, 320
#: Pure colours the doubles look for, one per object; classes as the paper's vocabulary.
OBJECTS = [
    ('trash', (255, 0, 0), 'ellipse', (70, 60, 40, 22, 30)),  # centre x, y, half axes, angle
    ('animal', (0, 255, 0), 'triangle', ((300, 80), (360, 150), (280, 170))),
    ('object', (0, 0, 255), 'ellipse', (240, 220, 60, 30, -15)),
    ('vegetation', (255, 255, 0), 'triangle', ((420, 250), (460, 300), (395, 300))),
    ('trash', (255, 0, 255), 'ellipse', (140, 250, 16, 12, 0)),  # a small one, near the centre-left
]


def draw_shape(frame: np.ndarray, shape: str, geometry, colour) -> None:
    """Draw one object of OBJECTS (its shape and geometry) into `frame` in `colour`."""
    if shape == 'ellipse':
        x, y, a, b, angle = geometry
        cv2.ellipse(frame, (x, y), (a, b), angle, 0, 360, colour, -1)
    else:
        cv2.fillPoly(frame, [np.array(geometry, np.int32)], colour)


def scene_frame() -> np.ndarray:
    """The source frame: OBJECTS over dark water."""
    frame = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    frame[:] = (20, 70, 90)  # water
    for _, colour, shape, geometry in OBJECTS:
        draw_shape(frame, shape, geometry, colour)
    return frame


def geometry_of(composition: Composition) -> Composition:
    """The composition's geometric relations alone: what moves the objects."""
    keep = [
        active and relation.geometric for relation, active in zip(RELATIONS, composition.active, strict=True)
    ]
    return Composition(tuple(keep), composition.values, composition.extras)


def true_boxes(composition: Composition, hidden: np.ndarray | None = None) -> list[Detection]:
    """Each object's true box in the follow-up: its own mask, moved by the composition's warp, less the
    pixels `hidden` (H x W booleans) marks; an object with no pixel left is not there."""
    found = []
    for cls, _, shape, geometry in OBJECTS:
        mask = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
        draw_shape(mask, shape, geometry, (255, 255, 255))
        moved = apply_composition(mask, geometry_of(composition))[:, :, 0] > 127
        if hidden is not None:
            moved &= ~hidden
        ys, xs = np.nonzero(moved)
        if xs.size:
            box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
            found.append(Detection(cls, 1.0, box))
    return found
