"""The water's effects on a scene: caustics, light rays, marine snow and turbidity, frame by frame."""

from __future__ import annotations

import math

import cv2
import numpy as np

from metavlm_ros.footage.optics import fbm, smooth_noise

__all__ = ['SceneEffects']


class SceneEffects:
    """What the water adds to a SceneGenerator's frames (a part of it, apart from the scene itself):
    built once per scene (`_build_effects`), drawn on every frame."""

    def _build_effects(self, rng: np.random.Generator) -> None:
        o, iw, ih = self.optics, self.iw, self.ih
        cw, ch = max(8, iw // 2), max(8, ih // 2)
        self.cw, self.ch = cw, ch
        # Caustics: ridges of two drifting noise fields projected on the floor (sampled at half size).
        self.caustic_a = smooth_noise(rng, (256, 256), 18)
        self.caustic_b = smooth_noise(rng, (256, 256), 26)
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
        self.turbid = (fbm(rng, (128, 128), (40, 14)) * 0.5 + 0.5).astype(np.float32)
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
        self.texture = (1.0 + 0.07 * smooth_noise(rng, (128, 128), 5)).astype(np.float32)

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
