"""Object insertion (docs/method.md §13): an object of a class pasted into the frame, lit like the water.

The relation changes what a model should answer, so it is opt-in and named on its own (`--relations
paper insertion`), never part of the group `all`. Its value is the share of the frame the pasted
object's box covers (nominal 0: nothing pasted, the identity), its extras the class and where the box
lies. The pasted object and its box are a function of those values and the frame's size alone, so the
oracle (method/insertion_oracle.py) and `metavlm render` know them without the pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.extra import Extra
from metavlm_ros.method.pen import Pen, draw_bottle, draw_box, draw_fish, draw_seaweed
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.method.underwater import linear_light, srgb_bytes

__all__ = [
    'INSERTION_EXTRAS',
    'INSERTION_FUNCTIONS',
    'INSERTION_PARAMETERS',
    'INSERTION_TRANSMISSION',
    'MIN_EXPECTED_AREA',
    'MID_GREY',
    'PASTED_KINDS',
    'InsertedObject',
    'PastedKind',
    'class_index',
    'insert_object',
    'pasted_object',
]

# A pasted object is expected (a count model counts it, a detector under the strict option finds it)
# when its box covers at least this share of the frame: 1.5 times COCO's boundary between small and
# medium objects (32 x 32 pixels of a 640 x 480 image, 0.0033). A smaller one is "either": seen or
# not, it counts for nothing, as an object left mostly outside the frame (method/boxes.py).
MIN_EXPECTED_AREA = 0.005
# How the pasted object is lit and hazed (assumed constants, docs/method.md §13): the light on it is
# the local background's as if that were a mid-grey surface (a light meter's 18 % grey), and the water
# between it and the camera lets this share of its light through (turbidity's 0.3 /m over 0.75 m),
# the rest the local background's colour.
MID_GREY = 0.18
INSERTION_TRANSMISSION = 0.8
# Feathering: the edges are blurred by this many pixels plus this share of the object's size (its
# box's geometric mean side), as the scenes blur a sprite by forward scattering.
FEATHER_PIXELS = 0.6
FEATHER_SHARE = 0.01
# Pixels per metre the kinds are measured at (their boxes at size 1 m), once per kind.
_REFERENCE_SCALE = 200.0


def class_index(value: Any) -> float:
    """A pasted class given by name ('trash') or index (3) as the extra's value.

    Raises:
        ParameterError: a name that is not one of CLASSES.
    """
    if isinstance(value, str):
        name = value.strip().lower()
        if name not in CLASSES:
            raise ParameterError(f'unknown pasted class {value!r}; known classes: {", ".join(CLASSES)}')
        return float(CLASSES.index(name))
    return float(value)


def _class_name(value: float) -> str:
    return CLASSES[int(round(value))]


# The relation: (name, unit, nominal, low, high, max_deviation) as in UNDERWATER_PARAMETERS. At the
# range's end the pasted box covers a tenth of the frame (175 x 175 pixels of 640 x 480).
INSERTION_PARAMETERS: dict[str, tuple[str, str, float, float, float, float]] = {
    'insertion': ('area', "share of the frame the pasted object's box covers", 0.0, 0.0, 0.1, 0.1),
}
# Its extras: the pasted class (each whole index one of CLASSES; a gene between two is the nearest)
# and where its box lies: 0 puts it at the frame's left (top) edge, 1 at its right (bottom) edge; the
# box never leaves the frame.
INSERTION_EXTRAS: dict[str, tuple[Extra, ...]] = {
    'insertion': (
        Extra('class', 'the pasted class: ' + ', '.join(f'{i} {c}' for i, c in enumerate(CLASSES)), 3.0,
              0.0, float(len(CLASSES) - 1), parse=class_index, label=_class_name, step=1.0, discrete=True),
        Extra('x', "where the box lies across the frame: 0 at its left edge, 1 at its right", 0.5, 0.0, 1.0),
        Extra('y', 'where the box lies down the frame: 0 at its top edge, 1 at its bottom', 0.5, 0.0, 1.0),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class PastedKind:
    """The kind of object pasted for a class: a kind of the scenes (footage/sprites.py), drawn by its
    method/pen.py function with one fixed look (the parameters of its draw function at size 1 m)."""

    kind: str
    draw: Callable[[Pen, dict, float], None]
    look: tuple[tuple[str, Any], ...]


#: The kind pasted for each class: the scenes' most typical of it, one look each.
PASTED_KINDS: dict[str, PastedKind] = {
    'animal': PastedKind('fish', draw_fish, (
        ('colour', (220, 170, 60)), ('aspect', 0.2), ('beat', 7.0), ('stripes', 2))),
    'vegetation': PastedKind('seaweed', draw_seaweed, (
        ('colour', (95, 110, 45)), ('strands', 5), ('sway_speed', 1.0), ('lean', 0.2))),
    'object': PastedKind('box', draw_box, (('colour', (150, 110, 65)), ('aspect', 0.7), ('planks', 4))),
    'trash': PastedKind('bottle', draw_bottle, (
        ('colour', (60, 120, 60)), ('opacity', 0.8), ('label', True), ('label_colour', (220, 220, 210)),
        ('cap', (200, 40, 40)))),
}  # fmt: skip


def _draw(cls: str, width: int, height: int, ox: float, oy: float, scale: float) -> Pen:
    pasted = PASTED_KINDS[cls]
    pen = Pen(width, height, ox, oy, scale, 0.0, 1.0)
    pasted.draw(pen, {'size': 1.0, 'phase': 0.0, **dict(pasted.look)}, 0.0)
    return pen


@cache
def _extent(cls: str) -> tuple[float, float, float, float]:
    """The box (x1, y1, x2, y2) in metres around the anchor of the class's kind drawn at size 1 m."""
    side = int(4 * _REFERENCE_SCALE)
    pen = _draw(cls, side, side, side / 2, side / 2, _REFERENCE_SCALE)
    ys, xs = np.nonzero(pen.alpha >= 128)
    box = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    return tuple(float((v - side / 2) / _REFERENCE_SCALE) for v in box)


@dataclass(frozen=True, eq=False)
class InsertedObject:
    """A pasted object in a frame of `size` (width, height): its class and kind, its box (x1, y1, x2, y2)
    in the frame's pixels (of its pixels whose alpha is 0.5 or more; None when none is), and its canvas:
    feathered alpha and colour (sRGB, 0-255), read-only, whose top-left pixel lies at `origin`."""

    cls: str
    kind: str
    box: tuple[int, int, int, int] | None
    size: tuple[int, int]
    origin: tuple[int, int]
    alpha: np.ndarray
    colour: np.ndarray

    @property
    def area(self) -> float:
        """The share of the frame its box covers (0 when no pixel of it is solid)."""
        if self.box is None:
            return 0.0
        x1, y1, x2, y2 = self.box
        return (x2 - x1) * (y2 - y1) / (self.size[0] * self.size[1])

    @property
    def expected(self) -> bool:
        """Whether it is large enough to be expected (MIN_EXPECTED_AREA): counted, or found when asked."""
        return self.area >= MIN_EXPECTED_AREA

    def _window(self, x1: int, y1: int, x2: int, y2: int) -> tuple[slice, slice, slice, slice] | None:
        """Slices of the frame and of the canvas where the frame's region (x1, y1)-(x2, y2) meets it."""
        ox, oy = self.origin
        h, w = self.alpha.shape
        fx1, fy1 = max(x1, ox, 0), max(y1, oy, 0)
        fx2, fy2 = min(x2, ox + w, self.size[0]), min(y2, oy + h, self.size[1])
        if fx2 <= fx1 or fy2 <= fy1:
            return None
        return slice(fy1, fy2), slice(fx1, fx2), slice(fy1 - oy, fy2 - oy), slice(fx1 - ox, fx2 - ox)

    def uncovered(self, box: tuple[float, float, float, float]) -> tuple[float, tuple[int, ...] | None]:
        """What of a box (frame pixels, rounded to whole pixels) the pasted object leaves in view: the
        share of its pixels not under the object's solid pixels, and the box of those (None: none)."""
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        x1, y1 = max(x1, 0), max(y1, 0)
        x2, y2 = min(x2, self.size[0]), min(y2, self.size[1])
        if x2 <= x1 or y2 <= y1:
            return 0.0, None
        seen = np.ones((y2 - y1, x2 - x1), bool)
        window = self._window(x1, y1, x2, y2)
        if window is not None:
            rows, cols, crows, ccols = window
            seen[rows.start - y1 : rows.stop - y1, cols.start - x1 : cols.stop - x1] = (
                self.alpha[crows, ccols] < 0.5
            )
        ys, xs = np.nonzero(seen)
        if xs.size == 0:
            return 0.0, None
        share = xs.size / seen.size
        return share, (x1 + int(xs.min()), y1 + int(ys.min()), x1 + int(xs.max()) + 1, y1 + int(ys.max()) + 1)

    def pasted_into(self, frame: np.ndarray) -> np.ndarray:
        """A copy of a checked frame of the object's size with the object pasted, in linear light:

            I = (1 - a) F + a (t J E + (1 - t) B),   E = B / MID_GREY

        F the frame, a the feathered alpha, J the object's colour, B the mean of the frame around the
        object (its box grown by half its size on each side), t = INSERTION_TRANSMISSION.
        """
        out = frame.copy()
        height, width = frame.shape[:2]
        window = self._window(0, 0, width, height)
        if window is None:
            return out
        rows, cols, crows, ccols = window
        alpha = self.alpha[crows, ccols]
        x1, y1, x2, y2 = self.box or (cols.start, rows.start, cols.stop, rows.stop)
        gx, gy = (x2 - x1 + 1) // 2, (y2 - y1 + 1) // 2
        around = frame[max(y1 - gy, 0) : min(y2 + gy, height), max(x1 - gx, 0) : min(x2 + gx, width)]
        background = linear_light(around).reshape(-1, 3).mean(axis=0)
        light = linear_light(self.colour[crows, ccols]) * (background / MID_GREY)
        light *= INSERTION_TRANSMISSION
        light += (1.0 - INSERTION_TRANSMISSION) * background
        scene = linear_light(frame[rows, cols])
        scene += alpha[..., None] * (light - scene)
        drawn = alpha > 0
        out[rows, cols][drawn] = srgb_bytes(scene)[drawn]
        return out


# Kept for a generation: a search renders a population's follow-ups (30 by default), then judges them.
@lru_cache(maxsize=32)
def pasted_object(area: float, cls: float, x: float, y: float, width: int, height: int) -> InsertedObject:
    """The object insertion pastes at `area` (share of the frame its box covers, > 0), class index
    `cls`, position (x, y) in [0, 1] into a frame of `width` x `height` pixels (kept: a search asks
    for it when it renders a follow-up and again when it judges it; read-only).

    The kind's box at size 1 m (b_w x b_h) is scaled by s = sqrt(area W H / (b_w b_h)) pixels per
    metre, at most what fits the frame, and placed with its top-left corner at (x (W - w), y (H - h)).
    """
    name = _class_name(cls)
    ex1, ey1, ex2, ey2 = _extent(name)
    scale = math.sqrt(area * width * height / ((ex2 - ex1) * (ey2 - ey1)))
    scale = min(scale, width / (ex2 - ex1), height / (ey2 - ey1))
    w, h = (ex2 - ex1) * scale, (ey2 - ey1) * scale
    left, top = x * (width - w), y * (height - h)
    sigma = FEATHER_PIXELS + FEATHER_SHARE * math.sqrt(w * h)
    pad = int(math.ceil(3 * sigma)) + 2
    ox, oy = math.floor(left) - pad, math.floor(top) - pad
    pen = _draw(
        name, int(math.ceil(w)) + 2 * pad + 2, int(math.ceil(h)) + 2 * pad + 2,
        left - ox - ex1 * scale, top - oy - ey1 * scale, scale,
    )  # fmt: skip
    # Blurred premultiplied, as the scenes feather a sprite; the colour is then divided out.
    alpha = cv2.GaussianBlur(pen.alpha.astype(np.float32) / 255.0, (0, 0), sigma)
    premultiplied = cv2.GaussianBlur(pen.rgb.astype(np.float32), (0, 0), sigma)
    colour = np.clip(premultiplied / np.maximum(alpha, 1.0 / 255.0)[..., None], 0, 255).astype(np.uint8)
    ys, xs = np.nonzero(alpha >= 0.5)
    box = None
    if xs.size:
        box = (
            max(ox + int(xs.min()), 0), max(oy + int(ys.min()), 0),
            min(ox + int(xs.max()) + 1, width), min(oy + int(ys.max()) + 1, height),
        )  # fmt: skip
    alpha.setflags(write=False)
    colour.setflags(write=False)
    return InsertedObject(name, PASTED_KINDS[name].kind, box, (width, height), (ox, oy), alpha, colour)


def _number(what: str, value: Any, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f'insertion {what} must be a number, got {value!r}') from None
    if not math.isfinite(number) or not low <= number <= high:
        raise ParameterError(f'insertion {what} {value!r} is outside [{low:g}, {high:g}]')
    return number


def insert_object(
    frame: np.ndarray, area: float, cls: Any = 3.0, x: float = 0.5, y: float = 0.5
) -> np.ndarray:
    """The frame with an object of a class pasted where (x, y) says, its box covering `area` of the
    frame (`pasted_object`), lit and hazed like the water around it (`InsertedObject.pasted_into`).
    Area 0 is the identity.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: for a value outside its range or an unknown class.
    """
    frame = check_frame(frame)
    _, _, _, low, high, _ = INSERTION_PARAMETERS['insertion']
    area = _number('area', area, low, high)
    index = _number('class', class_index(cls), 0.0, float(len(CLASSES) - 1))
    x, y = _number('x', x, 0.0, 1.0), _number('y', y, 0.0, 1.0)
    if area == 0.0:
        return frame.copy()
    height, width = frame.shape[:2]
    return pasted_object(area, float(round(index)), x, y, width, height).pasted_into(frame)


# The relation's function: what the relation registry applies.
INSERTION_FUNCTIONS = {'insertion': insert_object}
