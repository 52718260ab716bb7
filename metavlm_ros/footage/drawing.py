"""How each kind of object is drawn: a Pen of cv2 primitives in metres around an anchor, one function each."""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

__all__ = [
    'Pen',
    'draw_anchor',
    'draw_bag',
    'draw_bottle',
    'draw_box',
    'draw_can',
    'draw_crab',
    'draw_fish',
    'draw_jellyfish',
    'draw_kelp',
    'draw_net',
    'draw_pipe',
    'draw_rope',
    'draw_rov',
    'draw_seagrass',
    'draw_seaweed',
    'draw_starfish',
    'draw_tyre',
]


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


def _wave(n: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, n)


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


def draw_crab(pen: Pen, p: dict, t: float) -> None:
    W = p['size']
    c = p['colour']
    dark = np.multiply(c, 0.6)
    for side in (-1, 1):
        for k in range(4):
            x0 = side * W * (0.25 + 0.05 * k)
            sway = 0.03 * W * math.sin(t * 4 + k + p['phase'])
            pen.line(
                [
                    (x0 * 0.8, -0.02 * W + 0.05 * W * k),
                    (side * W * 0.6, 0.02 * W * k + sway),
                    (side * W * 0.75, 0.25 * W),
                ],
                dark,
                0.05 * W,
            )
        pen.line([(side * 0.3 * W, -0.15 * W), (side * 0.45 * W, -0.35 * W)], dark, 0.07 * W)
        pen.ellipse((side * 0.45 * W, -0.42 * W), (0.14 * W, 0.09 * W), side * 30, c)
    pen.ellipse((0, 0), (0.4 * W, 0.25 * W), 0, c)
    pen.ellipse((0, -0.07 * W), (0.3 * W, 0.12 * W), 0, np.minimum(np.multiply(c, 1.2), 255))
    for side in (-1, 1):
        pen.circle((side * 0.1 * W, -0.26 * W), 0.035 * W, (15, 15, 15))


def draw_starfish(pen: Pen, p: dict, t: float) -> None:
    R = p['size'] / 2
    a = np.linspace(0, 2 * math.pi, 90, endpoint=False) + p['phase']
    r = R * (0.32 + 0.68 * np.abs(np.cos(a * 2.5)) ** 2.2)
    pen.poly(np.stack([r * np.cos(a), r * np.sin(a)], 1), p['colour'])
    for k in range(5):
        ang = p['phase'] + k * 2 * math.pi / 5
        pen.line(
            [(0, 0), (0.75 * R * math.cos(ang), 0.75 * R * math.sin(ang))],
            np.multiply(p['colour'], 0.7),
            0.05 * R,
        )
    pen.circle((0, 0), 0.12 * R, np.multiply(p['colour'], 0.75))


def draw_jellyfish(pen: Pen, p: dict, t: float) -> None:
    D = p['size']
    pulse = 1 + 0.1 * math.sin(t * 2.5 + p['phase'])
    w, h = D / 2 * pulse, D * 0.38 / pulse
    c = p['colour']
    for k in range(7):
        x0 = (k / 6 - 0.5) * 1.5 * w
        ys = _wave(12) * D * 1.1
        xs = x0 + 0.05 * D * np.sin(ys / D * 7 + t * 2 + k)
        pen.line(np.stack([xs, ys], 1), c, 0.012 * D, 0.55)
    for k in range(3):
        ys = _wave(10) * D * 0.6
        xs = (k - 1) * 0.12 * D + 0.04 * D * np.sin(ys / D * 9 + t * 3 + k)
        pen.line(np.stack([xs, ys], 1), np.multiply(c, 0.9), 0.05 * D, 0.6)
    a = np.linspace(math.pi, 2 * math.pi, 30)
    bell = np.stack([w * np.cos(a), h * np.sin(a)], 1)
    bell = np.vstack([bell, [(w * 0.8, 0.08 * D), (-w * 0.8, 0.08 * D)]])
    pen.poly(bell, c, 0.72)
    pen.ellipse((0, -0.45 * h), (0.45 * w, 0.3 * h), 0, np.minimum(np.multiply(c, 1.25), 255), 0.6)


def _strand(base_x: float, height: float, t: float, p: dict, k: int, n: int = 14) -> np.ndarray:
    ys = -_wave(n) * height
    bend = (ys / height) ** 2 * height * 0.25
    sway = np.sin(t * p['sway_speed'] + p['phase'] + k * 1.7 + ys / height * 2.0) * 0.5 + p['lean'] * 0.5
    return np.stack([base_x + bend * sway * 2, ys], 1)


def draw_seaweed(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    c = p['colour']
    for k in range(p['strands']):
        x0 = (k / max(p['strands'] - 1, 1) - 0.5) * 0.35 * H
        h = H * (0.6 + 0.4 * ((k * 37) % 10) / 10)
        pts = _strand(x0, h, t, p, k)
        pen.line(pts, np.multiply(c, 0.8 + 0.05 * (k % 3)), 0.03 * H)
        for j in range(3, len(pts) - 1, 2):
            side = 1 if (j + k) % 2 else -1
            x, y = pts[j]
            pen.ellipse((x + side * 0.05 * H, y), (0.07 * H, 0.025 * H), side * 35, c)


def draw_seagrass(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    for k in range(p['strands']):
        x0 = ((k * 0.618) % 1 - 0.5) * 0.5 * H
        h = H * (0.55 + 0.45 * ((k * 53) % 11) / 11)
        pts = _strand(x0, h, t, p, k, 8)
        pen.line(pts, np.multiply(p['colour'], 0.75 + 0.08 * (k % 4)), 0.014 * H + 0.004)


def draw_kelp(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    c = p['colour']
    for k in range(p['strands']):
        x0 = (k - (p['strands'] - 1) / 2) * 0.08 * H
        pts = _strand(x0, H * (0.75 + 0.25 * (k % 2)), t, p, k, 18)
        pen.line(pts, np.multiply(c, 0.7), 0.012 * H)
        for j in range(4, len(pts) - 1, 2):
            side = 1 if (j + k) % 2 else -1
            x, y = pts[j]
            ang = side * (55 + 15 * math.sin(t + j))
            pen.ellipse((x + side * 0.06 * H, y - 0.02 * H), (0.1 * H, 0.028 * H), ang, c, 0.95)


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


def draw_can(pen: Pen, p: dict, t: float) -> None:
    L = p['size']
    r = L * 0.33
    c = p['colour']
    dent = p['dent'] * r
    pen.poly([(-L / 2, -r), (0, -r + dent), (L / 2, -r), (L / 2, r), (0, r - dent * 0.5), (-L / 2, r)], c)
    pen.ellipse((L / 2, 0), (r * 0.3, r), 0, (180, 180, 175))
    pen.line([(-L * 0.4, -r * 0.55), (L * 0.4, -r * 0.55)], np.minimum(np.add(c, 80), 255), r * 0.22)
    pen.line([(-L * 0.15, -r * 0.9), (-L * 0.15, r * 0.9)], p['stripe'], r * 0.35)


def draw_bag(pen: Pen, p: dict, t: float) -> None:
    R = p['size'] / 2
    a = np.linspace(0, 2 * math.pi, len(p['radii']), endpoint=False)
    flutter = 1 + 0.05 * np.sin(a * 3 + t * 1.5 + p['phase'])
    r = R * np.asarray(p['radii']) * flutter
    pts = np.stack([r * np.cos(a), r * np.sin(a) * 0.75], 1)
    pen.poly(pts, p['colour'], p['opacity'])
    for k in range(4):
        i = (k * 5) % len(pts)
        pen.line(
            [pts[i] * 0.9, pts[(i + len(pts) // 2) % len(pts)] * 0.3],
            np.multiply(p['colour'], 0.8),
            0.02 * R,
            0.8,
        )
    pen.line([pts[2] * 0.8, pts[2] * 1.2, pts[4] * 1.15], p['colour'], 0.05 * R, p['opacity'])


def draw_tyre(pen: Pen, p: dict, t: float) -> None:
    R = p['size'] / 2
    pen.ellipse((0, 0), (R, R), 0, (32, 32, 34))
    pen.ellipse((0, 0), (R * 0.93, R * 0.93), 0, (22, 22, 24), thickness_m=0.06 * R)
    for k in range(24):
        a = k * 2 * math.pi / 24
        pen.line(
            [(0.8 * R * math.cos(a), 0.8 * R * math.sin(a)), (R * math.cos(a), R * math.sin(a))],
            (52, 52, 54),
            0.05 * R,
        )
    pen.ellipse((0, 0), (R * 0.55, R * 0.55), 0, (45, 45, 47))
    pen.ellipse((0, 0), (R * 0.42, R * 0.42), 0, (14, 14, 15))


def draw_net(pen: Pen, p: dict, t: float) -> None:
    W = p['size']
    c = p['colour']
    outline = np.asarray(p['outline']) * W / 2
    pen.poly(outline, c, 0.25)
    n = 9
    for k in range(n + 1):
        f = k / n - 0.5
        wob = 0.03 * W * np.sin(_wave(10) * 6 + k)
        xs = np.linspace(-0.5, 0.5, 10) * W
        pen.line(np.stack([xs * 0.9, f * W * 0.7 + wob], 1), c, 0.012 * W, 0.9)
        pen.line(np.stack([f * W * 0.9 + wob, xs * 0.7], 1), c, 0.012 * W, 0.9)
    for fx, fy in p['floats']:
        pen.circle((fx * W * 0.4, fy * W * 0.3), 0.05 * W, p['float_colour'])


def draw_pipe(pen: Pen, p: dict, t: float) -> None:
    L, r = p['size'], p['size'] * p['aspect']
    c = p['colour']
    pen.poly([(-L / 2, -r), (L / 2, -r), (L / 2, r), (-L / 2, r)], np.multiply(c, 0.75))
    pen.poly([(-L / 2, -r), (L / 2, -r), (L / 2, -r * 0.2), (-L / 2, -r * 0.2)], c)
    pen.line([(-L / 2, -r * 0.65), (L / 2, -r * 0.65)], np.minimum(np.multiply(c, 1.3), 255), r * 0.25)
    for x in (-L / 2, L / 2):
        pen.poly(
            [
                (x - r * 0.25, -r * 1.25),
                (x + r * 0.25, -r * 1.25),
                (x + r * 0.25, r * 1.25),
                (x - r * 0.25, r * 1.25),
            ],
            np.multiply(c, 0.6),
        )
    pen.ellipse((L / 2 + r * 0.25, 0), (r * 0.35, r * 1.2), 0, np.multiply(c, 0.5))
    pen.ellipse((L / 2 + r * 0.27, 0), (r * 0.22, r * 0.8), 0, (20, 20, 20))
    for x0, w in p['rust']:
        pen.ellipse((x0 * L / 2, 0.2 * r), (w * L, r * 0.6), 0, (110, 70, 40), 0.8)


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


def draw_rov(pen: Pen, p: dict, t: float) -> None:
    W = p['size']
    H = W * 0.6
    frame = (60, 60, 62)
    pen.poly([(-W / 2, -H), (W / 2, -H), (W / 2, -H * 0.62), (-W / 2, -H * 0.62)], p['colour'])
    pen.line(
        [(-W * 0.45, -H * 0.85), (W * 0.45, -H * 0.85)],
        np.minimum(np.multiply(p['colour'], 1.2), 255),
        W * 0.03,
    )
    for x in (-W * 0.45, W * 0.45):
        pen.line([(x, -H * 0.62), (x, 0)], frame, W * 0.05)
    pen.line([(-W * 0.48, -H * 0.05), (W * 0.48, -H * 0.05)], frame, W * 0.05)
    pen.line([(-W * 0.48, -H * 0.35), (W * 0.48, -H * 0.35)], frame, W * 0.04)
    for x in (-W * 0.22, W * 0.22):
        pen.circle((x, -H * 0.3), W * 0.13, (30, 30, 32))
        pen.circle((x, -H * 0.3), W * 0.09, (75, 75, 80))
        pen.circle((x, -H * 0.3), W * 0.03, (20, 20, 20))
    pen.circle((0, -H * 0.2), W * 0.06, (200, 200, 190))


def draw_rope(pen: Pen, p: dict, t: float) -> None:
    L = p['size']
    pts = np.asarray(p['path']) * L
    pen.line(pts, np.multiply(p['colour'], 0.7), 0.035 * L)
    pen.line(pts, p['colour'], 0.024 * L)
    for k in range(1, len(pts) - 1, 2):
        (x0, y0), (x1, y1) = pts[k], pts[k + 1]
        pen.line(
            [(x0, y0 - 0.01 * L), ((x0 + x1) / 2, (y0 + y1) / 2 + 0.01 * L)],
            np.multiply(p['colour'], 0.55),
            0.008 * L,
        )


def draw_anchor(pen: Pen, p: dict, t: float) -> None:
    L = p['size']
    c = p['colour']
    pen.line([(0, -L * 0.45), (0, L * 0.4)], c, 0.07 * L)
    pen.line([(-0.18 * L, -L * 0.32), (0.18 * L, -L * 0.32)], c, 0.06 * L)
    pen.ellipse((0, -L * 0.52), (0.08 * L, 0.08 * L), 0, c, thickness_m=0.03 * L)
    a = np.linspace(0.15 * math.pi, 0.85 * math.pi, 16)
    arc = np.stack([0.35 * L * np.cos(a), 0.12 * L + 0.3 * L * np.sin(a)], 1)
    pen.line(arc, c, 0.07 * L)
    for end, side in ((arc[0], 1), (arc[-1], -1)):
        x, y = end
        pen.poly([(x, y), (x + side * 0.08 * L, y - 0.16 * L), (x - side * 0.06 * L, y - 0.02 * L)], c)
    pen.line([(0, L * 0.05), (0.1 * L, L * 0.3)], np.multiply(c, 0.6), 0.02 * L, 0.7)
