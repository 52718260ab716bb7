"""The Pen (cv2 primitives in metres around an anchor) and the kinds insertion pastes (docs/method.md §13).

Object insertion (method/insertion.py) pastes one kind per class (a fish, seaweed, a crate, a bottle),
drawn as the project's scenes draw them; footage/drawing.py draws the other kinds with the same Pen
and imports these from here, so method/ never imports footage/ and each kind is drawn by one function.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

__all__ = ['Pen', 'draw_bottle', 'draw_box', 'draw_fish', 'draw_seaweed', 'strand', 'wave']


class Pen:
    """Draws cv2 primitives given in metres (y down) into a sprite colour canvas and its alpha mask."""

    def __init__(
        self, width: int, height: int, ox: float, oy: float, scale: float, angle: float, squash: float
    ):
        self.rgb = np.zeros((height, width, 3), np.uint8)
        self.alpha = np.zeros((height, width), np.uint8)
        self.ox, self.oy, self.s = ox, oy, scale
        self.cos, self.sin = math.cos(angle), math.sin(angle)
        self.squash = squash
        self.flip = False

    def _pts(self, pts: np.ndarray) -> np.ndarray:
        pts = np.asarray(pts, np.float64).reshape(-1, 2)
        if self.flip:
            pts = pts * (-1.0, 1.0)
        x = pts[:, 0] * self.cos - pts[:, 1] * self.sin
        y = (pts[:, 0] * self.sin + pts[:, 1] * self.cos) * self.squash
        # Four fractional bits (shift=4): sub-pixel precision keeps slow motion smooth.
        return (
            np.stack([(self.ox + x * self.s) * 16, (self.oy + y * self.s) * 16], 1).round().astype(np.int32)
        )

    def poly(self, pts: Any, colour: Any, alpha: float = 1.0) -> None:
        p = self._pts(pts)
        cv2.fillPoly(self.rgb, [p], _col(colour, alpha), cv2.LINE_AA, 4)
        cv2.fillPoly(self.alpha, [p], int(255 * alpha), cv2.LINE_AA, 4)

    def line(self, pts: Any, colour: Any, width_m: float, alpha: float = 1.0) -> None:
        p = self._pts(pts)
        t = max(1, int(round(width_m * self.s)))
        cv2.polylines(self.rgb, [p], False, _col(colour, alpha), t, cv2.LINE_AA, 4)
        cv2.polylines(self.alpha, [p], False, int(255 * alpha), t, cv2.LINE_AA, 4)

    def ellipse(
        self,
        centre: Any,
        axes: Any,
        angle_deg: float,
        colour: Any,
        alpha: float = 1.0,
        thickness_m: float = 0,
    ) -> None:
        # Ellipses become polygons so that rotation and squash of the whole sprite apply exactly.
        a = np.linspace(0, 2 * math.pi, 36, endpoint=False)
        r = math.radians(angle_deg)
        ex, ey = axes[0] * np.cos(a), axes[1] * np.sin(a)
        pts = np.stack(
            [
                centre[0] + ex * math.cos(r) - ey * math.sin(r),
                centre[1] + ex * math.sin(r) + ey * math.cos(r),
            ],
            1,
        )
        if thickness_m > 0:
            self.line(np.vstack([pts, pts[:1]]), colour, thickness_m, alpha)
        else:
            self.poly(pts, colour, alpha)

    def circle(self, centre: Any, radius: float, colour: Any, alpha: float = 1.0) -> None:
        self.ellipse(centre, (radius, radius), 0, colour, alpha)


def _col(colour: Any, alpha: float) -> tuple[float, float, float]:
    # Colour canvases are premultiplied by alpha so antialiased edges composite without fringes.
    return tuple(float(c) * alpha for c in colour)


def wave(n: int) -> np.ndarray:
    """n points evenly from 0 to 1: where along a strand, a tentacle or a mesh line a point lies."""
    return np.linspace(0.0, 1.0, n)


def strand(base_x: float, height: float, t: float, p: dict, k: int, n: int = 14) -> np.ndarray:
    """The n points of a plant's k-th strand, `height` metres tall from `base_x`, swaying at time t."""
    ys = -wave(n) * height
    bend = (ys / height) ** 2 * height * 0.25
    sway = np.sin(t * p['sway_speed'] + p['phase'] + k * 1.7 + ys / height * 2.0) * 0.5 + p['lean'] * 0.5
    return np.stack([base_x + bend * sway * 2, ys], 1)


def draw_bottle(pen: Pen, p: dict, t: float) -> None:
    L = p['size']
    r = L * 0.17
    c, a = p['colour'], p['opacity']
    body = [
        (-L / 2, -r),
        (L * 0.18, -r),
        (L * 0.3, -r * 0.45),
        (L / 2, -r * 0.4),
        (L / 2, r * 0.4),
        (L * 0.3, r * 0.45),
    ]
    body += [(L * 0.18, r), (-L / 2, r)]
    pen.poly(body, c, a)
    pen.ellipse((-L / 2, 0), (r * 0.35, r), 0, np.multiply(c, 0.8), a)
    pen.line([(-L * 0.4, -r * 0.5), (L * 0.15, -r * 0.5)], np.minimum(np.add(c, 90), 255), r * 0.25, a)
    if p['label']:
        pen.poly([(-L * 0.3, -r), (-L * 0.02, -r), (-L * 0.02, r), (-L * 0.3, r)], p['label_colour'])
    pen.poly([(L * 0.46, -r * 0.5), (L * 0.54, -r * 0.5), (L * 0.54, r * 0.5), (L * 0.46, r * 0.5)], p['cap'])


def draw_box(pen: Pen, p: dict, t: float) -> None:
    W = p['size']
    H = W * p['aspect']
    d = W * 0.28
    c = p['colour']
    pen.poly(
        [(-W / 2, -H), (-W / 2 + d, -H - d * 0.6), (W / 2 + d, -H - d * 0.6), (W / 2, -H)],
        np.minimum(np.multiply(c, 1.25), 255),
    )
    pen.poly(
        [(W / 2, 0), (W / 2, -H), (W / 2 + d, -H - d * 0.6), (W / 2 + d, -d * 0.6)], np.multiply(c, 0.65)
    )
    pen.poly([(-W / 2, 0), (-W / 2, -H), (W / 2, -H), (W / 2, 0)], c)
    for k in range(1, p['planks']):
        y = -H * k / p['planks']
        pen.line([(-W / 2, y), (W / 2, y)], np.multiply(c, 0.6), 0.012 * W)
    pen.line([(-W / 2, 0), (W / 2, -H)], np.multiply(c, 0.7), 0.03 * W)


def draw_fish(pen: Pen, p: dict, t: float) -> None:
    L = p['size']
    h = L * p['aspect']
    wag = 0.12 * L * math.sin(p['phase'] + t * p['beat'])
    body = p['colour']
    pen.poly(
        [(-0.42 * L, 0), (-0.68 * L, -0.2 * L + wag), (-0.6 * L, wag * 0.8), (-0.68 * L, 0.2 * L + wag)], body
    )
    pen.poly([(-0.05 * L, -h * 0.9), (0.12 * L, -h * 1.25), (0.2 * L, -h * 0.8)], np.multiply(body, 0.8))
    pen.ellipse((0, 0), (L / 2, h), 0, body)
    pen.ellipse((0.02 * L, h * 0.35), (L * 0.4, h * 0.5), 0, np.minimum(np.multiply(body, 1.35), 255))
    for k in range(p['stripes']):
        x = -0.2 * L + k * 0.14 * L
        pen.line([(x, -h * 0.8), (x + 0.03 * L, h * 0.5)], np.multiply(body, 0.55), 0.04 * L)
    pen.poly([(0.05 * L, h * 0.3), (-0.05 * L, h * 0.9), (0.1 * L, h * 0.6)], np.multiply(body, 0.9))
    pen.circle((0.33 * L, -0.05 * L), 0.05 * L, (235, 235, 220))
    pen.circle((0.34 * L, -0.05 * L), 0.028 * L, (10, 10, 10))


def draw_seaweed(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    c = p['colour']
    for k in range(p['strands']):
        x0 = (k / max(p['strands'] - 1, 1) - 0.5) * 0.35 * H
        h = H * (0.6 + 0.4 * ((k * 37) % 10) / 10)
        pts = strand(x0, h, t, p, k)
        pen.line(pts, np.multiply(c, 0.8 + 0.05 * (k % 3)), 0.03 * H)
        for j in range(3, len(pts) - 1, 2):
            side = 1 if (j + k) % 2 else -1
            x, y = pts[j]
            pen.ellipse((x + side * 0.05 * H, y), (0.07 * H, 0.025 * H), side * 35, c)
