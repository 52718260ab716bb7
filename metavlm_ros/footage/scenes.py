"""Procedural SeaClear-like underwater footage with per-frame ground truth (counts and boxes)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.footage.truth import KIND_CLASS, KINDS, GroundTruth
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'ENVIRONMENTS',
    'MIN_CONTRAST',
    'MIN_VISIBLE_AREA',
    'MIN_VISIBLE_FRACTION',
    'SceneFrame',
    'SceneGenerator',
    'environment_for_seed',
]

ENVIRONMENTS = ('pool', 'shallow', 'deep')

# An object is in the ground truth when at least this fraction of its drawn pixels is visible
# (inside the frame and not hidden behind nearer objects) ...
MIN_VISIBLE_FRACTION = 0.3
# ... and its visible part covers at least this fraction of the frame (tiny specks are not countable).
MIN_VISIBLE_AREA = 0.0004
# ... and it differs from what lies behind it by at least this mean amount (0..255 per channel).
MIN_CONTRAST = 6.0
# The renderer draws at most this many pixels along the longer side and upsamples the rest.
MAX_INTERNAL_SIDE = 960


def environment_for_seed(seed: int) -> str:
    """The environment a SceneGenerator picks for `seed` when none is given."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5CE7E])
    return ENVIRONMENTS[int(rng.integers(len(ENVIRONMENTS)))]


class SceneFrame(NamedTuple):
    """One rendered frame: pixels, ground truth, frame number and time since the scene start (ns)."""

    rgb: np.ndarray
    ground_truth: GroundTruth
    index: int
    stamp_ns: int


# ---------------------------------------------------------------------------------------------
# Environments: water optics (per-channel attenuation, veiling light) and floor materials.


@dataclass(frozen=True)
class _Optics:
    beta: tuple[float, float, float]  # attenuation per metre, RGB: red is lost first underwater
    veil_top: tuple[float, float, float]  # veiling (background) light at the top of the frame
    veil_bottom: tuple[float, float, float]
    light: tuple[float, float, float]  # daylight after the water column above (the colour cast)
    horizon: float  # horizon row as a fraction of height (the camera looks slightly down)
    camera_height: tuple[float, float]  # metres above the floor
    lamps: bool  # artificial light falling off with distance (deep sea)
    caustics: float
    rays: float
    snow: int  # marine snow particles per megapixel of internal frame
    turbidity: float


_OPTICS = {
    'pool': _Optics(
        (0.16, 0.05, 0.045), (150, 215, 228), (70, 165, 190), (0.93, 1.0, 1.0), 0.26, (0.9, 1.3), False,
        0.55, 0.15, 120, 0.05,
    ),
    'shallow': _Optics(
        (0.42, 0.15, 0.16), (95, 170, 165), (25, 95, 100), (0.62, 0.9, 0.86), 0.3, (1.0, 1.6), False,
        0.3, 0.3, 320, 0.2,
    ),
    'deep': _Optics(
        (0.34, 0.12, 0.09), (8, 30, 52), (3, 14, 30), (1.0, 0.97, 0.92), -0.2, (1.2, 1.7), True,
        0.0, 0.0, 900, 0.2,
    ),
}  # fmt: skip


@lru_cache(maxsize=32)
def _lowpass(shape: tuple[int, int], scale: float) -> np.ndarray:
    fy = np.fft.fftfreq(shape[0])[:, None]
    fx = np.fft.rfftfreq(shape[1])[None, :]
    return np.exp(-(fx * fx + fy * fy) * (scale * scale * 8.0)).astype(np.float32)


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Tileable band-limited noise, zero mean, unit std; `scale` is the feature size in pixels."""
    from scipy import fft

    white = rng.standard_normal(shape, dtype=np.float32)
    # Gaussian low-pass in the Fourier domain keeps the result periodic, so it tiles seamlessly.
    field_ = fft.irfft2(fft.rfft2(white) * _lowpass(tuple(shape), float(scale)), s=shape).astype(np.float32)
    field_ -= field_.mean()
    return field_ / (field_.std() + 1e-6)


def _fbm(rng: np.random.Generator, shape: tuple[int, int], scales: tuple[float, ...]) -> np.ndarray:
    total = np.zeros(shape, np.float32)
    amp, norm = 1.0, 0.0
    for s in scales:
        total += amp * _smooth_noise(rng, shape, s)
        norm += amp
        amp *= 0.55
    return total / norm


def _floor_albedo(env: str, rng: np.random.Generator, size: int = 512) -> np.ndarray:
    """A tileable floor material (RGB float 0..255) in ground coordinates, 1 texel = 1 cm."""
    if env == 'pool':
        tile = 25  # 25 cm tiles with grout lines
        yy, xx = np.mgrid[0:size, 0:size]
        grout = ((xx % tile) < 2) | ((yy % tile) < 2)
        base = np.empty((size, size, 3), np.float32)
        base[:] = (205, 228, 236)
        jitter = _smooth_noise(rng, (size, size), 40)[..., None] * 6
        base += jitter
        base[grout] = (150, 170, 180)
        # A dark lane line every 2.5 m, as in a real pool floor.
        lane = (xx % 250 > 110) & (xx % 250 < 140)
        base[lane & ~grout] = (40, 60, 110)
        return base
    n = _fbm(rng, (size, size), (64, 24, 8, 3))
    if env == 'shallow':
        sand = np.array((200, 182, 140), np.float32)
        # Wave ripples: a wavy sinusoid across the floor, bent by large-scale noise.
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
        warp = _smooth_noise(rng, (size, size), 90) * 9
        ripple = np.sin((yy + warp) * (2 * math.pi / 16.0)) * 0.5 + 0.5
        shade = 0.82 + 0.12 * ripple + 0.07 * n
        albedo = sand[None, None, :] * shade[..., None]
        albedo *= (1 + 0.08 * _smooth_noise(rng, (size, size), 120))[..., None]  # patches of finer sand
        albedo = _add_rocks(albedo, rng, 22, 1.8, (135, 128, 112), n)
        weed = np.clip((_smooth_noise(rng, (size, size), 50) - 1.3) * 1.2, 0, 0.45)
        weed *= np.clip(0.6 + 0.8 * _smooth_noise(rng, (size, size), 2.5), 0, 1.4)  # tufts, not flat paint
        return albedo * (1 - weed[..., None]) + np.array((95, 120, 70), np.float32) * weed[..., None]
    # Deep sea: silty grey-brown sediment with burrows, small rocks and pale patches.
    silt = np.array((150, 136, 112), np.float32)
    shade = 0.85 + 0.15 * n
    albedo = silt[None, None, :] * shade[..., None]
    spots = _smooth_noise(rng, (size, size), 3)
    albedo[spots > 2.8] *= 0.6
    pale = np.clip((_smooth_noise(rng, (size, size), 36) - 0.5) * 0.5, 0, 0.3)[..., None]
    albedo = albedo * (1 - pale) + np.array((170, 165, 150), np.float32) * pale
    return _add_rocks(albedo, rng, 12, 2.0, (105, 98, 88), n)


def _add_rocks(
    albedo: np.ndarray, rng: np.random.Generator, scale: float, level: float, colour: Any, n: np.ndarray
) -> np.ndarray:
    """Stones where a noise field exceeds `level`, lit from above (towards the far side of the floor)."""
    field_ = _smooth_noise(rng, albedo.shape[:2], scale)
    mask = np.clip((field_ - level) * 3.0, 0, 1)
    # The slope of the field along the viewing direction shades the stones: lit tops, dark fronts.
    slope = np.roll(field_, -2, axis=0) - np.roll(field_, 2, axis=0)
    shade = np.clip(0.9 - 1.2 * slope, 0.45, 1.35) * (0.85 + 0.2 * n)
    stone = np.asarray(colour, np.float32) * shade[..., None]
    # Stones sit in a soft contact shadow on the sediment around them.
    halo = np.clip((field_ - level + 0.5) * 1.2, 0, 0.35)[..., None]
    out = albedo * (1 - halo * 0.6)
    return out * (1 - mask[..., None]) + stone * mask[..., None]


# ---------------------------------------------------------------------------------------------
# Object sprites: each kind is drawn with cv2 primitives in metres around an anchor.


class _Pen:
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


def _draw_fish(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_crab(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_starfish(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_jellyfish(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_seaweed(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_seagrass(pen: _Pen, p: dict, t: float) -> None:
    H = p['size']
    for k in range(p['strands']):
        x0 = ((k * 0.618) % 1 - 0.5) * 0.5 * H
        h = H * (0.55 + 0.45 * ((k * 53) % 11) / 11)
        pts = _strand(x0, h, t, p, k, 8)
        pen.line(pts, np.multiply(p['colour'], 0.75 + 0.08 * (k % 4)), 0.014 * H + 0.004)


def _draw_kelp(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_bottle(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_can(pen: _Pen, p: dict, t: float) -> None:
    L = p['size']
    r = L * 0.33
    c = p['colour']
    dent = p['dent'] * r
    pen.poly([(-L / 2, -r), (0, -r + dent), (L / 2, -r), (L / 2, r), (0, r - dent * 0.5), (-L / 2, r)], c)
    pen.ellipse((L / 2, 0), (r * 0.3, r), 0, (180, 180, 175))
    pen.line([(-L * 0.4, -r * 0.55), (L * 0.4, -r * 0.55)], np.minimum(np.add(c, 80), 255), r * 0.22)
    pen.line([(-L * 0.15, -r * 0.9), (-L * 0.15, r * 0.9)], p['stripe'], r * 0.35)


def _draw_bag(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_tyre(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_net(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_pipe(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_box(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_rov(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_rope(pen: _Pen, p: dict, t: float) -> None:
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


def _draw_anchor(pen: _Pen, p: dict, t: float) -> None:
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


_DRAW = {
    'fish': _draw_fish,
    'crab': _draw_crab,
    'starfish': _draw_starfish,
    'jellyfish': _draw_jellyfish,
    'seaweed': _draw_seaweed,
    'seagrass': _draw_seagrass,
    'kelp': _draw_kelp,
    'bottle': _draw_bottle,
    'can': _draw_can,
    'bag': _draw_bag,
    'tyre': _draw_tyre,
    'net': _draw_net,
    'pipe': _draw_pipe,
    'box': _draw_box,
    'rov': _draw_rov,
    'rope': _draw_rope,
    'anchor': _draw_anchor,
}

# Size range (m), and how far the drawing extends around its anchor in units of size:
# (left, top, right, bottom); anchor is the bottom centre for upright things, the centre otherwise.
_SIZE = {
    'fish': (0.18, 0.5), 'crab': (0.15, 0.3), 'starfish': (0.15, 0.3), 'jellyfish': (0.15, 0.35),
    'seaweed': (0.3, 0.7), 'seagrass': (0.2, 0.45), 'kelp': (0.9, 2.0),
    'bottle': (0.24, 0.34), 'can': (0.11, 0.15), 'bag': (0.3, 0.5), 'tyre': (0.5, 0.75), 'net': (0.8, 1.4),
    'pipe': (0.9, 2.2), 'box': (0.35, 0.7), 'rov': (0.45, 0.8), 'rope': (0.8, 1.6), 'anchor': (0.5, 0.9),
}  # fmt: skip
_UPRIGHT = {'seaweed', 'seagrass', 'kelp', 'box', 'rov'}
_SWIMMERS = {'fish', 'jellyfish'}
_LYING = {'crab', 'starfish', 'bottle', 'can', 'bag', 'tyre', 'net', 'pipe', 'rope', 'anchor'}


def _extent(kind: str) -> float:
    return {'seaweed': 1.3, 'seagrass': 1.3, 'kelp': 1.3, 'net': 0.8, 'rope': 0.8, 'pipe': 0.75}.get(
        kind, 0.9
    )


@dataclass
class _Object:
    index: int
    kind: str
    X: float  # lateral position, metres
    d: float  # distance from the camera, metres
    Y: float  # height above the floor of the anchor, metres
    angle: float  # in-plane rotation, radians
    params: dict
    velocity: tuple[float, float, float] = (0.0, 0.0, 0.0)  # dX, dY, dd per second

    @property
    def cls(self) -> str:
        return KIND_CLASS[self.kind]


def _random_params(kind: str, rng: np.random.Generator, env: str) -> dict:
    lo, hi = _SIZE[kind]
    p: dict[str, Any] = {'size': float(rng.uniform(lo, hi)), 'phase': float(rng.uniform(0, 2 * math.pi))}
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    if kind == 'fish':
        p.update(
            colour=pick(
                [
                    (190, 190, 175),
                    (220, 170, 60),
                    (120, 140, 160),
                    (200, 90, 60),
                    (160, 160, 120),
                    (230, 210, 90),
                ]
            ),
            aspect=float(rng.uniform(0.14, 0.24)),
            beat=float(rng.uniform(5, 9)),
            stripes=int(rng.integers(0, 4)),
        )
    elif kind == 'crab':
        p['colour'] = pick([(200, 80, 45), (150, 90, 60), (180, 120, 70)])
    elif kind == 'starfish':
        p['colour'] = pick([(225, 95, 45), (200, 60, 60), (150, 70, 140), (230, 150, 60)])
    elif kind == 'jellyfish':
        p['colour'] = pick([(230, 210, 230), (220, 220, 240), (240, 190, 170)])
    elif kind in ('seaweed', 'seagrass', 'kelp'):
        colours = {
            'seaweed': [(95, 110, 45), (120, 100, 40), (70, 120, 60)],
            'seagrass': [(90, 150, 60), (110, 160, 70), (70, 130, 55)],
            'kelp': [(150, 120, 45), (130, 105, 40), (165, 135, 60)],
        }[kind]
        p.update(
            colour=pick(colours),
            strands=int(rng.integers(*{'seaweed': (3, 7), 'seagrass': (10, 22), 'kelp': (1, 4)}[kind])),
            sway_speed=float(rng.uniform(0.6, 1.2)),
            lean=float(rng.uniform(-0.6, 0.6)),
        )
    elif kind == 'bottle':
        glass = pick(
            [((60, 120, 60), 0.8), ((110, 70, 30), 0.85), ((170, 200, 200), 0.7), ((80, 140, 190), 0.75)]
        )
        p.update(
            colour=glass[0],
            opacity=glass[1],
            label=bool(rng.random() < 0.5),
            label_colour=pick([(220, 220, 210), (200, 50, 40), (40, 80, 170)]),
            cap=pick([(30, 90, 180), (200, 40, 40), (230, 230, 230)]),
        )
    elif kind == 'can':
        p.update(
            colour=pick([(200, 40, 40), (190, 190, 195), (40, 90, 180), (40, 130, 60), (220, 200, 60)]),
            stripe=pick([(240, 240, 240), (30, 30, 30), (220, 180, 40)]),
            dent=float(rng.uniform(0, 0.35)),
        )
    elif kind == 'bag':
        n = 18
        p.update(
            colour=pick([(225, 230, 230), (210, 220, 200), (60, 60, 65), (180, 40, 40), (40, 90, 170)]),
            opacity=float(rng.uniform(0.7, 0.85)),
            radii=[float(v) for v in np.clip(1 + 0.25 * rng.standard_normal(n), 0.6, 1.3)],
        )
    elif kind == 'net':
        a = np.linspace(0, 2 * math.pi, 14, endpoint=False)
        r = np.clip(1 + 0.2 * rng.standard_normal(14), 0.7, 1.2)
        p.update(
            colour=pick([(60, 140, 90), (40, 90, 160), (200, 110, 40), (150, 150, 140)]),
            outline=np.stack([r * np.cos(a), r * np.sin(a) * 0.7], 1).tolist(),
            floats=[(float(x), float(y)) for x, y in rng.uniform(-1, 1, (int(rng.integers(0, 4)), 2))],
            float_colour=pick([(230, 120, 30), (230, 220, 40), (240, 240, 240)]),
        )
    elif kind == 'pipe':
        p.update(
            colour=pick([(140, 140, 140), (210, 110, 40), (60, 60, 60), (200, 200, 190)]),
            aspect=float(rng.uniform(0.05, 0.1)),
            rust=[
                (float(x), float(w))
                for x, w in zip(rng.uniform(-0.8, 0.8, 3), rng.uniform(0.03, 0.1, 3), strict=True)
            ],
        )
    elif kind == 'box':
        p.update(
            colour=pick([(150, 110, 65), (120, 90, 55), (200, 180, 60), (90, 100, 110)]),
            aspect=float(rng.uniform(0.55, 0.9)),
            planks=int(rng.integers(2, 6)),
        )
    elif kind == 'rov':
        p['colour'] = pick([(235, 190, 30), (230, 120, 30), (220, 220, 40)])
    elif kind == 'rope':
        n = 12
        x = np.linspace(-0.5, 0.5, n)
        y = np.cumsum(rng.normal(0, 0.06, n))
        y -= y.mean()
        p.update(
            colour=pick([(210, 190, 140), (230, 150, 50), (60, 110, 190), (200, 60, 50)]),
            path=np.stack([x, y], 1).tolist(),
        )
    elif kind == 'anchor':
        p['colour'] = pick([(80, 70, 62), (110, 75, 50), (60, 62, 66)])
    return p


# ---------------------------------------------------------------------------------------------


class SceneGenerator:
    """Renders deterministic underwater footage of one scene, frame by frame, with ground truth.

    A scene is a floor (pool tiles, sand, or deep-sea sediment) with objects of the four classes,
    seen by a slowly panning, drifting and bobbing camera; fish and jellyfish swim and plants sway.
    `frame(i)` is a pure function of (seed, i): frames can be rendered in any order. Colours follow
    the underwater image formation model: direct light attenuated per channel with distance
    (red first) plus veiling light, with caustics, light shafts, turbidity, marine snow, lamp
    fall-off (deep sea), vignetting and sensor grain.
    """

    def __init__(
        self,
        width: int = 1920,
        height: int = 1080,
        fps: float = 10.0,
        seed: int = 0,
        environment: str | None = None,
        frames: int | None = None,
    ) -> None:
        """Build a scene.

        Args:
            width: Frame width in pixels (>= 16).
            height: Frame height in pixels (>= 16).
            fps: Frame rate; motion is defined in seconds, so any rate shows the same scene.
            seed: Seed of everything random in the scene.
            environment: 'pool', 'shallow' or 'deep'; None picks one from the seed.
            frames: Number of frames `__iter__` yields; None for endless.

        Raises:
            ParameterError: A size, rate, frame count or environment is invalid.
        """
        if not (isinstance(width, int) and isinstance(height, int)) or width < 16 or height < 16:
            raise ParameterError(f'frame size must be at least 16x16 pixels, got {width}x{height}')
        if width * height > 8192 * 8192:
            raise ParameterError(f'frame size {width}x{height} is too large')
        if not fps or fps <= 0 or not math.isfinite(fps):
            raise ParameterError(f'fps must be > 0, got {fps}')
        if frames is not None and frames < 0:
            raise ParameterError(f'frames must be >= 0, got {frames}')
        if environment is None:
            environment = environment_for_seed(seed)
        if environment not in ENVIRONMENTS:
            raise ParameterError(
                f'unknown environment {environment!r}; choose one of {", ".join(ENVIRONMENTS)}'
            )
        self.width, self.height, self.fps, self.seed = width, height, float(fps), int(seed)
        self.environment = environment
        self.frames = frames
        self.optics = _OPTICS[environment]
        # The same seed in another environment is another scene, not the same objects relit.
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5CE7E, 1 + ENVIRONMENTS.index(environment)])
        scale = min(1.0, MAX_INTERNAL_SIDE / max(width, height))
        self.iw, self.ih = max(16, round(width * scale)), max(16, round(height * scale))
        self._build(rng)

    # -- scene construction ---------------------------------------------------------------------

    def _build(self, rng: np.random.Generator) -> None:
        o, iw, ih = self.optics, self.iw, self.ih
        self.focal = 0.72 * iw  # about 70 degrees horizontal field of view
        self.cam_h = float(rng.uniform(*o.camera_height))
        self.horizon = o.horizon * ih + rng.uniform(-0.04, 0.04) * ih
        # Camera motion amplitudes (yaw in pixels, drift in metres, bob in pixels) and periods (s).
        self.yaw_amp = float(rng.uniform(0.04, 0.1) * iw)
        self.drift_amp = float(rng.uniform(0.15, 0.4))
        self.bob_amp = float(rng.uniform(0.008, 0.02) * ih)
        self.periods = rng.uniform((24, 30, 5), (45, 60, 9))
        self.phases = rng.uniform(0, 2 * math.pi, 3)
        self.wall = float(rng.uniform(7, 11)) if self.environment == 'pool' else None
        self._build_background(rng)
        self._build_objects(rng)
        self._build_effects(rng)

    def _distance_of_row(self, rows: np.ndarray) -> np.ndarray:
        below = np.maximum(rows - self.horizon, 1e-3)
        return self.focal * self.cam_h / below

    def _build_background(self, rng: np.random.Generator) -> None:
        o, iw, ih = self.optics, self.iw, self.ih
        # Margins so that camera motion never samples outside the precomputed panorama.
        self.mx = int(math.ceil(self.yaw_amp + self.drift_amp * (ih - self.horizon) / self.cam_h)) + 4
        self.my = int(math.ceil(self.bob_amp)) + 4
        W, H = iw + 2 * self.mx, ih + 2 * self.my
        rows = np.arange(H, dtype=np.float32) - self.my
        t_row = np.clip(rows / ih, 0, 1)[:, None]
        self.veil_rows = (np.array(o.veil_top) * (1 - t_row) + np.array(o.veil_bottom) * t_row).astype(
            np.float32
        )
        albedo = _floor_albedo(self.environment, rng)
        tex = albedo.shape[0]
        d = self._distance_of_row(rows)
        ground = rows > self.horizon + 0.5
        cols = np.arange(W, dtype=np.float32) - self.mx - iw / 2
        X = cols[None, :] * d[:, None] / self.focal  # lateral metres of each floor pixel
        u = (X * 100.0) % tex
        v = (d[:, None] * 100.0 + np.zeros_like(X)) % tex
        surface_d = np.broadcast_to(d[:, None], (H, W)).copy()
        if self.wall is not None:
            # Pool: rows whose floor point lies beyond the far wall show the wall instead.
            on_wall = (~ground[:, None]) | (surface_d > self.wall)
            height = self.cam_h - (rows[:, None] - self.horizon) * self.wall / self.focal
            X_wall = cols[None, :] * self.wall / self.focal
            u = np.where(on_wall, (X_wall * 100.0) % tex, u)
            v = np.where(on_wall, (height * 100.0 + np.zeros_like(X)) % tex, v)
            surface_d = np.where(on_wall, self.wall, surface_d)
            ground_mask = np.broadcast_to((rows > -1e9)[:, None], (H, W)) & (height < 2.2)
        else:
            ground_mask = np.broadcast_to(ground[:, None], (H, W))
        # Far texels are averaged (a cheap mip-map): sampling a sharp texture at a distance aliases.
        blurred = cv2.GaussianBlur(albedo, (0, 0), 3.0, borderType=cv2.BORDER_REFLECT)
        floor = cv2.remap(
            albedo, u.astype(np.float32), v.astype(np.float32), cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP
        )
        floor_far = cv2.remap(
            blurred, u.astype(np.float32), v.astype(np.float32), cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP
        )
        far = np.clip((surface_d - 3.0) / 6.0, 0, 1)[..., None]
        floor = floor * (1 - far) + floor_far * far
        if self.environment != 'pool':
            # Grains and pits at 2.5 mm: near the camera the 1 cm texture alone is visibly magnified.
            detail = _smooth_noise(rng, (256, 256), 1.0)
            fine = cv2.remap(
                detail,
                (u * 4).astype(np.float32),
                (v * 4).astype(np.float32),
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_WRAP,
            )
            near = np.clip((3.5 - surface_d) / 2.0, 0, 1)
            floor *= (1 + 0.1 * fine * near)[..., None]
        self.surface_d = surface_d.astype(np.float32)
        lit = floor * self._illumination(surface_d, rows[:, None])[..., None] * np.array(o.light, np.float32)
        T = np.exp(-np.array(o.beta, np.float32)[None, None, :] * surface_d[..., None])
        veil = np.broadcast_to(self.veil_rows[:, None, :], (H, W, 3))
        bg = lit * T + veil * (1 - T)
        self.ground_mask = ground_mask
        bg = np.where(ground_mask[..., None], bg, veil)
        # Soften the horizon: the floor dissolves into the veiling light over a few rows.
        self.background = np.clip(bg, 0, 255).astype(np.float32)
        self.pano_w, self.pano_h = W, H
        self.base_x = np.tile(np.arange(iw, dtype=np.float32), (ih, 1))
        self.base_y = np.tile(np.arange(ih, dtype=np.float32)[:, None], (1, iw))
        # Sideways drift shifts each row by focal / distance pixels per metre (parallax); the pool's far
        # wall is at one distance, and the open water above the horizon is at infinity.
        screen_rows = np.arange(ih, dtype=np.float32)
        self.k_rows = np.maximum(screen_rows - self.horizon, 0) / self.cam_h
        if self.wall is not None:
            self.k_rows = np.maximum(self.k_rows, self.focal / self.wall).astype(np.float32)

    def _illumination(self, distance: np.ndarray | float, rows: np.ndarray | float) -> np.ndarray | float:
        if self.optics.lamps:
            # The robot's lamps: inverse-square fall-off with distance, saturating near the camera.
            return np.minimum(1.25, (2.6 / np.maximum(distance, 0.3)) ** 2)
        return np.ones_like(np.asarray(distance, np.float32)) * 1.0

    def _build_objects(self, rng: np.random.Generator) -> None:
        weights = {'animal': 0.3, 'vegetation': 0.22, 'object': 0.2, 'trash': 0.28}
        if self.environment == 'pool':
            weights = {'animal': 0.12, 'vegetation': 0.05, 'object': 0.38, 'trash': 0.45}
        n = int(rng.integers(7, 14))
        classes = list(CLASSES)
        # Every class appears in every scene at least once; the rest follow the weights.
        picks = classes + [classes[i] for i in rng.choice(4, n - 4, p=[weights[c] for c in classes])]
        objects = []
        far = min(7.0, self.wall - 0.6) if self.wall else 7.0
        for index, cls in enumerate(picks):
            options = KINDS[cls]
            if self.environment == 'deep' and cls == 'vegetation':
                options = ('seaweed', 'seagrass')  # no kelp forests in the lamp-lit deep
            kind = options[int(rng.integers(len(options)))]
            d = float(rng.uniform(1.3, far if kind != 'kelp' else far + 1))
            # Lateral range: what the camera sees at that distance over its motion, plus a little.
            half = (self.iw / 2 + self.yaw_amp) * d / self.focal + self.drift_amp
            X = float(rng.uniform(-half, half) * 0.95)
            Y = 0.0
            velocity = (0.0, 0.0, 0.0)
            angle = float(rng.uniform(-0.6, 0.6))
            if kind in _UPRIGHT:
                angle = float(rng.uniform(-0.08, 0.08))
            if kind == 'fish':
                Y = float(rng.uniform(0.25, self.cam_h + 0.6))
                speed = float(rng.uniform(0.05, 0.25)) * (1 if rng.random() < 0.5 else -1)
                velocity = (speed, float(rng.uniform(-0.02, 0.02)), 0.0)
                angle = float(rng.uniform(-0.15, 0.15))
            elif kind == 'jellyfish':
                Y = float(rng.uniform(0.4, self.cam_h + 0.8))
                velocity = (float(rng.uniform(-0.03, 0.03)), float(rng.uniform(0.0, 0.04)), 0.0)
                angle = float(rng.uniform(-0.2, 0.2))
            elif kind == 'bag' and rng.random() < 0.4:
                Y = float(rng.uniform(0.3, 1.2))  # drifting in mid-water
                velocity = (float(rng.uniform(-0.04, 0.04)), float(rng.uniform(-0.01, 0.01)), 0.0)
            elif kind == 'crab':
                velocity = (float(rng.uniform(-0.03, 0.03)), 0.0, 0.0)
            params = _random_params(kind, rng, self.environment)
            if kind == 'fish' and velocity[0] < 0:
                params['flip'] = True
            objects.append(_Object(index, kind, X, d, Y, angle, params, velocity))
        self.objects = objects

    def _build_effects(self, rng: np.random.Generator) -> None:
        o, iw, ih = self.optics, self.iw, self.ih
        cw, ch = max(8, iw // 2), max(8, ih // 2)
        self.cw, self.ch = cw, ch
        # Caustics: ridges of two drifting noise fields projected on the floor (sampled at half size).
        self.caustic_a = _smooth_noise(rng, (256, 256), 18)
        self.caustic_b = _smooth_noise(rng, (256, 256), 26)
        rows = (np.arange(ch, dtype=np.float32) + 0.5) * ih / ch
        cols = (np.arange(cw, dtype=np.float32) + 0.5) * iw / cw - iw / 2
        d = self._distance_of_row(rows)
        if self.wall is not None:
            d = np.minimum(d, self.wall)
        self.c_u = (cols[None, :] * d[:, None] / self.focal * 60.0).astype(np.float32)
        self.c_v = np.broadcast_to((d[:, None] * 60.0), (ch, cw)).astype(np.float32).copy()
        fade = np.clip((rows - self.horizon) / max(ih * 0.15, 1), 0, 1) * np.exp(-d / 6.0)
        self.c_weight = (fade[:, None] * np.ones((1, cw), np.float32)).astype(np.float32) * o.caustics
        # Light shafts from the surface: a few soft slanted bands, fading downwards.
        xs = np.arange(cw, dtype=np.float32)[None, :]
        ys = np.arange(ch, dtype=np.float32)[:, None]
        self.rays = []
        for _ in range(5):
            x0 = float(rng.uniform(-0.2, 1.2) * cw)
            slope = float(rng.uniform(-0.45, 0.1))
            width = float(rng.uniform(0.015, 0.05) * cw)
            self.rays.append((x0, slope, width, float(rng.uniform(0.4, 1.0)), float(rng.uniform(0, 6.28))))
        self.ray_x, self.ray_y = xs, ys
        self.ray_fade = np.exp(-ys / (0.6 * ch)).astype(np.float32) * o.rays
        # Turbidity: slow clouds of suspended matter.
        self.turbid = (_fbm(rng, (128, 128), (40, 14)) * 0.5 + 0.5).astype(np.float32)
        # Marine snow: particles with a depth (parallax), size, brightness and sinking speed.
        n = int(o.snow * iw * ih / 1e6) + 5
        self.snow = {
            'x': rng.uniform(0, 1, n),
            'y': rng.uniform(0, 1, n),
            'z': rng.uniform(0.1, 1.0, n) ** 2,
            'r': rng.uniform(0.5, 1.3, n),
            'b': rng.uniform(0.15, 0.6, n),
            'v': rng.uniform(0.005, 0.03, n),
        }
        # Vignette (lens fall-off) and, in the deep sea, the lamps' light cone.
        yy, xx = np.mgrid[0:ih, 0:iw].astype(np.float32)
        r2 = ((xx - iw / 2) / (iw / 2)) ** 2 + ((yy - ih / 2) / (ih / 2)) ** 2
        vignette = 1.0 - 0.28 * r2 / 2
        if o.lamps:
            spot = ((xx - iw / 2) / (iw * 0.55)) ** 2 + ((yy - ih * 0.6) / (ih * 0.6)) ** 2
            vignette *= 0.3 + 0.85 * np.exp(-spot * 1.1)
        self.vignette = np.clip(vignette, 0, 1.3).astype(np.float32)[..., None]
        # Sensor grain at output size, cropped at a per-frame offset (precomputed: drawing it per
        # frame at 1080p would cost more than the rest of the frame).
        g = np.random.default_rng(rng.integers(1 << 31))
        sigma = 2.2 if not o.lamps else 3.5
        grain = g.standard_normal((self.height + 32, self.width + 32, 3), dtype=np.float32)
        grain *= sigma
        self.grain_pos = cv2.convertScaleAbs(np.maximum(grain, 0))
        self.grain_neg = cv2.convertScaleAbs(np.minimum(grain, 0))
        self.texture = (1.0 + 0.07 * _smooth_noise(rng, (128, 128), 5)).astype(np.float32)

    # -- per-frame rendering ------------------------------------------------------------------------

    def _camera(self, t: float) -> tuple[float, float, float]:
        p, ph = self.periods, self.phases
        yaw = self.yaw_amp * math.sin(2 * math.pi * t / p[0] + ph[0])
        drift = self.drift_amp * math.sin(2 * math.pi * t / p[1] + ph[1])
        bob = self.bob_amp * math.sin(2 * math.pi * t / p[2] + ph[2])
        return yaw, drift, bob

    def render(self, index: int) -> tuple[np.ndarray, GroundTruth, np.ndarray]:
        """Render frame `index` with its ground truth and its object label map.

        Args:
            index: Frame number (>= 0); its time is index / fps seconds.

        Returns:
            (rgb, ground_truth, labels): the RGB uint8 frame at output size; the ground truth; and
            an int16 map at the internal drawing size (`internal_size`) holding, per pixel, the
            `id` of the object seen there, or -1.
        """
        if index < 0:
            raise ParameterError(f'frame index must be >= 0, got {index}')
        t = index / self.fps
        iw, ih = self.iw, self.ih
        yaw, drift, bob = self._camera(t)
        map_x = self.base_x + (self.mx + yaw + drift * self.k_rows)[:, None]
        map_y = self.base_y + (self.my - bob)
        img = cv2.remap(self.background, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
        self._caustics_and_rays(img, t, yaw)
        labels = np.full((ih, iw), -1, np.int16)
        areas: dict[int, tuple[int, tuple[int, int, int, int], float]] = {}
        # Far to near, so that nearer objects hide farther ones.
        placed = sorted(
            ((self._place(obj, t, yaw, drift, bob), obj) for obj in self.objects), key=lambda a: -a[0][2]
        )
        for (u, v, d), obj in placed:
            drawn = self._draw_object(img, labels, obj, u, v, d, t)
            if drawn:
                areas[obj.index] = drawn
        self._snow(img, t, yaw, bob)
        self._turbidity(img, t)
        img *= self.vignette
        out = np.clip(img, 0, 255).astype(np.uint8)
        if (iw, ih) != (self.width, self.height):
            out = cv2.resize(out, (self.width, self.height), interpolation=cv2.INTER_LINEAR)
        g = np.random.default_rng([self.seed & 0xFFFFFFFF, index])
        gx, gy = (int(v) for v in g.integers(0, 32, 2))
        cv2.add(out, self.grain_pos[gy : gy + self.height, gx : gx + self.width], dst=out)
        cv2.subtract(out, self.grain_neg[gy : gy + self.height, gx : gx + self.width], dst=out)
        gt = self._ground_truth(labels, areas, index)
        return out, gt, labels

    def frame(self, index: int) -> tuple[np.ndarray, GroundTruth]:
        """Frame `index` as (rgb uint8 (H, W, 3), ground truth)."""
        rgb, gt, _ = self.render(index)
        return rgb, gt

    def generate(self, index: int) -> SceneFrame:
        """Frame `index` as a SceneFrame (attributes rgb, ground_truth, index, stamp_ns)."""
        rgb, gt = self.frame(index)
        return SceneFrame(rgb, gt, index, round(index * 1e9 / self.fps))

    def __iter__(self) -> Iterator[tuple[np.ndarray, GroundTruth]]:
        index = 0
        while self.frames is None or index < self.frames:
            yield self.frame(index)
            index += 1

    def __len__(self) -> int:
        if self.frames is None:
            raise TypeError('an endless scene has no length')
        return self.frames

    @property
    def internal_size(self) -> tuple[int, int]:
        """(width, height) at which frames are drawn before upsampling to the output size."""
        return self.iw, self.ih

    def _place(
        self, obj: _Object, t: float, yaw: float, drift: float, bob: float
    ) -> tuple[float, float, float]:
        X = obj.X + obj.velocity[0] * t
        Y = obj.Y + obj.velocity[1] * t
        if obj.kind == 'jellyfish':
            Y = obj.Y + ((obj.velocity[1] * t + 0.3) % (self.cam_h + 1.2)) - 0.3  # rises, reappears below
        d = obj.d
        u = self.iw / 2 + self.focal * (X - drift) / d - yaw
        v = self.horizon + self.focal * (self.cam_h - Y) / d + bob
        return u, v, d

    def _draw_object(
        self, img: np.ndarray, labels: np.ndarray, obj: _Object, u: float, v: float, d: float, t: float
    ) -> tuple[int, tuple[int, int, int, int], float] | None:
        s = self.focal / d  # pixels per metre at this distance
        size = obj.params['size']
        ext = _extent(obj.kind) * size * s * (1.6 if obj.kind in _UPRIGHT else 1.0)
        half = int(math.ceil(ext)) + 3
        x0, y0 = int(math.floor(u)) - half, int(math.floor(v)) - half
        if obj.kind in _UPRIGHT:
            y0 = int(math.floor(v)) - 2 * half + 6
        w = h = 2 * half
        if x0 >= self.iw or y0 >= self.ih or x0 + w <= 0 or y0 + h <= 0 or half < 2:
            return None
        # Things on the floor are foreshortened: the camera sees them at a grazing angle.
        squash = 1.0
        if obj.kind in _LYING and obj.Y == 0.0:
            squash = max(0.25, math.sin(math.atan2(self.cam_h, d)) * 1.2)
        angle = obj.angle
        pen = _Pen(w, h, u - x0, v - y0, s, angle, squash)
        pen.flip = bool(obj.params.get('flip'))
        _DRAW[obj.kind](pen, obj.params, t)
        # Forward scattering softens edges more with distance; it also takes the cut-out look off shapes.
        sigma = (0.3 + 0.14 * d) * self.iw / 960
        if sigma >= 0.3:
            pen.rgb = cv2.GaussianBlur(pen.rgb, (0, 0), sigma)
            pen.alpha = cv2.GaussianBlur(pen.alpha, (0, 0), sigma)
        total = int(np.count_nonzero(pen.alpha >= 128))
        if total == 0:
            return None
        if obj.Y == 0.0 and obj.kind not in _SWIMMERS:
            self._contact_shadow(img, pen.alpha, x0, y0, u, v, s * size, d)
        # Only the drawn part of the sprite, clipped to the frame, is composited (sprites are mostly empty).
        bx, by, bw, bh = cv2.boundingRect(pen.alpha)
        fx0, fy0 = max(x0 + bx, 0), max(y0 + by, 0)
        fx1, fy1 = min(x0 + bx + bw, self.iw), min(y0 + by + bh, self.ih)
        if fx1 <= fx0 or fy1 <= fy0:
            return None
        sx0, sy0 = fx0 - x0, fy0 - y0
        a = pen.alpha[sy0 : sy0 + fy1 - fy0, sx0 : sx0 + fx1 - fx0].astype(np.float32) * (1 / 255)
        col = pen.rgb[sy0 : sy0 + fy1 - fy0, sx0 : sx0 + fx1 - fx0].astype(np.float32)
        # Surface texture and top lighting give the flat cv2 shapes some relief.
        th, tw = col.shape[:2]
        tex = self.texture[(np.arange(th) + obj.index * 7) % 128][:, (np.arange(tw) + obj.index * 13) % 128]
        ramp = np.linspace(1.12, 0.85, h, dtype=np.float32)[sy0 : sy0 + th, None]
        col *= (tex * ramp)[..., None]
        o = self.optics
        light = np.asarray(o.light, np.float32) * float(self._illumination(d, v))
        T = np.exp(-np.asarray(o.beta, np.float32) * d)
        veil = self.veil_rows[np.clip(np.arange(fy0, fy1) + self.my, 0, self.pano_h - 1)]
        region = img[fy0:fy1, fx0:fx1]
        solid = a >= 0.5
        behind = region[solid]
        a3 = a[..., None]
        region *= 1 - a3
        region += col * (light * T) + a3 * veil[:, None, :] * (1 - T)
        # How much the object changes the picture, after the lens fall-off applied later: haze and
        # darkness make far objects vanish, and the ground truth must not count what nobody can see.
        vignette = float(self.vignette[(fy0 + fy1) // 2, (fx0 + fx1) // 2, 0])
        contrast = float(np.abs(region[solid] - behind).mean()) * vignette if behind.size else 0.0
        lab = labels[fy0:fy1, fx0:fx1]
        lab[solid] = obj.index
        return total, (fx0, fy0, fx1, fy1), contrast

    def _contact_shadow(
        self, img: np.ndarray, alpha: np.ndarray, x0: int, y0: int, u: float, v: float, width: float, d: float
    ) -> None:
        """Darken the floor under an object: the ambient light it blocks (without it, things float)."""
        # The footprint: the sprite's lowest rows, spread sideways; a Gaussian profile keeps it soft.
        bx, by, bw, bh = cv2.boundingRect(alpha)
        cx = x0 + bx + bw / 2
        cy = y0 + by + bh - max(1.0, 0.12 * bh)
        ax, ay = max(2.0, bw * 0.55), max(1.5, min(bh * 0.25, width * 0.12))
        fx0, fx1 = max(int(cx - 1.6 * ax), 0), min(int(cx + 1.6 * ax) + 1, self.iw)
        fy0, fy1 = max(int(cy - 1.6 * ay), 0), min(int(cy + 1.6 * ay) + 1, self.ih)
        if fx1 <= fx0 or fy1 <= fy0:
            return
        gx = np.exp(-(((np.arange(fx0, fx1, dtype=np.float32) - cx) / ax) ** 2) * 1.5)
        gy = np.exp(-(((np.arange(fy0, fy1, dtype=np.float32) - cy) / ay) ** 2) * 1.5)
        strength = 0.6 * math.exp(-d / 8.0)  # far shadows fade into the haze
        img[fy0:fy1, fx0:fx1] *= (1 - strength * np.outer(gy, gx))[..., None]

    def _caustics_and_rays(self, img: np.ndarray, t: float, yaw: float) -> None:
        o = self.optics
        if o.caustics <= 0 and o.rays <= 0:
            return
        light = np.zeros((self.ch, self.cw), np.float32)
        if o.caustics > 0:
            ua = self.c_u + (yaw * 0.08 + t * 9.0)
            va = self.c_v + t * 5.0
            a = cv2.remap(self.caustic_a, ua, va, cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP)
            b = cv2.remap(
                self.caustic_b,
                ua * 0.8 - t * 11.0,
                va * 0.8 + t * 3.0,
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_WRAP,
            )
            ridge = np.exp(-(((a + b) * 3.0) ** 2))
            light += cv2.GaussianBlur(ridge * ridge, (0, 0), 0.8) * self.c_weight * 1.6
        if o.rays > 0:
            rays = np.zeros_like(light)
            for x0, slope, width, strength, phase in self.rays:
                centre = (
                    x0 + slope * self.ray_y - yaw * 0.5 * self.cw / self.iw + 6 * math.sin(t * 0.3 + phase)
                )
                flicker = 0.75 + 0.25 * math.sin(t * 0.7 + phase)
                rays += strength * flicker * np.exp(-(((self.ray_x - centre) / width) ** 2))
            light += rays * self.ray_fade
        light = cv2.resize(light, (self.iw, self.ih), interpolation=cv2.INTER_LINEAR)
        # Caustics brighten what they fall on (multiplicative); shafts add scattered light.
        img *= 1 + light[..., None] * np.array((1.0, 1.0, 0.95), np.float32)

    def _snow(self, img: np.ndarray, t: float, yaw: float, bob: float) -> None:
        sn = self.snow
        iw, ih = self.iw, self.ih
        x = ((sn['x'] * (iw + 40) - yaw * sn['z'] * 1.5 + t * 3.0 * sn['z']) % (iw + 40)) - 20
        y = ((sn['y'] * (ih + 40) + t * sn['v'] * ih + bob * sn['z']) % (ih + 40)) - 20
        layer = np.zeros((ih, iw), np.uint8)
        unit = max(iw / 640.0, 0.35)
        for xi, yi, z, r, b in zip(x, y, sn['z'], sn['r'], sn['b'], strict=True):
            radius = max(1, int(round(r * unit * (0.5 + 2.5 * z))))
            cv2.circle(
                layer,
                (int(xi * 16), int(yi * 16)),
                radius * 16,
                int(255 * b * (0.35 + 0.65 * z)),
                -1,
                cv2.LINE_AA,
                4,
            )
        layer = cv2.GaussianBlur(layer, (0, 0), max(0.6, unit * 0.7))
        tint = np.array(self.optics.veil_top, np.float32) / 255 * 0.35 + 0.55
        img += layer[..., None].astype(np.float32) * tint * 0.6

    def _turbidity(self, img: np.ndarray, t: float) -> None:
        o = self.optics
        if o.turbidity <= 0:
            return
        off = int(t * 2) % 128
        cloud = np.roll(self.turbid, off, axis=1)
        cloud = cv2.resize(cloud, (self.iw, self.ih), interpolation=cv2.INTER_LINEAR)
        a = (cloud * o.turbidity)[..., None]
        veil = self.veil_rows[self.my : self.my + self.ih][:, None, :]
        img *= 1 - a
        img += a * veil

    def _ground_truth(
        self, labels: np.ndarray, areas: dict[int, tuple[int, tuple[int, int, int, int], float]], index: int
    ) -> GroundTruth:
        counts = {c: 0 for c in CLASSES}
        kind_counts = {k: 0 for c in CLASSES for k in KINDS[c]}
        boxes = []
        visible = np.bincount(
            (labels.ravel() + 1).astype(np.int64),
            minlength=max((o.index for o in self.objects), default=0) + 2,
        )[1:]
        sx, sy = self.width / self.iw, self.height / self.ih
        min_area = MIN_VISIBLE_AREA * self.iw * self.ih
        for obj in self.objects:
            if obj.index not in areas:
                continue
            total, (rx0, ry0, rx1, ry1), contrast = areas[obj.index]
            seen = int(visible[obj.index])
            if seen < max(min_area, 1) or seen / total < MIN_VISIBLE_FRACTION or contrast < MIN_CONTRAST:
                continue
            # An object's pixels all lie in the region its sprite was drawn into.
            ys, xs = np.nonzero(labels[ry0:ry1, rx0:rx1] == obj.index)
            xs, ys = xs + rx0, ys + ry0
            box = [
                int(math.floor(xs.min() * sx)),
                int(math.floor(ys.min() * sy)),
                min(self.width, int(math.ceil((xs.max() + 1) * sx))),
                min(self.height, int(math.ceil((ys.max() + 1) * sy))),
            ]
            counts[obj.cls] += 1
            kind_counts[obj.kind] += 1
            boxes.append(
                {
                    'class': obj.cls,
                    'kind': obj.kind,
                    'id': obj.index,
                    'visible': round(min(1.0, seen / total), 3),
                    'area': seen / (self.iw * self.ih),
                    'box': box,
                }
            )
        return GroundTruth(counts, kind_counts, boxes, index, self.environment)
