"""MR12 `water` over a frame whose range to the scene is known per pixel (docs/underwater.md).

Where footage carries a range map (the project's scenes do: `metavlm scenes --format png` writes one
beside each frame), the relation needs no prior: each pixel's scene lies at its own range r0, and the
camera recedes as the priors have it, every range growing by the same factor. The relation's value
z is the range added at the frame's centre (range r_c there), so pixel (x, y) gets

    z_xy = z * g_xy,   g_xy = r0_xy / r_c   (capped at RANGE_GROWTH_MAX, as the seabed prior's rows)

and its coefficients are those of z_xy: I_c = J_c G_c exp(-beta_D_c z_xy) + B_inf_c (1 - exp(-beta_B_c
z_xy)), the lamps' gain G from r0_xy to r0_xy + z_xy. A constant map is the constant prior with
`scene_range` r_c; a map of a flat seabed is the seabed prior. Pixels with no surface (open water,
infinite range) get the cap; pixels whose range is unknown (NaN: the border a warp fills) get the
centre's growth.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError
from metavlm_ros.method.underwater import linear_light, srgb_bytes
from metavlm_ros.method.water import lamp_transmission, path_coefficients

__all__ = [
    'WATER_RANGES',
    'centre_range',
    'check_ranges',
    'range_growths',
    'warp_ranges',
    'water_over_ranges',
]

# Where MR12 takes each pixel's range from: its priors (the extras), or the frame's own range map.
WATER_RANGES = ('prior', 'truth')


def check_ranges(ranges: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """A range map as float64 (H, W) matching the frame's size.

    Raises:
        InputError: a map of another shape than the frame's.
    """
    ranges = np.asarray(ranges, dtype=np.float64)
    if ranges.shape != frame.shape[:2]:
        raise InputError(
            f'the range map is {ranges.shape[1] if ranges.ndim > 1 else "?"}x{ranges.shape[0]}, '
            f'the frame {frame.shape[1]}x{frame.shape[0]}'
        )
    return ranges


def centre_range(ranges: np.ndarray) -> float | None:
    """The range r_c at the frame's centre pixel; where that is not a surface, the median of the
    frame's surfaces; None where the frame shows none (all open water or unknown)."""
    height, width = ranges.shape
    centre = float(ranges[(height - 1) // 2, (width - 1) // 2])
    if math.isfinite(centre) and centre > 0.0:
        return centre
    surfaces = ranges[np.isfinite(ranges) & (ranges > 0.0)]
    return float(np.median(surfaces)) if surfaces.size else None


def range_growths(ranges: np.ndarray, centre: float | None, cap: float) -> np.ndarray:
    """Each pixel's range over the centre's, g = r0 / r_c, in (0, cap]: `cap` where there is no surface
    (infinite range) or no centre, 1 where the range is unknown (NaN or not positive)."""
    if centre is None:
        return np.full(ranges.shape, cap)
    with np.errstate(invalid='ignore', divide='ignore'):
        growth = ranges / centre
    growth = np.where(np.isposinf(ranges), cap, growth)
    growth = np.where(np.isfinite(growth) & (ranges > 0.0), growth, 1.0)
    return np.minimum(growth, cap)


def warp_ranges(ranges: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """A range map moved by the 2x3 matrix that moved its frame's pixels: nearest neighbour (ranges are
    not blended across an object's edge), NaN (unknown) where the warp brings in the border."""
    height, width = ranges.shape
    return cv2.warpAffine(
        np.asarray(ranges, dtype=np.float32),
        np.asarray(matrix, dtype=np.float64),
        (width, height),
        flags=cv2.INTER_NEAREST,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=float('nan'),
    )


def water_over_ranges(
    frame: np.ndarray,
    distance: float,
    water_type: float,
    depth: float,
    lamp_power: float,
    cone: np.ndarray,
    ranges: np.ndarray,
    cap: float,
) -> np.ndarray:
    """The follow-up of MR12 at `distance` metres over a checked frame and its range map (module doc).

    Coefficients are computed once per distinct growth of the map (a map read from a PNG holds
    millimetres: a few thousand values), then looked up per pixel.

    Args:
        cone: the lamps' beam over the frame (H, W, 1), used only when `lamp_power` > 0.
        ranges: metres from the camera to the scene per pixel, (H, W): inf for open water, NaN unknown.
        cap: the largest growth (RANGE_GROWTH_MAX).
    """
    ranges = check_ranges(ranges, frame)
    centre = centre_range(ranges)
    growth = range_growths(ranges, centre, cap)
    values, where = np.unique(growth, return_inverse=True)
    where = where.reshape(growth.shape)
    transmission, veil, ambient_white = path_coefficients(water_type, depth, distance * values)
    gain = transmission.astype(np.float32)[where]  # (H, W, 3)
    if lamp_power > 0.0 and centre is not None:
        near = centre * values
        far = near + distance * values
        lit_near = (lamp_transmission(water_type, near) / near[:, None] ** 2).astype(np.float32)
        lit_far = (lamp_transmission(water_type, far) / far[:, None] ** 2).astype(np.float32)
        beam = np.float32(lamp_power) * np.asarray(cone, dtype=np.float32).reshape(*growth.shape, 1)
        ambient = np.asarray(ambient_white, dtype=np.float32)
        gain *= (ambient + beam * lit_far[where]) / (ambient + beam * lit_near[where])
    light = linear_light(frame)
    light *= gain
    light += veil.astype(np.float32)[where]
    return srgb_bytes(light)
