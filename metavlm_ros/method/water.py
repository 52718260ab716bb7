"""Water as optics describes it (docs/underwater.md): Jerlov's types and the revised image formation model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from metavlm_ros.common.errors import ParameterError

__all__ = [
    'BACKSCATTER_RATIO',
    'CAMERA_PEAKS',
    'CAMERA_WIDTH',
    'DAYLIGHT',
    'FACE_IRRADIANCE_RATIO',
    'WATER_TYPES',
    'WAVELENGTHS',
    'ChannelCoefficients',
    'WaterOptics',
    'camera_response',
    'channel_coefficients',
    'lamp_transmission',
    'path_coefficients',
    'water_index',
    'water_optics',
    'water_type_name',
]

# The tables' wavelengths, nm: Solonenko and Mobley (2015) tabulate every 25 nm.
WAVELENGTHS = np.arange(400.0, 701.0, 25.0)

# Jerlov's water types, oceanic then coastal, clearest first; a type's position is its water index.
WATER_TYPES = ('I', 'IA', 'IB', 'II', 'III', '1C', '3C', '5C', '7C', '9C')

# Diffuse attenuation of down-welling irradiance K_d, 1/m, per type (rows) at WAVELENGTHS (columns):
# Jerlov, Marine Optics (1976), as transcribed in the `jerlov` package 0.22.0 (jerlov1976_kd.csv,
# the Dstl dataset), read at 400, 425, ..., 700 nm.
KD = np.array([
    [0.028, 0.022, 0.019, 0.018, 0.027, 0.043, 0.063, 0.089, 0.235, 0.305, 0.36, 0.42, 0.56],
    [0.038, 0.031, 0.026, 0.025, 0.032, 0.048, 0.067, 0.094, 0.24, 0.31, 0.37, 0.43, 0.57],
    [0.051, 0.042, 0.036, 0.033, 0.042, 0.054, 0.072, 0.099, 0.245, 0.315, 0.375, 0.435, 0.58],
    [0.096, 0.081, 0.068, 0.062, 0.07, 0.076, 0.089, 0.115, 0.26, 0.335, 0.4, 0.465, 0.61],
    [0.185, 0.16, 0.135, 0.116, 0.115, 0.116, 0.12, 0.148, 0.295, 0.375, 0.445, 0.52, 0.66],
    [0.51, 0.36, 0.25, 0.17, 0.14, 0.13, 0.12, 0.15, 0.3, 0.37, 0.45, 0.51, 0.65],
    [0.78, 0.54, 0.39, 0.29, 0.22, 0.2, 0.19, 0.21, 0.33, 0.4, 0.46, 0.56, 0.71],
    [1.1, 0.78, 0.56, 0.43, 0.36, 0.31, 0.3, 0.33, 0.4, 0.48, 0.54, 0.65, 0.8],
    [1.6, 1.2, 0.89, 0.71, 0.58, 0.49, 0.46, 0.46, 0.48, 0.54, 0.63, 0.78, 0.92],
    [2.4, 1.9, 1.6, 1.23, 0.99, 0.78, 0.63, 0.58, 0.6, 0.65, 0.76, 0.92, 1.1],
])  # fmt: skip

# Absorption a and scattering b, 1/m, per type at WAVELENGTHS: measured by Williamson and Hollins
# (2022, Front. Mar. Sci. 9:885381) for IB to 5C; for I, IA, 7C and 9C, which they did not measure,
# Solonenko and Mobley's inversion of K_d (2015, Appl. Opt. 54(17):5392). Both as the `jerlov`
# package 0.22.0 ships them (williamson2022_iop.csv, solonenko2015_iop.csv); it flags Solonenko and
# Mobley's b of I and IA as small and suspect, which matters little: those waters barely scatter.
ABSORPTION = np.array([
    [0.022, 0.017, 0.018, 0.019, 0.026, 0.046, 0.062, 0.082, 0.228, 0.295, 0.334, 0.434, 0.582],
    [0.0295, 0.0225, 0.0221, 0.0216, 0.0282, 0.0468, 0.0622, 0.0821, 0.228, 0.295, 0.334, 0.435, 0.582],
    [0.0448, 0.0428, 0.0407, 0.0372, 0.0398, 0.0516, 0.0655, 0.0888, 0.227, 0.291, 0.335, 0.425, 0.573],
    [0.0745, 0.0686, 0.0623, 0.0544, 0.0529, 0.0609, 0.0724, 0.0941, 0.231, 0.295, 0.338, 0.429, 0.575],
    [0.13, 0.125, 0.112, 0.0941, 0.0835, 0.0821, 0.0878, 0.105, 0.241, 0.307, 0.351, 0.454, 0.581],
    [0.186, 0.171, 0.148, 0.121, 0.104, 0.0972, 0.0988, 0.113, 0.248, 0.314, 0.359, 0.47, 0.585],
    [0.236, 0.228, 0.2, 0.166, 0.144, 0.132, 0.128, 0.136, 0.268, 0.335, 0.379, 0.503, 0.598],
    [0.469, 0.395, 0.313, 0.243, 0.199, 0.174, 0.159, 0.156, 0.285, 0.357, 0.402, 0.557, 0.614],
    [1.03, 0.753, 0.542, 0.388, 0.29, 0.233, 0.195, 0.175, 0.301, 0.367, 0.403, 0.559, 0.621],
    [1.613, 1.242, 0.943, 0.709, 0.543, 0.43, 0.348, 0.291, 0.39, 0.436, 0.456, 0.604, 0.651],
])  # fmt: skip
SCATTERING = np.array([
    [0.0062, 0.00482, 0.00381, 0.00306, 0.00249, 0.00205, 0.0017, 0.00143, 0.00122, 0.00104, 0.000899,
     0.000782, 0.000685],
    [0.0092, 0.00755, 0.00631, 0.00536, 0.00461, 0.00402, 0.00354, 0.00315, 0.00283, 0.00256, 0.00234,
     0.00214, 0.00198],
    [0.144, 0.139, 0.135, 0.131, 0.128, 0.125, 0.122, 0.12, 0.118, 0.116, 0.114, 0.112, 0.111],
    [0.209, 0.202, 0.195, 0.19, 0.185, 0.181, 0.177, 0.173, 0.17, 0.167, 0.164, 0.161, 0.159],
    [0.324, 0.316, 0.309, 0.303, 0.297, 0.292, 0.287, 0.282, 0.278, 0.274, 0.271, 0.267, 0.264],
    [0.474, 0.464, 0.455, 0.447, 0.44, 0.433, 0.427, 0.421, 0.416, 0.41, 0.405, 0.401, 0.396],
    [0.713, 0.699, 0.686, 0.675, 0.664, 0.654, 0.644, 0.636, 0.627, 0.62, 0.612, 0.605, 0.599],
    [1.32, 1.29, 1.27, 1.25, 1.23, 1.21, 1.19, 1.18, 1.16, 1.15, 1.13, 1.12, 1.11],
    [4.02, 3.63, 3.3, 3.01, 2.76, 2.54, 2.35, 2.18, 2.03, 1.89, 1.77, 1.66, 1.56],
    [5.36, 4.84, 4.39, 4.01, 3.67, 3.38, 3.12, 2.89, 2.69, 2.51, 2.35, 2.2, 2.07],
])  # fmt: skip

# Daylight at the surface: CIE standard illuminant D65's relative spectral power at WAVELENGTHS.
DAYLIGHT = np.array([82.7549, 90.057, 117.008, 115.392, 109.354, 106.239, 104.046, 96.0611, 90.0062,
                     85.4936, 80.0268, 80.281, 71.6091])  # fmt: skip

# The camera: Gaussian spectral sensitivities peaking at 600 (R), 540 (G) and 460 nm (B), standard
# deviation 35 nm, cut at 400 and 700 nm (the sensor's UV and IR filters); a generic RGB sensor.
CAMERA_PEAKS = (600.0, 540.0, 460.0)
CAMERA_WIDTH = 35.0

# Backscattering: the fraction of scattered light sent backwards, b_b / b, of Petzold's average
# particle phase function (0.0183; Mobley, Light and Water, 1994). The veiling light is its single-
# scattering estimate B_inf = b_b E / (2 pi c) (backscatter spread over the backward hemisphere).
BACKSCATTER_RATIO = 0.0183
# The frame's white is a white Lambertian face turned to a horizontal line of sight, which gets this
# fraction of the down-welling irradiance.
FACE_IRRADIANCE_RATIO = 0.3
_GREEN = 1


def water_index(water_type: str | float) -> float:
    """The water index of a Jerlov type ('II' -> 3.0, '5C' -> 7.0); a number is checked and returned.

    Raises:
        ParameterError: for an unknown type or a number outside [0, 9].
    """
    if isinstance(water_type, str):
        name = water_type.strip().upper()
        if name in WATER_TYPES:
            return float(WATER_TYPES.index(name))
        try:
            water_type = float(name)
        except ValueError:
            raise ParameterError(
                f'unknown Jerlov water type {water_type!r}; known: {", ".join(WATER_TYPES)} or an index 0-9'
            ) from None
    index = float(water_type)
    if not (math.isfinite(index) and 0.0 <= index <= len(WATER_TYPES) - 1):
        raise ParameterError(f'water index {water_type!r} is outside [0, {len(WATER_TYPES) - 1}]')
    return index


def water_type_name(index: float) -> str:
    """The type a water index names: 'II' at 3, '5C-7C 0.25' a quarter of the way from 5C to 7C."""
    index = water_index(index)
    below = min(int(math.floor(index)), len(WATER_TYPES) - 2)
    fraction = index - below
    if fraction == 0.0:
        return WATER_TYPES[below]
    if fraction == 1.0:
        return WATER_TYPES[below + 1]
    return f'{WATER_TYPES[below]}-{WATER_TYPES[below + 1]} {fraction:.2f}'


@dataclass(frozen=True)
class WaterOptics:
    """One water's coefficients at WAVELENGTHS, 1/m: K_d (down-welling), absorption a, scattering b."""

    kd: np.ndarray
    a: np.ndarray
    b: np.ndarray

    @property
    def c(self) -> np.ndarray:
        """Beam attenuation c = a + b: what a narrow beam loses per metre."""
        return self.a + self.b


def water_optics(water_type: str | float) -> WaterOptics:
    """The coefficients of a Jerlov type, or of a water index between two types.

    Between neighbouring types i and i+1, at f = index - i, each coefficient is interpolated in log
    space, k = k_i^(1-f) k_(i+1)^f: attenuation multiplies along a path, so the halfway water
    attenuates as the geometric mean of its neighbours, and every coefficient stays positive.
    """
    index = water_index(water_type)
    below = min(int(math.floor(index)), len(WATER_TYPES) - 2)
    f = index - below

    def between(table: np.ndarray) -> np.ndarray:
        return np.exp((1.0 - f) * np.log(table[below]) + f * np.log(table[below + 1]))

    return WaterOptics(between(KD), between(ABSORPTION), between(SCATTERING))


def camera_response() -> np.ndarray:
    """The camera's spectral sensitivities at WAVELENGTHS, (3, n) rows R, G, B (CAMERA_PEAKS)."""
    peaks = np.asarray(CAMERA_PEAKS)[:, None]
    return np.exp(-((WAVELENGTHS[None, :] - peaks) ** 2) / (2.0 * CAMERA_WIDTH**2))


@dataclass(frozen=True)
class ChannelCoefficients:
    """What a water path does to each colour channel (R, G, B), in the frame's linear light.

    The revised image formation model (Akkaynak and Treibitz 2018) per channel c:
    I_c = J_c exp(-beta_D_c z) + B_inf_c (1 - exp(-beta_B_c z)); `transmission` is exp(-beta_D z),
    `veil` the backscatter B_inf (1 - exp(-beta_B z)). beta_D and beta_B are NaN at range 0.
    """

    distance: float
    transmission: np.ndarray
    veil: np.ndarray
    veiling_light: np.ndarray
    beta_d: np.ndarray
    beta_b: np.ndarray


def channel_coefficients(
    water_type: str | float, depth: float, distance: float, response: np.ndarray | None = None
) -> ChannelCoefficients:
    """The wideband coefficients of a camera looking horizontally through `distance` metres of water.

    Wavelength by wavelength, the scene's light keeps exp(-c z) and the water adds the single-
    scattering veil B_inf(lambda) (1 - exp(-c z)), B_inf = b_b E / (2 pi c), E the down-welling light
    at `depth`, daylight attenuated by exp(-K_d depth). A channel integrates these over its
    sensitivity S_c (the scene's reflectance taken flat within a channel), which is what makes
    beta_D and beta_B differ and depend on range and depth (Akkaynak and Treibitz 2018, Eqs. 11-12):

        exp(-beta_D_c z)                = sum S_c E exp(-c z) / sum S_c E
        B_inf_c (1 - exp(-beta_B_c z))  = g sum S_c B_inf (1 - exp(-c z)) / sum S_c (F / pi) D65

    The camera keeps a daylight white balance and exposes automatically: g scales the light so that
    a white face lit at `depth` (F = FACE_IRRADIANCE_RATIO of the down-welling light) reads 1 in
    green. The frame J is the scene as that camera saw it with no water in between.

    Args:
        water_type: a Jerlov type ('II', '5C') or a water index in [0, 9].
        depth: metres below the surface, >= 0.
        distance: metres of water between camera and scene, >= 0.
        response: the camera's sensitivities at WAVELENGTHS, (3, n); `camera_response()` if None.
    """
    optics = water_optics(water_type)
    if not (math.isfinite(depth) and depth >= 0.0 and math.isfinite(distance) and distance >= 0.0):
        raise ParameterError(f'depth and distance must be finite and >= 0, got {depth!r} and {distance!r}')
    s = camera_response() if response is None else np.asarray(response, dtype=np.float64)
    c = optics.c
    light, lit, white, exposure, b_inf = _ambient(optics, depth, s)
    path = np.exp(-c * distance)
    transmission = (s @ (light * path)) / lit
    veiling_light = exposure * (s @ b_inf) / white
    veil = exposure * (s @ (b_inf * (1.0 - path))) / white
    with np.errstate(divide='ignore', invalid='ignore'):
        beta_d = -np.log(transmission) / distance if distance > 0 else np.full(3, np.nan)
        beta_b = -np.log1p(-veil / veiling_light) / distance if distance > 0 else np.full(3, np.nan)
    return ChannelCoefficients(float(distance), transmission, veil, veiling_light, beta_d, beta_b)


def _ambient(optics: WaterOptics, depth: float, s: np.ndarray) -> tuple[np.ndarray, ...]:
    """The light at `depth` (per wavelength), its channel sums, the white face's, the exposure and B_inf."""
    light = DAYLIGHT * np.exp(-optics.kd * depth)
    lit = s @ light
    white = s @ DAYLIGHT * FACE_IRRADIANCE_RATIO
    exposure = white[_GREEN] / (FACE_IRRADIANCE_RATIO * lit[_GREEN])
    b_inf = BACKSCATTER_RATIO * optics.b * light / (2.0 * optics.c)  # times pi, as the white's radiance is
    return light, lit, white, exposure, b_inf


def _distances(distances: np.ndarray | float) -> np.ndarray:
    z = np.atleast_1d(np.asarray(distances, dtype=np.float64))
    if not np.all(np.isfinite(z) & (z >= 0.0)):
        raise ParameterError('distances must be finite and >= 0')
    return z


def path_coefficients(
    water_type: str | float, depth: float, distances: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`channel_coefficients` at many distances at once: (transmission, veil), each (n, 3), and the
    ambient white (3,): what a white face lit by the light at `depth` reads per channel (green 1).

    The ambient white is (sum S_c E / sum S_c D65) over the same ratio in green: the camera's daylight
    white balance sees the light left at depth as a colour (blue in oceanic water, green in coastal).
    """
    optics = water_optics(water_type)
    if not (math.isfinite(depth) and depth >= 0.0):
        raise ParameterError(f'depth must be finite and >= 0, got {depth!r}')
    z = _distances(distances)
    s = camera_response()
    light, lit, white, exposure, b_inf = _ambient(optics, depth, s)
    path = np.exp(-np.multiply.outer(z, optics.c))  # (n, wavelengths)
    transmission = (light * path) @ s.T / lit
    veil = exposure * ((b_inf * (1.0 - path)) @ s.T) / white
    daylight = s @ DAYLIGHT
    ambient_white = (lit / daylight) / (lit[_GREEN] / daylight[_GREEN])
    return transmission, veil, ambient_white


def lamp_transmission(water_type: str | float, distances: np.ndarray | float) -> np.ndarray:
    """What is left, per channel, of a white lamp's light (D65, which the daylight-balanced camera sees
    white) after each of `distances` metres of water: sum S_c D65 exp(-c r) / sum S_c D65, (n, 3)."""
    optics = water_optics(water_type)
    z = _distances(distances)
    s = camera_response()
    return (DAYLIGHT * np.exp(-np.multiply.outer(z, optics.c))) @ s.T / (s @ DAYLIGHT)
