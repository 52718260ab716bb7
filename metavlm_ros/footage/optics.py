"""Water optics of synthetic scenes: per-environment attenuation and veiling light, floor materials, noise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ['OPTICS', 'Optics', 'add_rocks', 'fbm', 'floor_albedo', 'lowpass', 'smooth_noise']


@dataclass(frozen=True)
class Optics:
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


OPTICS = {
    'pool': Optics(
        (0.16, 0.05, 0.045), (150, 215, 228), (70, 165, 190), (0.93, 1.0, 1.0), 0.26, (0.9, 1.3), False,
        0.55, 0.15, 120, 0.05,
    ),
    'shallow': Optics(
        (0.42, 0.15, 0.16), (95, 170, 165), (25, 95, 100), (0.62, 0.9, 0.86), 0.3, (1.0, 1.6), False,
        0.3, 0.3, 320, 0.2,
    ),
    'deep': Optics(
        (0.34, 0.12, 0.09), (8, 30, 52), (3, 14, 30), (1.0, 0.97, 0.92), -0.2, (1.2, 1.7), True,
        0.0, 0.0, 900, 0.2,
    ),
}  # fmt: skip


@lru_cache(maxsize=32)
def lowpass(shape: tuple[int, int], scale: float) -> np.ndarray:
    fy = np.fft.fftfreq(shape[0])[:, None]
    fx = np.fft.rfftfreq(shape[1])[None, :]
    return np.exp(-(fx * fx + fy * fy) * (scale * scale * 8.0)).astype(np.float32)


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Tileable band-limited noise, zero mean, unit std; `scale` is the feature size in pixels."""
    from scipy import fft

    white = rng.standard_normal(shape, dtype=np.float32)
    # Gaussian low-pass in the Fourier domain keeps the result periodic, so it tiles seamlessly.
    field_ = fft.irfft2(fft.rfft2(white) * lowpass(tuple(shape), float(scale)), s=shape).astype(np.float32)
    field_ -= field_.mean()
    return field_ / (field_.std() + 1e-6)


def fbm(rng: np.random.Generator, shape: tuple[int, int], scales: tuple[float, ...]) -> np.ndarray:
    total = np.zeros(shape, np.float32)
    amp, norm = 1.0, 0.0
    for s in scales:
        total += amp * smooth_noise(rng, shape, s)
        norm += amp
        amp *= 0.55
    return total / norm


def floor_albedo(env: str, rng: np.random.Generator, size: int = 512) -> np.ndarray:
    """A tileable floor material (RGB float 0..255) in ground coordinates, 1 texel = 1 cm."""
    if env == 'pool':
        tile = 25  # 25 cm tiles with grout lines
        yy, xx = np.mgrid[0:size, 0:size]
        grout = ((xx % tile) < 2) | ((yy % tile) < 2)
        base = np.empty((size, size, 3), np.float32)
        base[:] = (205, 228, 236)
        jitter = smooth_noise(rng, (size, size), 40)[..., None] * 6
        base += jitter
        base[grout] = (150, 170, 180)
        # A dark lane line every 2.5 m, as in a real pool floor.
        lane = (xx % 250 > 110) & (xx % 250 < 140)
        base[lane & ~grout] = (40, 60, 110)
        return base
    n = fbm(rng, (size, size), (64, 24, 8, 3))
    if env == 'shallow':
        sand = np.array((200, 182, 140), np.float32)
        # Wave ripples: a wavy sinusoid across the floor, bent by large-scale noise.
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
        warp = smooth_noise(rng, (size, size), 90) * 9
        ripple = np.sin((yy + warp) * (2 * math.pi / 16.0)) * 0.5 + 0.5
        shade = 0.82 + 0.12 * ripple + 0.07 * n
        albedo = sand[None, None, :] * shade[..., None]
        albedo *= (1 + 0.08 * smooth_noise(rng, (size, size), 120))[..., None]  # patches of finer sand
        albedo = add_rocks(albedo, rng, 22, 1.8, (135, 128, 112), n)
        weed = np.clip((smooth_noise(rng, (size, size), 50) - 1.3) * 1.2, 0, 0.45)
        weed *= np.clip(0.6 + 0.8 * smooth_noise(rng, (size, size), 2.5), 0, 1.4)  # tufts, not flat paint
        return albedo * (1 - weed[..., None]) + np.array((95, 120, 70), np.float32) * weed[..., None]
    # Deep sea: silty grey-brown sediment with burrows, small rocks and pale patches.
    silt = np.array((150, 136, 112), np.float32)
    shade = 0.85 + 0.15 * n
    albedo = silt[None, None, :] * shade[..., None]
    spots = smooth_noise(rng, (size, size), 3)
    albedo[spots > 2.8] *= 0.6
    pale = np.clip((smooth_noise(rng, (size, size), 36) - 0.5) * 0.5, 0, 0.3)[..., None]
    albedo = albedo * (1 - pale) + np.array((170, 165, 150), np.float32) * pale
    return add_rocks(albedo, rng, 12, 2.0, (105, 98, 88), n)


def add_rocks(
    albedo: np.ndarray, rng: np.random.Generator, scale: float, level: float, colour: Any, n: np.ndarray
) -> np.ndarray:
    """Stones where a noise field exceeds `level`, lit from above (towards the far side of the floor)."""
    field_ = smooth_noise(rng, albedo.shape[:2], scale)
    mask = np.clip((field_ - level) * 3.0, 0, 1)
    # The slope of the field along the viewing direction shades the stones: lit tops, dark fronts.
    slope = np.roll(field_, -2, axis=0) - np.roll(field_, 2, axis=0)
    shade = np.clip(0.9 - 1.2 * slope, 0.45, 1.35) * (0.85 + 0.2 * n)
    stone = np.asarray(colour, np.float32) * shade[..., None]
    # Stones sit in a soft contact shadow on the sediment around them.
    halo = np.clip((field_ - level + 0.5) * 1.2, 0, 0.35)[..., None]
    out = albedo * (1 - halo * 0.6)
    return out * (1 - mask[..., None]) + stone * mask[..., None]
