"""MR12 over a scene (method/water_scene.py): the lamps and the seabed range prior against their closed forms.

The closed forms are computed here from the geometry (a pinhole camera, a flat seabed, a Gaussian beam)
and the published tables (method/water.py's, which test_water.py checks against the papers); the
frame is the closed form rounded to bytes through the 16-bit sRGB table, hence the tolerance.
"""

import math

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.relations import apply_composition, apply_relation
from metavlm_ros.method.search import SearchConfig
from metavlm_ros.method.water import DAYLIGHT, KD, camera_response, channel_coefficients, water_optics
from metavlm_ros.method.water_scene import LAMP_HALF_ANGLE, RANGE_GROWTH_MAX, describe_waters, range_growth
from test.method.test_water import srgb_decode, srgb_encode

# Half a byte of rounding, and the 16-bit table's half step times sRGB's steepest slope (0.026 byte).
BYTE_TOLERANCE = 0.5 + 0.026
GREY = 128
FOV = 60.0


def grey(height: int, width: int) -> np.ndarray:
    return np.full((height, width, 3), GREY, np.uint8)


def focal(height: int, fov: float = FOV) -> float:
    return height / 2 / math.tan(math.radians(fov / 2))


def white_at(index: float, distance: float) -> np.ndarray:
    """What is left per channel of white (D65) light after `distance` metres of the water."""
    s = camera_response()
    return (s @ (DAYLIGHT * np.exp(-water_optics(index).c * distance))) / (s @ DAYLIGHT)


def test_lamps_follow_their_closed_form_per_pixel_and_channel():
    height, width, index, depth, distance, power, near = 31, 41, 6.0, 10.0, 2.0, 5.0, 1.5
    out = apply_relation(grey(height, width), 'water', distance, index, depth, power, near).astype(float)
    # The daylight at depth on a white face, per channel, green 1 (the camera's daylight balance).
    s = camera_response()
    ambient = (s @ (DAYLIGHT * np.exp(-KD[int(index)] * depth))) / (s @ DAYLIGHT)
    ambient = ambient / ambient[1]
    # Each pixel's angle off the axis, the beam there, and the lamps' light at the near and far range.
    f = focal(height)
    y, x = np.mgrid[0:height, 0:width]
    theta = np.arctan(np.hypot((x - (width - 1) / 2) / f, (y - (height - 1) / 2) / f))
    beam = power * np.exp(-math.log(2) * (theta / math.radians(LAMP_HALF_ANGLE)) ** 2)[..., None]
    far = near + distance
    gain = (ambient + beam * white_at(index, far) / far**2) / (
        ambient + beam * white_at(index, near) / near**2
    )
    path = channel_coefficients(index, depth, distance)
    expected = srgb_encode(srgb_decode(GREY) * gain * path.transmission + path.veil)
    assert np.abs(out - expected).max() <= BYTE_TOLERANCE
    # The lamps light the centre most, so the centre loses most as the scene recedes: no flat frame.
    centre, corner = out[height // 2, width // 2], out[0, 0]
    assert np.all(centre < corner)
    unlit = apply_relation(grey(height, width), 'water', distance, index, depth)
    assert np.all(unlit == unlit[0, 0]) and np.all(out[0, 0] <= unlit[0, 0])


def test_the_lamps_light_falls_with_range_and_is_gone_without_them():
    frame = grey(21, 29)
    centres = [apply_relation(frame, 'water', z, 0.0, 30.0, 50.0, 1.0)[10, 14, 1] for z in (0.5, 1, 2, 4)]
    assert all(a > b for a, b in zip(centres, centres[1:], strict=False)), centres
    # No lamps, no prior: the relation's byte table, as before they existed; and 0 m is the identity.
    assert np.array_equal(
        apply_relation(frame, 'water', 2.0, 4.0, 5.0, 0.0, 9.0), apply_relation(frame, 'water', 2.0, 4.0, 5.0)
    )
    assert np.array_equal(apply_relation(frame, 'water', 0.0, 4.0, 5.0, 50.0, 1.0, 30.0), frame)
    with pytest.raises(
        ParameterError, match=r'MR12 water lamp_power -1 is outside the allowed range \[0, 100\]'
    ):
        apply_relation(frame, 'water', 1.0, 0.0, 0.0, -1)


def test_the_seabed_prior_makes_the_range_grow_toward_the_top_as_its_closed_form():
    height, tilt, index, depth, distance = 49, 30.0, 3.0, 5.0, 1.0
    growth = range_growth(height, tilt, FOV)
    f = focal(height)
    for row in (24, 30, 40, 48, 10, 5):
        below = math.radians(tilt) + math.atan((row - 24) / f)
        assert growth[row] == pytest.approx(
            min(math.sin(math.radians(tilt)) / math.sin(below), RANGE_GROWTH_MAX)
        )
    assert growth[24] == pytest.approx(1.0)
    # Farther toward the top, up to the horizon (the top ray, 30 degrees above the axis, is level).
    assert np.all(np.diff(growth) <= 0) and growth[0] == RANGE_GROWTH_MAX and growth[-1] < 0.6
    out = apply_relation(grey(height, 9), 'water', distance, index, depth, 0.0, 2.0, tilt).astype(float)
    for row in (0, 12, 24, 36, 48):
        path = channel_coefficients(index, depth, distance * growth[row])
        expected = srgb_encode(srgb_decode(GREY) * path.transmission + path.veil)
        assert np.abs(out[row] - expected).max() <= BYTE_TOLERANCE, row
    assert np.array_equal(range_growth(height, 0.0, FOV), [1.0])


def test_the_prior_is_stated_held_and_recorded_with_the_search():
    # Unstated, the priors are held at no lamps and the same range over the frame.
    plain = SearchSpace.from_options(['water'])
    assert plain.as_record()['extras']['water_tilt'] == [0.0, 0.0]
    stated = SearchSpace.from_options(['water'], {'water_tilt': (30, 30), 'water_lamp_power': (4, 4)})
    identity = SearchConfig(space=stated).identity()
    assert identity['relations']['extras']['water_tilt'] == [30.0, 30.0]
    assert identity['relations']['extras']['water_lamp_power'] == [4.0, 4.0]
    assert SearchSpace.from_record(identity['relations']) == stated
    # A record written before the priors existed reads, and renders, as it did.
    old = Composition.from_parameters({'water': 2.0, 'water_type': 7.0, 'water_depth': 3.0})
    assert old.parameters['water_tilt'] == 0.0 and old.parameters['water_scene_range'] == 2.0
    frame = grey(12, 16)
    assert np.array_equal(apply_composition(frame, old), apply_relation(frame, 'water', 2.0, 7.0, 3.0))


def test_a_region_of_waters_in_words():
    assert (
        describe_waters({'water': (0, 4), 'water_type': (3, 7)})
        == 'Jerlov II to 5C, up to 4 m, at the surface'
    )
    stated = {'water': (1, 2), 'water_type': (8, 8), 'water_depth': (0, 40), 'water_lamp_power': (4, 4)}
    assert (
        describe_waters({**stated, 'water_tilt': (30, 30)})
        == 'Jerlov 7C, 1-2 m, 0-40 m deep, lamps 4 (scene 2 m away), seabed 30 degrees below, 60-degree field'
    )
