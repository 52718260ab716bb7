"""Procedural SeaClear-like underwater footage with per-frame ground truth (counts and boxes)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.footage.effects import SceneEffects
from metavlm_ros.footage.optics import OPTICS, floor_albedo, smooth_noise
from metavlm_ros.footage.sprites import SPRITES, Pen, random_params
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


# ---------------------------------------------------------------------------------------------


class SceneGenerator(SceneEffects):
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
        self.optics = OPTICS[environment]
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
        albedo = floor_albedo(self.environment, rng)
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
            detail = smooth_noise(rng, (256, 256), 1.0)
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
            if SPRITES[kind].pose == 'upright':
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
            params = random_params(kind, rng)
            if kind == 'fish' and velocity[0] < 0:
                params['flip'] = True
            objects.append(_Object(index, kind, X, d, Y, angle, params, velocity))
        self.objects = objects

    # -- per-frame rendering ------------------------------------------------------------------------

    def _camera(self, t: float) -> tuple[float, float, float]:
        p, ph = self.periods, self.phases
        yaw = self.yaw_amp * math.sin(2 * math.pi * t / p[0] + ph[0])
        drift = self.drift_amp * math.sin(2 * math.pi * t / p[1] + ph[1])
        bob = self.bob_amp * math.sin(2 * math.pi * t / p[2] + ph[2])
        return yaw, drift, bob

    def camera_maps(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(map_x, map_y) for cv2.remap: the point of the panorama (`background`, `surface_d`) each
        internal pixel of frame `index` sees through the moving camera."""
        yaw, drift, bob = self._camera(index / self.fps)
        return self.base_x + (self.mx + yaw + drift * self.k_rows)[:, None], self.base_y + (self.my - bob)

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
        map_x, map_y = self.camera_maps(index)
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
        ext = SPRITES[obj.kind].extent * size * s * (1.6 if SPRITES[obj.kind].pose == 'upright' else 1.0)
        half = int(math.ceil(ext)) + 3
        x0, y0 = int(math.floor(u)) - half, int(math.floor(v)) - half
        if SPRITES[obj.kind].pose == 'upright':
            y0 = int(math.floor(v)) - 2 * half + 6
        w = h = 2 * half
        if x0 >= self.iw or y0 >= self.ih or x0 + w <= 0 or y0 + h <= 0 or half < 2:
            return None
        # Things on the floor are foreshortened: the camera sees them at a grazing angle.
        squash = 1.0
        if SPRITES[obj.kind].pose == 'lying' and obj.Y == 0.0:
            squash = max(0.25, math.sin(math.atan2(self.cam_h, d)) * 1.2)
        angle = obj.angle
        pen = Pen(w, h, u - x0, v - y0, s, angle, squash)
        pen.flip = bool(obj.params.get('flip'))
        SPRITES[obj.kind].draw(pen, obj.params, t)
        # Forward scattering softens edges more with distance; it also takes the cut-out look off shapes.
        sigma = (0.3 + 0.14 * d) * self.iw / 960
        if sigma >= 0.3:
            pen.rgb = cv2.GaussianBlur(pen.rgb, (0, 0), sigma)
            pen.alpha = cv2.GaussianBlur(pen.alpha, (0, 0), sigma)
        total = int(np.count_nonzero(pen.alpha >= 128))
        if total == 0:
            return None
        if obj.Y == 0.0 and SPRITES[obj.kind].pose != 'swimmer':
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
