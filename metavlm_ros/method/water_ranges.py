"""MR12 `water` over a frame whose range to the scene is known per pixel (docs/underwater.md).

Where footage carries a range map (the project's scenes do: `metavlm scenes` writes one with each
frame), the relation needs no prior on how the added water spreads: the camera moves z metres back
along its optical axis and every pixel keeps showing its own scene point, r0 metres away along a ray
theta off the axis. Its new range is |r0 u + z a| (u the ray, a the axis, u.a = cos theta), so the
water the pixel's path gains is

    dz = sqrt(r0^2 + z^2 + 2 r0 z cos theta) - r0,

z on the axis whatever the range, between z cos theta and z elsewhere (z cos theta for a point at
infinity: open water), and its coefficients are those of dz: I_c = J_c G_c exp(-beta_D_c dz) +
B_inf_c (1 - exp(-beta_B_c dz)), the lamps' gain G from r0 to r0 + dz (the lamps move with the
camera). A pixel whose range is unknown (NaN: the border a warp brings in) counts as open water.
Like the priors, the relation keeps every pixel where it is: the image-plane motion of moving back
is no part of it.
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
    'added_ranges',
    'check_ranges',
    'cos_off_axis',
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


def cos_off_axis(height: int, width: int, fov: float) -> np.ndarray:
    """cos theta of every pixel's ray, (H, W): a pinhole camera whose vertical field of view is `fov`."""
    f = (height / 2.0) / math.tan(math.radians(fov) / 2.0)
    x = (np.arange(width, dtype=np.float64) - (width - 1) / 2.0) / f
    y = (np.arange(height, dtype=np.float64) - (height - 1) / 2.0) / f
    return 1.0 / np.sqrt(1.0 + x[None, :] ** 2 + y[:, None] ** 2)


def added_ranges(ranges: np.ndarray, distance: float, cos_theta: np.ndarray) -> np.ndarray:
    """The water each pixel's path gains when the camera moves `distance` metres back along its axis:
    sqrt(r0^2 + z^2 + 2 r0 z cos theta) - r0 (written without the cancellation), z cos theta where r0
    is infinite or unknown."""
    z = float(distance)
    r = np.asarray(ranges, dtype=np.float64)
    surface = np.isfinite(r) & (r > 0.0)
    r = np.where(surface, r, 0.0)
    grown = z * z + 2.0 * r * z * cos_theta
    return np.where(surface, grown / (np.sqrt(r * r + grown) + r), z * cos_theta)


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
    fov: float,
    ranges: np.ndarray,
    cone: np.ndarray | None = None,
) -> np.ndarray:
    """The follow-up of MR12 at `distance` metres over a checked frame and its range map (module doc).

    Coefficients are computed once per distinct added range, rounded to 0.1 mm (far below what a byte
    of the frame can show), and looked up per pixel.

    Args:
        ranges: metres from the camera to the scene per pixel, (H, W): inf for open water, NaN unknown.
        cone: the lamps' beam over the frame (H, W) or (H, W, 1), used only when `lamp_power` > 0.
    """
    ranges = check_ranges(ranges, frame)
    height, width = ranges.shape
    added = added_ranges(ranges, distance, cos_off_axis(height, width, fov))
    values, where = np.unique(np.round(added, 4), return_inverse=True)
    where = where.reshape(added.shape)
    transmission, veil, ambient_white = path_coefficients(water_type, depth, values)
    gain = transmission.astype(np.float32)[where]  # (H, W, 3)
    surface = np.isfinite(ranges) & (ranges > 0.0)
    if lamp_power > 0.0 and cone is not None and surface.any():
        near = ranges[surface]
        far = near + values[where[surface]]
        lit_near = lamp_transmission(water_type, near) / near[:, None] ** 2
        lit_far = lamp_transmission(water_type, far) / far[:, None] ** 2
        beam = lamp_power * np.asarray(cone, dtype=np.float64).reshape(height, width)[surface][:, None]
        ambient = np.asarray(ambient_white, dtype=np.float64)
        gain[surface] *= ((ambient + beam * lit_far) / (ambient + beam * lit_near)).astype(np.float32)
    light = linear_light(frame)
    light *= gain
    light += veil.astype(np.float32)[where]
    return srgb_bytes(light)
