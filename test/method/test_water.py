"""Water as optics describes it (method/water.py): checked against the published tables and the closed form.

What is physics here and not the code checked against itself: the coefficients come back as the
tables print them when the camera sees one wavelength per channel (Jerlov 1976's K_d, Williamson and
Hollins 2022's a and b, typed below from the papers' tables as the `jerlov` package ships them); the
frame follows the revised image formation model's closed form, computed here with the sRGB formulas
(IEC 61966-2-1), to within the rounding to bytes; the channel that fades first and the colour of the
light at depth follow the tables' orderings.
"""

import math

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition, SearchSpace, decode
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.relations import RELATION_BY_ID, RELATION_GROUPS, apply_relation
from metavlm_ros.method.search import SearchConfig, run_search, summary_record
from metavlm_ros.method.water import (
    BACKSCATTER_RATIO,
    CAMERA_PEAKS,
    FACE_IRRADIANCE_RATIO,
    WATER_TYPES,
    WAVELENGTHS,
    channel_coefficients,
    water_index,
    water_optics,
    water_type_name,
)
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

OCEANIC = ('I', 'IA', 'IB', 'II', 'III')
COASTAL = ('1C', '3C', '5C', '7C', '9C')
# One byte of sRGB is the frame's resolution: the rendered byte is the closed form's value rounded,
# so it lies within half a byte of it (plus float noise).
BYTE_TOLERANCE = 0.5 + 1e-6


def srgb_decode(byte: np.ndarray) -> np.ndarray:
    v = np.asarray(byte, dtype=np.float64) / 255.0
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    """sRGB in bytes as floats, unrounded."""
    lin = np.clip(linear, 0.0, 1.0)
    return 255.0 * np.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin ** (1 / 2.4) - 0.055)


def band(wavelength: float) -> int:
    return int(np.flatnonzero(WAVELENGTHS == wavelength)[0])


def test_water_types_and_the_continuous_index_between_them():
    assert [water_index(name) for name in WATER_TYPES] == list(range(10))
    assert water_index('5c') == 7.0 and water_index(' ii ') == 3.0 and water_index(2.5) == 2.5
    assert [water_type_name(i) for i in (0, 3, 9)] == ['I', 'II', '9C']
    assert water_type_name(7.25) == '5C-7C 0.25'
    for bad in ('IV', 9.5, -1, float('nan')):
        with pytest.raises(ParameterError):
            water_index(bad)
    # At a type the coefficients are its own; halfway, the geometric mean of its neighbours.
    ii, iii, half = water_optics('II'), water_optics('III'), water_optics(3.5)
    assert np.allclose(half.c, np.sqrt(ii.a * iii.a) + np.sqrt(ii.b * iii.b))
    assert np.allclose(half.kd, np.sqrt(ii.kd * iii.kd))
    # The index orders the waters from clear to turbid: beam attenuation grows with it everywhere.
    c = np.array([water_optics(i).c for i in np.linspace(0, 9, 37)])
    assert np.all(np.diff(c, axis=0) > 0)


def test_a_camera_that_sees_one_wavelength_per_channel_gets_the_tables_coefficients():
    """Narrow bands: beta_D = beta_B = c, and the veiling light the single-scattering estimate.

    Jerlov II at 600, 550 and 450 nm: a, b (Williamson and Hollins 2022) and K_d (Jerlov 1976).
    """
    a = np.array([0.231, 0.0724, 0.0623])
    b = np.array([0.170, 0.177, 0.195])
    kd = np.array([0.26, 0.089, 0.068])
    c = a + b
    response = np.zeros((3, WAVELENGTHS.size))
    for channel, wavelength in enumerate((600, 550, 450)):
        response[channel, band(wavelength)] = 1.0
    for depth in (0.0, 12.0):
        for distance in (0.5, 3.0):
            k = channel_coefficients('II', depth, distance, response=response)
            assert np.allclose(k.beta_d, c, rtol=1e-9) and np.allclose(k.beta_b, c, rtol=1e-9)
            # The camera exposes for the green light at depth and keeps a daylight white balance:
            # the veil of each channel is b_b / (2 F c) of its light, relative to green's.
            relative_light = np.exp(-(kd - kd[1]) * depth)
            veiling = BACKSCATTER_RATIO * b / (2 * FACE_IRRADIANCE_RATIO * c) * relative_light
            assert np.allclose(k.veiling_light, veiling, rtol=1e-9)
            assert np.allclose(k.transmission, np.exp(-c * distance), rtol=1e-9)


@pytest.mark.parametrize('water_type', WATER_TYPES)
def test_a_flat_grey_target_follows_the_closed_form_per_channel(water_type):
    """I_c = J_c exp(-beta_D_c z) + B_inf_c (1 - exp(-beta_B_c z)), in linear light, to the byte."""
    levels = np.array([0, 30, 64, 128, 200, 255], np.uint8)
    target = np.repeat(np.repeat(levels[None, :, None], 4, axis=0), 3, axis=2)
    for depth in (0.0, 15.0):
        for distance in (0.25, 1.0, 2.0, 4.0, 8.0):
            k = channel_coefficients(water_type, depth, distance)
            assert np.all(k.beta_d > 0) and np.all(k.beta_b > 0)
            out = apply_relation(target, 'water', distance, water_index(water_type), depth)
            expected = srgb_decode(levels)[:, None] * np.exp(-k.beta_d * distance) + k.veiling_light * (
                1 - np.exp(-k.beta_b * distance)
            )
            assert np.all(out == out[:1]), 'a flat target stays flat'
            assert np.abs(out[0].astype(float) - srgb_encode(expected)).max() <= BYTE_TOLERANCE


def measured_transmission(water_type: str, distance: float, depth: float = 0.0) -> np.ndarray:
    """exp(-beta_D z) per channel as the frame shows it: the difference a white and a black target keep."""
    target = np.zeros((2, 2, 3), np.uint8)
    target[:, 1] = 255
    out = apply_relation(target, 'water', distance, water_index(water_type), depth)
    return srgb_decode(out[0, 1]) - srgb_decode(out[0, 0])


def table_c_at_the_camera_peaks(water_type: str) -> np.ndarray:
    return np.interp(CAMERA_PEAKS, WAVELENGTHS, water_optics(water_type).c)


def test_red_fades_first_in_oceanic_water_and_blue_in_turbid_coastal_water_as_the_tables_say():
    for water_type in WATER_TYPES:
        c = table_c_at_the_camera_peaks(water_type)
        kept = measured_transmission(water_type, 1.0)
        # Wherever the table's channels differ by more than 5 %, the frame orders them alike.
        for i in range(3):
            for j in range(3):
                if c[i] > 1.05 * c[j]:
                    assert kept[i] < kept[j], (water_type, i, j, c, kept)
    for water_type in OCEANIC:
        kept = measured_transmission(water_type, 2.0)
        assert kept[0] == kept.min(), f'red fades first in {water_type}'
    for water_type in ('5C', '7C', '9C'):
        kept = measured_transmission(water_type, 0.5)
        assert kept[2] == kept.min(), f'blue fades first in {water_type}: yellow substance and particles'


def test_the_light_at_depth_turns_from_blue_to_green_as_the_tables_say():
    """The veil (the water's own colour) at 20 m is the colour K_d lets through best."""
    black = np.zeros((2, 2, 3), np.uint8)
    for water_type in WATER_TYPES:
        kd = np.interp(CAMERA_PEAKS, WAVELENGTHS, water_optics(water_type).kd)
        veil = srgb_decode(apply_relation(black, 'water', 10.0, water_index(water_type), 20.0)[0, 0])
        best = int(np.argmin(kd))
        if np.sort(kd)[1] > 1.1 * kd[best]:
            assert veil.argmax() == best, (water_type, kd, veil)
    for water_type, colour in (('I', 2), ('II', 2), ('1C', 1), ('3C', 1), ('5C', 1)):
        veil = apply_relation(black, 'water', 10.0, water_index(water_type), 20.0)[0, 0]
        assert veil.argmax() == colour, (water_type, veil)


def michelson(light: np.ndarray, dark: np.ndarray) -> np.ndarray:
    return (light - dark) / (light + dark)


@pytest.mark.parametrize('water_type', ('I', 'II', '1C', '5C', '9C'))
def test_contrast_falls_monotonically_with_range(water_type):
    """The model's contrast falls at every step of range; the frame's is the model's to the byte.

    A light (230) and a dark (20) target at 5 m depth: the model's Michelson contrast per channel,
    (L - D) T / ((L + D) T + 2 V), falls strictly; the frame's lies within what rounding each pixel
    to the nearest byte allows (in clear water a few metres change it by less than that).
    """
    target = np.zeros((2, 2, 3), np.uint8)
    target[:, 1], target[:, 0] = 230, 20
    light, dark = srgb_decode(230), srgb_decode(20)
    model, frame = [], []
    for distance in np.linspace(0.0, 10.0, 41):
        k = channel_coefficients(water_type, 5.0, distance)
        model.append(michelson(light * k.transmission + k.veil, dark * k.transmission + k.veil))
        out = apply_relation(target, 'water', distance, water_index(water_type), 5.0)[0].astype(float)
        frame.append(michelson(srgb_decode(out[1]), srgb_decode(out[0])))
        low = michelson(srgb_decode(out[1] - 0.5), srgb_decode(out[0] + 0.5))
        high = michelson(srgb_decode(out[1] + 0.5), srgb_decode(np.maximum(out[0] - 0.5, 0)))
        assert np.all((low <= model[-1] + 1e-12) & (model[-1] <= high + 1e-12)), distance
    model, frame = np.array(model), np.array(frame)
    assert np.all(np.diff(model, axis=0) < 0), 'the model loses contrast at every step'
    assert np.all(frame[-1] < frame[0])
    if water_type in COASTAL:
        assert np.all(frame[-1] < 0.2 * frame[0]), 'coastal water all but hides a target at 10 m'


def test_water_is_the_identity_at_range_zero_at_every_type_and_depth():
    frame = make_frame(48, 32)
    for water_type in (0.0, 3.7, 9.0):
        for depth in (0.0, 40.0):
            assert np.array_equal(apply_relation(frame, 'water', 0.0, water_type, depth), frame)
    assert not np.array_equal(apply_relation(frame, 'water', 0.1, 7.0), frame)
    with pytest.raises(ParameterError, match=r'MR12 water type 9.5 is outside'):
        apply_relation(frame, 'water', 1.0, 9.5)
    with pytest.raises(ParameterError, match=r'MR12 water range 11.0 is outside'):
        apply_relation(frame, 'water', 11.0)


def test_water_is_one_opt_in_row_of_the_registry():
    relation = RELATION_BY_ID['water']
    assert (relation.number, relation.parameter, relation.nominal, relation.low, relation.high) == (
        12,
        'range',
        0.0,
        0.0,
        10.0,
    )
    assert relation.max_deviation == 10.0 and relation.extra_ids == (
        'water_type',
        'water_depth',
        'water_lamp_power',
        'water_scene_range',
        'water_tilt',
        'water_fov',
    )
    assert [(e.low, e.high) for e in relation.extras] == [
        (0.0, 9.0),
        (0.0, 40.0),
        (0.0, 100.0),
        (0.3, 20.0),
        (0.0, 90.0),
        (10.0, 150.0),
    ]
    # The water is searched; what the user states about the footage (lamps, range prior) is held.
    assert [e.span for e in relation.extras] == [(0.0, 9.0), (0.0, 40.0), (0, 0), (2, 2), (0, 0), (60, 60)]
    assert RELATION_GROUPS['optics'] == ('water',)
    assert 'water' in RELATION_GROUPS['all'] and 'water' not in RELATION_GROUPS['underwater']
    # f_trans counts the metres, normalised like the others; the type and depth are conditions.
    clear = Composition.from_parameters({'water': 4.0, 'water_type': 0.0})
    murky = Composition.from_parameters({'water': 4.0, 'water_type': 9.0, 'water_depth': 30.0})
    assert f_trans(clear) == f_trans(murky) == pytest.approx(0.4)


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_search_in_jerlov_II_to_5C_water_up_to_4_m_records_its_waters(algorithm):
    frame = make_frame(64, 48)
    ranges = {'water': (0.0, 4.0), 'water_type': (water_index('II'), water_index('5C'))}
    space = SearchSpace.from_options(enabled=['rotation', 'optics'], ranges=ranges)
    config = SearchConfig(algorithm=algorithm, population=10, evaluations=40, seed=2, space=space)
    result = run_search(frame, ImageStatsBackend(), config)
    assert result.relations == ('rotation', 'water')
    waters = []
    for ev in result.evaluations:
        assert ev.genotype.shape == (10,) and decode(ev.genotype, space) == ev.composition
        if 'water' in ev.composition.parameters:
            parameters = ev.composition.parameters
            assert 0.0 <= parameters['water'] <= 4.0 and 3.0 <= parameters['water_type'] <= 7.0
            # The priors (no lamps, the same range over the frame) are held, and recorded.
            assert (parameters['water_lamp_power'], parameters['water_tilt']) == (0.0, 0.0)
            waters.append(parameters['water'])
    assert waters and max(ev.f_pred for ev in result.evaluations) > 0
    assert summary_record(result)['relations'] == ['rotation', 'water']
    record = space.as_record()
    assert record['extras'] == {
        'water_type': [3.0, 7.0],
        'water_depth': [0.0, 40.0],
        'water_lamp_power': [0.0, 0.0],
        'water_scene_range': [2.0, 2.0],
        'water_tilt': [0.0, 0.0],
        'water_fov': [60.0, 60.0],
    }
    assert len(record['enabled']) == 12 and record['high'][11] == 4.0
    assert not math.isnan(result.hypervolume)
