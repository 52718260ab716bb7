"""MR12 `water` over a scene (docs/underwater.md): water added along each row's range, and the lamps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.extra import Extra
from metavlm_ros.method.underwater import linear_light, linear_light_lut, srgb_bytes
from metavlm_ros.method.water import (
    WATER_TYPES,
    channel_coefficients,
    lamp_transmission,
    path_coefficients,
    water_index,
    water_type_name,
)
from metavlm_ros.method.water_ranges import water_over_ranges

__all__ = [
    'LAMP_HALF_ANGLE',
    'RANGE_GROWTH_MAX',
    'WATER_EXTRAS',
    'WATER_FUNCTIONS',
    'WATER_PARAMETERS',
    'WATER_PHRASES',
    'describe_waters',
    'lamp_cone',
    'lamp_gain',
    'range_growth',
    'water',
]

# The lamps' beam: half its power at this many degrees off its axis, the axis the camera's (a 70-degree
# beam, a width typical of subsea LED floodlights: an assumed constant, docs/underwater.md).
LAMP_HALF_ANGLE = 35.0
# A seabed row's range is at most this many times the centre's: rays at or above the horizon never
# meet the plane (they see open water, which a long path gives as the veiling light whatever its
# length), and the cap only changes the rows next to the horizon.
RANGE_GROWTH_MAX = 10.0

_INDEX_UNIT = 'Jerlov water index: ' + ', '.join(f'{i} {name}' for i, name in enumerate(WATER_TYPES))

# The relation: (name, unit, nominal, low, high, max_deviation) as in UNDERWATER_PARAMETERS.
WATER_PARAMETERS: dict[str, tuple[str, str, float, float, float, float]] = {
    'water': ('range', 'metres of water added between camera and scene', 0.0, 0.0, 10.0, 10.0),
}
# Its extras: the water (searched over their ranges), then what the user states about the footage
# (priors, held at their nominal values unless given a range): the lamps, and the range prior.
WATER_EXTRAS: dict[str, tuple[Extra, ...]] = {
    'water': (
        Extra('type', _INDEX_UNIT, 0.0, 0.0, float(len(WATER_TYPES) - 1), parse=water_index,
              label=water_type_name, step=1.0),
        Extra('depth', 'metres below the surface', 0.0, 0.0, 40.0),
        Extra('lamp_power', "the lamps' light on the scene 1 m away on their axis, without water, in units "
              "of the daylight's at depth; 0: no lamps", 0.0, 0.0, 100.0, prior=True),
        Extra('scene_range', "metres from the camera to the scene at the frame's centre, for the lamps' "
              'fall-off', 2.0, 0.3, 20.0, prior=True),
        Extra('tilt', 'degrees the camera looks down at a flat seabed; 0: the same range over the frame',
              0.0, 0.0, 90.0, prior=True),
        Extra('fov', "the camera's vertical field of view, degrees", 60.0, 10.0, 150.0, prior=True),
    ),
}  # fmt: skip


def _focal(height: int, fov: float) -> float:
    """The focal length in pixels of a pinhole camera `height` pixels tall seeing `fov` degrees."""
    return (height / 2.0) / math.tan(math.radians(fov) / 2.0)


def range_growth(height: int, tilt: float, fov: float) -> np.ndarray:
    """Each row's range over the centre's: 1 at tilt 0 (the range prior 'constant'), else a seabed plane.

    A camera looking `tilt` degrees below the horizontal at a flat seabed h metres below it sees the
    centre at h / sin(tilt); row y's ray leaves the optical axis by a = atan((y - (H-1)/2) / f)
    (downwards positive, f from the vertical field of view), so it meets the plane at h / sin(tilt + a):
    the range grows by sin(tilt) / sin(tilt + a) toward the top of the frame, without bound at the
    horizon (RANGE_GROWTH_MAX caps it). Measured along the frame's vertical centre line: the rays to
    the left and right of it are longer by sqrt(1 + x^2 / (1 + y^2)) in focal units (up to 1.26 at the
    side edges of a 4:3 frame with a 60-degree vertical field), which is left out.

    Returns:
        (H,) growths, or (1,) at tilt 0.
    """
    if tilt == 0.0:
        return np.ones(1)
    rows = (np.arange(height, dtype=np.float64) - (height - 1) / 2.0) / _focal(height, fov)
    below = math.radians(tilt) + np.arctan(rows)
    with np.errstate(divide='ignore'):
        growth = np.where(
            below > 0.0, math.sin(math.radians(tilt)) / np.sin(np.maximum(below, 1e-12)), np.inf
        )
    return np.minimum(growth, RANGE_GROWTH_MAX)


def lamp_cone(height: int, width: int, fov: float) -> np.ndarray:
    """The lamps' beam over the frame, 1 on the optical axis: exp(-ln 2 (theta / LAMP_HALF_ANGLE)^2), theta
    each pixel's angle off the axis (pinhole camera, focal length from the vertical field of view)."""
    f = _focal(height, fov)
    x = (np.arange(width, dtype=np.float64) - (width - 1) / 2.0) / f
    y = (np.arange(height, dtype=np.float64) - (height - 1) / 2.0) / f
    theta = np.arctan(np.hypot(x[None, :], y[:, None]))
    return np.exp(-math.log(2.0) * (theta / math.radians(LAMP_HALF_ANGLE)) ** 2)


@lru_cache(maxsize=8)
def _beam(height: int, width: int, fov: float) -> np.ndarray:
    """`lamp_cone` as float32, (H, W, 1), read-only and kept per frame size (a search asks it again)."""
    cone = lamp_cone(height, width, fov).astype(np.float32)[:, :, None]
    cone.setflags(write=False)
    return cone


def lamp_gain(
    water_type: float,
    lamp_power: float,
    ambient_white: np.ndarray,
    cone: np.ndarray,
    near: np.ndarray,
    far: np.ndarray,
) -> np.ndarray:
    """How the scene's light changes, per pixel and channel, when it moves from range `near` to `far`
    under the lamps: (A_c + L_c(far)) / (A_c + L_c(near)), (H, W, 3) float32.

    A_c is the daylight at depth on a white face (green 1; `path_coefficients`' ambient white),
    L_c(r) = lamp_power * cone * W_c(r) / r^2 the lamps' on it at range r: inverse-square fall-off
    times what r metres of water leave of their light (`lamp_transmission`). `cone` is the beam over
    the frame, (H, W) or (H, W, 1); `near` and `far` are each row's ranges, (H,) or (1,).
    """
    near, far = np.asarray(near, dtype=np.float64), np.asarray(far, dtype=np.float64)
    lit_near = (lamp_transmission(water_type, near) / near[:, None] ** 2)[:, None, :].astype(np.float32)
    lit_far = (lamp_transmission(water_type, far) / far[:, None] ** 2)[:, None, :].astype(np.float32)
    beam = np.float32(lamp_power) * np.asarray(cone, dtype=np.float32).reshape(
        cone.shape[0], cone.shape[1], 1
    )
    ambient = np.asarray(ambient_white, dtype=np.float32)
    gain = beam * lit_far
    gain += ambient
    below = beam * lit_near
    below += ambient
    gain /= below
    return gain


def _number(what: str, value: float, low: float, high: float, *, open_low: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f'water {what} must be a number, got {value!r}') from None
    below = number <= low if open_low else number < low
    if not math.isfinite(number) or below or number > high:
        raise ParameterError(f'water {what} {value!r} is outside [{low:g}, {high:g}]')
    return number


def water(
    frame: np.ndarray,
    distance: float,
    water_type: float = 0.0,
    depth: float = 0.0,
    lamp_power: float = 0.0,
    scene_range: float = 2.0,
    tilt: float = 0.0,
    fov: float = 60.0,
    *,
    ranges: np.ndarray | None = None,
) -> np.ndarray:
    """The scene `distance` metres farther away (at the frame's centre) through water of a Jerlov type.

    I_c = J_c G_c exp(-beta_D_c z) + B_inf_c (1 - exp(-beta_B_c z)) in linear light, channel by channel,
    with the coefficients of `method/water.py` at each row's added range z = distance *
    `range_growth(tilt)` (the same z over the frame at tilt 0) and the lamps' gain G = `lamp_gain`
    from each row's range r0 = scene_range * growth to r0 + z (G = 1 without lamps). 0 metres is the
    identity at every type, depth, lamp and prior; without lamps and at tilt 0 it is the byte table of
    the revised image formation model it always was.

    With `ranges`, the frame's own range to the scene per pixel (metres, (H, W): inf where open water
    is seen, NaN unknown), the priors give way to it: the camera moves `distance` metres back along its
    axis and each pixel's path gains what its own point's range gains (`method/water_ranges.py`);
    `scene_range` and `tilt` are not used.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: for a value outside its range or an unknown type.
    """
    frame = check_frame(frame)
    try:
        distance, depth = float(distance), float(depth)
    except (TypeError, ValueError):
        raise ParameterError(f'water range and depth must be numbers, got {distance!r}, {depth!r}') from None
    lamp_power = _number('lamp_power', lamp_power, 0.0, math.inf)
    scene_range = _number('scene_range', scene_range, 0.0, math.inf, open_low=True)
    tilt = _number('tilt', tilt, 0.0, 90.0)
    fov = _number('fov', fov, 0.0, 179.0, open_low=True)
    coefficients = channel_coefficients(water_type, depth, distance)
    if distance == 0.0:
        return frame.copy()
    if ranges is not None:
        height, width = frame.shape[:2]
        cone = _beam(height, width, fov) if lamp_power > 0.0 else None
        return water_over_ranges(frame, distance, water_type, depth, lamp_power, fov, ranges, cone)
    if lamp_power == 0.0 and tilt == 0.0:
        return cv2.LUT(frame, linear_light_lut(coefficients.transmission, coefficients.veil))
    height, width = frame.shape[:2]
    growth = range_growth(height, tilt, fov)
    transmission, veil, ambient_white = path_coefficients(water_type, depth, distance * growth)
    gain = transmission[:, None, :]
    if lamp_power > 0.0:
        near = scene_range * growth
        lamps = lamp_gain(
            water_type, lamp_power, ambient_white, _beam(height, width, fov), near, near + distance * growth
        )
        lamps *= gain.astype(np.float32)
        gain = lamps
    light = linear_light(frame)
    light *= gain.astype(np.float32)
    light += veil[:, None, :].astype(np.float32)
    return srgb_bytes(light)


def describe_waters(ranges: Mapping[str, tuple[float, float]]) -> str:
    """A region of MR12 in words, from its ranges by id ('water', 'water_type', ...; those missing at
    their nominal values): 'Jerlov II to 5C, up to 4 m, 0-40 m deep', then the lamps and the seabed
    prior where stated ('lamps 5 (scene 1.5 m away)', 'seabed 30 degrees below, 60-degree field')."""

    def pair(key: str, nominal: float) -> tuple[float, float]:
        lo, hi = ranges.get(key, (nominal, nominal))
        return float(lo), float(hi)

    def span(lo: float, hi: float, unit: str = '') -> str:
        return f'{lo:g}{unit}' if lo == hi else f'{lo:g}-{hi:g}{unit}'

    lo, hi = pair('water_type', 0.0)
    parts = [f'Jerlov {water_type_name(lo)}' + ('' if lo == hi else f' to {water_type_name(hi)}')]
    if 'water' in ranges:
        near, far = pair('water', 0.0)
        parts.append(f'up to {far:g} m' if near == 0.0 else f'{span(near, far)} m')
    deep = pair('water_depth', 0.0)
    parts.append('at the surface' if deep == (0.0, 0.0) else f'{span(*deep)} m deep')
    lamps = pair('water_lamp_power', 0.0)
    if lamps != (0.0, 0.0):
        parts.append(f'lamps {span(*lamps)} (scene {span(*pair("water_scene_range", 2.0))} m away)')
    tilt = pair('water_tilt', 0.0)
    if tilt != (0.0, 0.0):
        parts.append(f'seabed {span(*tilt)} degrees below, {span(*pair("water_fov", 60.0))}-degree field')
    return ', '.join(parts)


# The relation's function and phrase: what the relation registry applies and how a region reads.
WATER_FUNCTIONS = {'water': water}
WATER_PHRASES = {'water': describe_waters}
