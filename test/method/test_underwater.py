"""Tests of the underwater relations: identity at nominal, monotone, deterministic, their physical models."""

import cv2
import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method import underwater
from metavlm_ros.method.underwater import (
    UNDERWATER_PARAMETERS,
    WATER_ABSORPTION,
    colour_cast,
    low_light,
    marine_snow,
    motion_blur,
    turbidity,
)
from test.conftest import make_frame

FUNCTIONS = {
    'turbidity': turbidity,
    'colour_cast': colour_cast,
    'motion_blur': motion_blur,
    'marine_snow': marine_snow,
    'low_light': low_light,
}


def grey(frame: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY).astype(np.float64)


def rms_contrast(frame: np.ndarray) -> float:
    return float(grey(frame).std())


def red_blue_ratio(frame: np.ndarray) -> float:
    return float(frame[..., 0].mean() / frame[..., 2].mean())


def high_frequency_energy(frame: np.ndarray) -> float:
    return float(np.mean(cv2.Laplacian(grey(frame), cv2.CV_64F) ** 2))


def bright_pixels(frame: np.ndarray) -> int:
    return int((grey(frame) > 180).sum())


def mean_level(frame: np.ndarray) -> float:
    return float(frame.mean())


# What each relation must change, and the direction, as its parameter rises over its range.
MONOTONE = {
    'turbidity': (rms_contrast, 'falls'),
    'colour_cast': (red_blue_ratio, 'falls'),
    'motion_blur': (high_frequency_energy, 'falls'),
    'marine_snow': (bright_pixels, 'rises'),
    'low_light': (mean_level, 'falls'),
}


@pytest.fixture
def scene() -> np.ndarray:
    """A mid-grey synthetic frame with gradients, blocks and a bright disc, dark enough for snow to show."""
    return (make_frame(640, 360, seed=3) * 0.7).astype(np.uint8)


def test_every_relation_has_a_function_and_a_test_of_its_direction():
    assert set(UNDERWATER_PARAMETERS) == set(FUNCTIONS) == set(MONOTONE)


@pytest.mark.parametrize('relation', list(UNDERWATER_PARAMETERS))
def test_parameter_table_nominal_is_the_low_end_and_normalisation_the_range(relation):
    name, unit, nominal, low, high, max_deviation = UNDERWATER_PARAMETERS[relation]
    assert name and unit
    assert nominal == low == 0.0
    assert high > low
    # f_trans adds |value - nominal| / max_deviation: 0 at nominal, 1 at the far end of the range.
    assert max_deviation == high - nominal


@pytest.mark.parametrize('relation', list(FUNCTIONS))
def test_nominal_value_is_the_identity_byte_for_byte(relation, scene):
    nominal = UNDERWATER_PARAMETERS[relation][2]
    out = FUNCTIONS[relation](scene, nominal)
    assert out.dtype == np.uint8 and out.shape == scene.shape
    assert np.array_equal(out, scene)
    assert out is not scene and not np.shares_memory(out, scene)


@pytest.mark.parametrize('relation', list(FUNCTIONS))
def test_every_value_above_nominal_changes_the_frame_and_keeps_its_shape(relation, scene):
    _, _, _, low, high, _ = UNDERWATER_PARAMETERS[relation]
    for value in np.linspace(low, high, 5)[1:]:
        out = FUNCTIONS[relation](scene, value)
        assert out.dtype == np.uint8 and out.shape == scene.shape
        assert not np.array_equal(out, scene), value


@pytest.mark.parametrize('relation', list(FUNCTIONS))
def test_monotone_in_its_parameter_over_its_range(relation, scene):
    _, _, _, low, high, _ = UNDERWATER_PARAMETERS[relation]
    measure, direction = MONOTONE[relation]
    values = np.linspace(low, high, 7)
    measured = [measure(FUNCTIONS[relation](scene, v)) for v in values]
    steps = np.diff(measured)
    if direction == 'falls':
        assert np.all(steps < 0), (values, measured)
    else:
        assert np.all(steps > 0), (values, measured)


@pytest.mark.parametrize('relation', list(FUNCTIONS))
def test_deterministic_same_value_same_frame_even_after_the_caches_are_cleared(relation, scene):
    high = UNDERWATER_PARAMETERS[relation][4]
    value = 0.6 * high
    first = FUNCTIONS[relation](scene, value)
    underwater._snow_particles.cache_clear()
    underwater._sensor_noise.cache_clear()
    again = FUNCTIONS[relation](scene.copy(), value)
    assert np.array_equal(first, again)


@pytest.mark.parametrize('relation', list(FUNCTIONS))
def test_bad_values_and_frames_are_one_line_errors(relation, scene):
    function = FUNCTIONS[relation]
    for value in (-0.1, float('nan'), float('inf'), 'deep'):
        with pytest.raises(ParameterError, match=relation):
            function(scene, value)
    with pytest.raises(InputError):
        function(scene[..., 0], UNDERWATER_PARAMETERS[relation][4])


def _linear(frame: np.ndarray) -> np.ndarray:
    v = frame.astype(np.float64) / 255
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def test_turbidity_follows_the_image_formation_model_towards_the_mean_colour():
    # Two halves of different colour: each moves in linear light to J*t + B*(1-t), B their mean.
    frame = np.zeros((40, 80, 3), np.uint8)
    frame[:, :40] = (200, 60, 20)
    frame[:, 40:] = (20, 120, 220)
    distance = 2.0
    t = np.exp(-underwater.TURBIDITY_BETA * distance)
    veil = _linear(frame).reshape(-1, 3).mean(axis=0)
    expected = _linear(frame[0, [0, 79]]) * t + veil * (1 - t)
    got = _linear(turbidity(frame, distance)[0, [0, 79]])
    np.testing.assert_allclose(got, expected, atol=0.005)


def test_colour_cast_attenuates_each_channel_by_its_absorption_red_first():
    frame = np.full((8, 8, 3), 230, np.uint8)
    depth = 4.0
    got = _linear(colour_cast(frame, depth)[0, 0]) / _linear(frame[0, 0])
    np.testing.assert_allclose(got, np.exp(-np.array(WATER_ABSORPTION) * depth), rtol=0.02)
    assert got[0] < got[1] < got[2]


def test_motion_blur_smears_along_its_angle_only():
    # Vertical stripes lose their edges under horizontal blur and keep them under vertical blur.
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[:, ::8] = 255
    horizontal = motion_blur(frame, 0.1, angle=0.0)
    vertical = motion_blur(frame, 0.1, angle=90.0)
    assert high_frequency_energy(horizontal) < 0.2 * high_frequency_energy(frame)
    assert np.array_equal(vertical, frame)


def test_motion_blur_length_is_a_fraction_of_the_width_whatever_the_frame_size():
    # The same fraction at two sizes: the smaller frame, enlarged, matches the blurred large one.
    texture = cv2.GaussianBlur(np.random.default_rng(5).integers(0, 120, (480, 640, 3), np.uint8), (0, 0), 2)
    large = cv2.add(make_frame(640, 480, seed=5) // 2, texture)
    small = cv2.resize(large, (320, 240), interpolation=cv2.INTER_AREA)
    blurred_large = cv2.resize(motion_blur(large, 0.01), (320, 240), interpolation=cv2.INTER_AREA)
    blurred_small = motion_blur(small, 0.01)
    apart = np.abs(blurred_large.astype(int) - blurred_small.astype(int)).mean()
    blurred = np.abs(small.astype(int) - blurred_small.astype(int)).mean()
    # Blurring by the same number of pixels at both sizes would differ by about as much as `blurred`.
    assert blurred > 1.0 and apart < 0.3 * blurred


def test_marine_snow_keeps_its_particles_as_density_rises(scene):
    changed = [np.any(marine_snow(scene, d) != scene, axis=2) for d in (50, 200, 600)]
    for fewer, more in zip(changed, changed[1:], strict=False):
        assert np.all(more[fewer]) and more.sum() > fewer.sum()


def test_marine_snow_only_brightens_and_density_rounds_to_whole_particles(scene):
    out = marine_snow(scene, 400)
    assert np.all(grey(out) >= grey(scene) - 1)
    assert np.array_equal(marine_snow(scene, 100.2), marine_snow(scene, 100))


def test_low_light_halves_the_light_per_stop_and_adds_zero_mean_noise():
    frame = np.full((200, 200, 3), 180, np.uint8)
    out = low_light(frame, 1.0)
    ratio = _linear(out).mean() / _linear(frame).mean()
    assert ratio == pytest.approx(0.5, abs=0.01)
    assert out.std() > 0.5  # noise, not a plain darkening
