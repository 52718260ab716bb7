"""Underwater relations (docs/method.md §12): turbidity, colour cast, motion blur, marine snow, low light."""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import check_frame

__all__ = [
    'UNDERWATER_EXTRAS',
    'UNDERWATER_FUNCTIONS',
    'UNDERWATER_PARAMETERS',
    'colour_cast',
    'linear_light',
    'linear_light_lut',
    'low_light',
    'marine_snow',
    'motion_blur',
    'srgb_bytes',
    'turbidity',
]

# Each relation's physical parameter: (name, unit, nominal, low, high, max_deviation), in the order
# a composition applies them (the physics of a capture: the water absorbs and scatters the scene's
# light, particles float between scene and camera, the camera moves during the exposure, and the
# sensor records what light is left). The nominal value is the identity (the frame comes back byte
# for byte) and the lower end of the range, so the normalisation of f_trans (Eq. 1) is the
# deviation over the range's width, in [0, 1] like Table 2's.
UNDERWATER_PARAMETERS: dict[str, tuple[str, str, float, float, float, float]] = {
    'colour_cast': ('depth', 'm', 0.0, 0.0, 10.0, 10.0),
    'turbidity': ('distance', 'm', 0.0, 0.0, 5.0, 5.0),
    'marine_snow': ('density', 'particles per frame', 0.0, 0.0, 600.0, 600.0),
    'motion_blur': ('length', 'fraction of the width', 0.0, 0.0, 0.01, 0.01),
    'low_light': ('stops', 'EV below the exposure of the frame', 0.0, 0.0, 3.0, 3.0),
}

# Secondary parameters a search varies with a relation's own, (name, unit, nominal, low, high) each.
# They are no part of f_trans: the blur's direction has no magnitude, and at length 0 every angle is
# the identity. A blur along a and along a + 180 degrees is the same, so [-90, 90] holds every
# direction of the camera's motion (0: sway or yaw, 90: heave or pitch).
UNDERWATER_EXTRAS: dict[str, tuple[tuple[str, str, float, float, float], ...]] = {
    'motion_blur': (('angle', 'degrees from the horizontal, counter-clockwise', 0.0, -90.0, 90.0),),
}

# Turbidity: beam attenuation of turbid coastal water by suspended particles, whose scattering is
# nearly the same at every wavelength (so it does not overlap the colour cast).
TURBIDITY_BETA = 0.3  # 1/m

# Colour cast: absorption of pure water at 650, 550 and 450 nm (Pope and Fry 1997), 1/m, for the
# red, green and blue channels: red is lost first.
WATER_ABSORPTION = (0.340, 0.0565, 0.0145)

# Low light: a sensor pixel's full well at the frame's white (electrons) and its read noise.
FULL_WELL = 1000.0
READ_NOISE = 3.0

# Marine snow: the particles' colour (lit by the vehicle's lamps, sRGB) and the frame width their
# sizes are given for; they scale with the frame so a working-size frame shows the same snow.
SNOW_COLOUR = (232, 238, 240)
SNOW_REFERENCE_WIDTH = 1920


def _check_value(relation: str, value: float) -> float:
    name, _, _, low, high, _ = UNDERWATER_PARAMETERS[relation]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f'{relation} {name} must be a number, got {value!r}') from None
    if not math.isfinite(number) or number < low:
        raise ParameterError(f'{relation} {name} must be a finite number >= {low:g}, got {value!r}')
    return number


def _seed(relation: str, height: int, width: int) -> int:
    """A seed fixed by the relation and the frame size: the same genotype always gives the same frame."""
    return zlib.crc32(f'metavlm_ros/{relation}/{height}x{width}'.encode())


# sRGB <-> linear light (IEC 61966-2-1): the models act on light, frames hold gamma-encoded values.
def _decode(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64) / 255.0
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def _encode(linear: np.ndarray) -> np.ndarray:
    lin = np.clip(np.asarray(linear, dtype=np.float64), 0.0, 1.0)
    v = np.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin ** (1 / 2.4) - 0.055)
    return np.round(v * 255.0).astype(np.uint8)


_TO_LINEAR = _decode(np.arange(256)).astype(np.float32)
# Linear light quantised to 16 bits -> sRGB byte: finer than one sRGB step even next to black.
_ENCODE_STEPS = 65535
_FROM_LINEAR = _encode(np.arange(_ENCODE_STEPS + 1) / _ENCODE_STEPS)


def _to_bytes(linear: np.ndarray) -> np.ndarray:
    """sRGB bytes of float linear light, through the 16-bit table (no power function per pixel)."""
    index = np.clip(linear, 0.0, 1.0) * _ENCODE_STEPS + 0.5
    return _FROM_LINEAR[index.astype(np.int32)]


def linear_light(frame: np.ndarray) -> np.ndarray:
    """A frame's sRGB bytes decoded to linear light (float32, the frame's shape)."""
    return _TO_LINEAR[frame]


def srgb_bytes(linear: np.ndarray) -> np.ndarray:
    """Linear light encoded to sRGB bytes through the 16-bit table: the byte of a value at most half a
    table step (1/131070 of linear light) away, so within 0.5 + 0.026 of the exact encoding (half a
    step times sRGB's steepest slope, 12.92 x 255 bytes per unit of linear light)."""
    return _to_bytes(linear)


def _mean_light(frame: np.ndarray) -> np.ndarray:
    """The frame's mean colour in linear light, from its channel histograms (no float copy of the frame)."""
    counts = np.stack([cv2.calcHist([frame], [c], None, [256], [0, 256]).reshape(-1) for c in range(3)])
    return counts.astype(np.float64) @ _TO_LINEAR.astype(np.float64) / counts[0].sum()


def _per_channel_lut(transmission: np.ndarray, veil: np.ndarray) -> np.ndarray:
    """The 256 x 3 byte table of I = J*t + B*(1 - t) in linear light, channel by channel."""
    scene = _TO_LINEAR.astype(np.float64)[:, None]
    return _encode(scene * transmission + veil * (1.0 - transmission)).reshape(1, 256, 3)


def linear_light_lut(gain: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The 1 x 256 x 3 byte table (for cv2.LUT) of I_c = J_c * gain_c + offset_c in linear light."""
    scene = _TO_LINEAR.astype(np.float64)[:, None]
    return _encode(scene * np.asarray(gain, dtype=np.float64) + np.asarray(offset, dtype=np.float64)).reshape(
        1, 256, 3
    )


def turbidity(frame: np.ndarray, distance: float) -> np.ndarray:
    """Turbid water between camera and scene: the underwater image formation model.

    I = J * t + B * (1 - t) in linear light, t = exp(-beta * d), with beta = TURBIDITY_BETA (the same
    for every channel: scattering by suspended particles). The veiling light B is the frame's mean
    colour in linear light, an estimate of the light the water itself scatters (a fixed colour would
    lay bright shallow water over a dark deep-sea frame). The scene appears `distance` metres
    farther away through turbid water; 0 is the identity.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when the distance is negative or not finite.
    """
    frame = check_frame(frame)
    distance = _check_value('turbidity', distance)
    if distance == 0.0:
        return frame.copy()
    t = np.full(3, math.exp(-TURBIDITY_BETA * distance))
    return cv2.LUT(frame, _per_channel_lut(t, _mean_light(frame)))


def colour_cast(frame: np.ndarray, depth: float) -> np.ndarray:
    """Wavelength-dependent absorption along `depth` metres of extra water: red is lost first.

    I_c = J_c * exp(-a_c * depth) in linear light, a_c = WATER_ABSORPTION (pure water at 650, 550 and
    450 nm for red, green, blue). No veiling light: that is turbidity's. 0 is the identity.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when the depth is negative or not finite.
    """
    frame = check_frame(frame)
    depth = _check_value('colour_cast', depth)
    if depth == 0.0:
        return frame.copy()
    t = np.exp(-np.asarray(WATER_ABSORPTION) * depth)
    return cv2.LUT(frame, _per_channel_lut(t, np.zeros(3)))


def _line_kernel(length: float, angle: float) -> tuple[np.ndarray, tuple[int, int]]:
    """A normalised kernel of a straight path `length` pixels long at `angle` degrees, and its anchor.

    Points every 1/8 pixel along the path are splatted bilinearly, so lengths below a pixel and any
    angle give a smooth, centred kernel; rows and columns it does not reach are cropped.
    """
    theta = math.radians(angle)
    half = length / 2.0
    steps = max(2, int(math.ceil(length * 8)) + 1)
    s = np.linspace(-half, half, steps)
    # Image rows grow downwards: a positive angle turns the path counter-clockwise on screen.
    xs, ys = s * math.cos(theta), -s * math.sin(theta)
    radius = int(math.ceil(half)) + 1
    size = 2 * radius + 1
    kernel = np.zeros((size, size), np.float64)
    x0, y0 = np.floor(xs), np.floor(ys)
    fx, fy = xs - x0, ys - y0
    col, row = x0.astype(int) + radius, y0.astype(int) + radius
    np.add.at(kernel, (row, col), (1 - fx) * (1 - fy))
    np.add.at(kernel, (row, col + 1), fx * (1 - fy))
    np.add.at(kernel, (row + 1, col), (1 - fx) * fy)
    np.add.at(kernel, (row + 1, col + 1), fx * fy)
    kernel[kernel < 1e-12] = 0.0
    rows, cols = np.flatnonzero(kernel.any(axis=1)), np.flatnonzero(kernel.any(axis=0))
    kernel = kernel[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    anchor = (radius - int(cols[0]), radius - int(rows[0]))
    return (kernel / kernel.sum()).astype(np.float32), anchor


def motion_blur(frame: np.ndarray, length: float, angle: float = 0.0) -> np.ndarray:
    """Linear motion blur: the camera moved `length` (a fraction of the frame width) during the exposure.

    The frame is averaged along a straight path centred on each pixel, at `angle` degrees from the
    horizontal (counter-clockwise; 0 is sway or yaw, 90 heave or pitch). The length is a fraction of
    the width so a frame searched at working size blurs as its full-size original would; 0 is the
    identity.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when the length is negative or either value is not finite.
    """
    frame = check_frame(frame)
    length = _check_value('motion_blur', length)
    if not math.isfinite(float(angle)):
        raise ParameterError(f'motion_blur angle must be a finite number, got {angle!r}')
    if length == 0.0:
        return frame.copy()
    kernel, anchor = _line_kernel(length * frame.shape[1], float(angle))
    return cv2.filter2D(frame, -1, kernel, anchor=anchor, borderType=cv2.BORDER_REFLECT_101)


_SNOW_LIGHT = _decode(np.array(SNOW_COLOUR)).astype(np.float32)


@lru_cache(maxsize=8)
def _snow_particles(height: int, width: int) -> np.ndarray:
    """The particles of a frame size, as rows (x, y, sigma, peak), in the order density adds them.

    Drawn once per size from a fixed seed; a higher density keeps every particle of a lower one and
    adds more, so the frame only ever gains snow as the density rises.
    """
    rng = np.random.default_rng(_seed('marine_snow', height, width))
    n = int(UNDERWATER_PARAMETERS['marine_snow'][4])
    scale = width / SNOW_REFERENCE_WIDTH
    x = rng.random(n) * width - 0.5
    y = rng.random(n) * height - 0.5
    # Mostly small flakes in focus, a few large, dim, defocused ones (sizes for a 1080p frame).
    u = rng.random(n)
    sigma = (1.5 + 6.0 * u**3) * scale
    peak = (1.0 - 0.4 * u) * (0.6 + 0.4 * rng.random(n))
    particles = np.column_stack((x, y, sigma, peak))
    particles.setflags(write=False)
    return particles


def _snow_alpha(particles: np.ndarray, height: int, width: int) -> np.ndarray:
    """How much snow covers each pixel: the largest Gaussian spot over it, 0 where none reaches.

    Spots below half a pixel are drawn at half a pixel with their light kept (peak times area), so
    a working-size frame holds as much snow light as its full-size original.
    """
    x, y, sigma, peak = particles.T
    drawn = np.maximum(sigma, 0.5)
    strength = (peak * (sigma / drawn) ** 2).astype(np.float32)
    radius = np.ceil(3 * drawn).astype(int)
    pad = int(radius.max())
    alpha = np.zeros((height + 2 * pad, width + 2 * pad), np.float32)
    # Spots of one radius at a time, all at once: np.maximum.at keeps the largest where they overlap.
    for r in np.unique(radius):
        which = radius == r
        offsets = np.arange(-r, r + 1)
        cx, cy = np.round(x[which]).astype(int), np.round(y[which]).astype(int)
        two_var = (2 * drawn[which] ** 2)[:, None]
        gx = np.exp(-(((cx[:, None] + offsets) - x[which][:, None]) ** 2) / two_var).astype(np.float32)
        gy = np.exp(-(((cy[:, None] + offsets) - y[which][:, None]) ** 2) / two_var).astype(np.float32)
        spots = strength[which][:, None, None] * gy[:, :, None] * gx[:, None, :]
        rows = (cy[:, None] + offsets + pad)[:, :, None]
        cols = (cx[:, None] + offsets + pad)[:, None, :]
        np.maximum.at(alpha, (rows, cols), spots)
    alpha = alpha[pad : pad + height, pad : pad + width]
    # Below half a grey level of cover a spot changes no byte: leave those pixels alone.
    alpha[alpha < 0.5 / 255] = 0.0
    return alpha


def marine_snow(frame: np.ndarray, density: float) -> np.ndarray:
    """Marine snow: `density` small bright particles in the frame, lit by the vehicle's lamps.

    Each particle is a Gaussian spot that covers the scene behind it with SNOW_COLOUR in linear light:
    I = J * (1 - a) + C * a, `a` the largest spot over the pixel. Positions, sizes and brightness come
    from a seed fixed by the frame size; the first round(density) particles are shown. 0 is the
    identity.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when the density is negative or not finite.
    """
    frame = check_frame(frame)
    count = int(round(_check_value('marine_snow', density)))
    if count == 0:
        return frame.copy()
    height, width = frame.shape[:2]
    particles = _snow_particles(height, width)
    if count > len(particles):
        high = UNDERWATER_PARAMETERS['marine_snow'][4]
        raise ParameterError(f'marine_snow density must be at most {high:g}, got {density!r}')
    alpha = _snow_alpha(particles[:count], height, width)
    rows, cols = np.nonzero(alpha)
    a = alpha[rows, cols][:, None]
    scene = _TO_LINEAR[frame[rows, cols]]
    out = frame.copy()
    out[rows, cols] = _to_bytes(scene * (1.0 - a) + _SNOW_LIGHT * a)
    return out


@lru_cache(maxsize=4)
def _sensor_noise(height: int, width: int) -> np.ndarray:
    """A standard normal field per frame size from a fixed seed (read-only, shared by every call)."""
    rng = np.random.default_rng(_seed('low_light', height, width))
    field = rng.standard_normal((height, width, 3), dtype=np.float32)
    field.setflags(write=False)
    return field


def low_light(frame: np.ndarray, stops: float) -> np.ndarray:
    """Less light by `stops` EV, with the photon and read noise a sensor adds when it gets less light.

    In linear light, the signal is scaled by k = 2**-stops: a fraction k of the photons arrives
    (binomial thinning of a full well of FULL_WELL electrons at white), which adds noise of variance
    k(1-k)L/N; the read noise (READ_NOISE electrons) no longer shrinks with the signal, which adds
    (1-k^2)(sigma_r/N)^2. Both vanish at 0 stops, the identity. The noise field is seeded by the
    frame size, so the same genotype always gives the same frame.

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when the stops are negative or not finite.
    """
    frame = check_frame(frame)
    stops = _check_value('low_light', stops)
    if stops == 0.0:
        return frame.copy()
    k = np.float32(2.0**-stops)
    light = _TO_LINEAR[frame]
    shot, read = k * (1 - k) / FULL_WELL, (1 - k * k) * (READ_NOISE / FULL_WELL) ** 2
    variance = light * np.float32(shot) + np.float32(read)
    light *= k
    light += np.sqrt(variance) * _sensor_noise(*frame.shape[:2])
    return _to_bytes(light)


# Each relation's function, in UNDERWATER_PARAMETERS' order: what the relation registry applies.
UNDERWATER_FUNCTIONS = {
    'colour_cast': colour_cast,
    'turbidity': turbidity,
    'marine_snow': marine_snow,
    'motion_blur': motion_blur,
    'low_light': low_light,
}
