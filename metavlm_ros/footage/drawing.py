"""How each kind of object is drawn: a Pen of cv2 primitives in metres around an anchor, one function each
(the kinds object insertion pastes, and the Pen, from method/pen.py)."""

from __future__ import annotations

import math

import numpy as np

from metavlm_ros.method.pen import Pen, draw_bottle, draw_box, draw_fish, draw_seaweed, strand, wave

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
        ys = wave(12) * D * 1.1
        xs = x0 + 0.05 * D * np.sin(ys / D * 7 + t * 2 + k)
        pen.line(np.stack([xs, ys], 1), c, 0.012 * D, 0.55)
    for k in range(3):
        ys = wave(10) * D * 0.6
        xs = (k - 1) * 0.12 * D + 0.04 * D * np.sin(ys / D * 9 + t * 3 + k)
        pen.line(np.stack([xs, ys], 1), np.multiply(c, 0.9), 0.05 * D, 0.6)
    a = np.linspace(math.pi, 2 * math.pi, 30)
    bell = np.stack([w * np.cos(a), h * np.sin(a)], 1)
    bell = np.vstack([bell, [(w * 0.8, 0.08 * D), (-w * 0.8, 0.08 * D)]])
    pen.poly(bell, c, 0.72)
    pen.ellipse((0, -0.45 * h), (0.45 * w, 0.3 * h), 0, np.minimum(np.multiply(c, 1.25), 255), 0.6)


def draw_seagrass(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    for k in range(p['strands']):
        x0 = ((k * 0.618) % 1 - 0.5) * 0.5 * H
        h = H * (0.55 + 0.45 * ((k * 53) % 11) / 11)
        pts = strand(x0, h, t, p, k, 8)
        pen.line(pts, np.multiply(p['colour'], 0.75 + 0.08 * (k % 4)), 0.014 * H + 0.004)


def draw_kelp(pen: Pen, p: dict, t: float) -> None:
    H = p['size']
    c = p['colour']
    for k in range(p['strands']):
        x0 = (k - (p['strands'] - 1) / 2) * 0.08 * H
        pts = strand(x0, H * (0.75 + 0.25 * (k % 2)), t, p, k, 18)
        pen.line(pts, np.multiply(c, 0.7), 0.012 * H)
        for j in range(4, len(pts) - 1, 2):
            side = 1 if (j + k) % 2 else -1
            x, y = pts[j]
            ang = side * (55 + 15 * math.sin(t + j))
            pen.ellipse((x + side * 0.06 * H, y - 0.02 * H), (0.1 * H, 0.028 * H), ang, c, 0.95)


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
        wob = 0.03 * W * np.sin(wave(10) * 6 + k)
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
