"""MR12 over a frame's own range map: each pixel's path gains what its point's range gains as the camera
moves back (the closed form, the lamps' fall-off), the map moved with the pixels, and a search that keeps
the map with its evidence and renders its follow-ups again."""

import math

import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError, ResultsError
from metavlm_ros.common.range_maps import (
    decode_ranges_png,
    encode_ranges_png,
    quantise_ranges,
    ranges_digest,
    read_source_ranges,
)
from metavlm_ros.common.results import ResultsStore, read_jsonl
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.relations import apply_composition, apply_relation
from metavlm_ros.method.render import find_search, render_search
from metavlm_ros.method.search import SearchConfig, prepare_frame, run_search
from metavlm_ros.method.underwater import linear_light, srgb_bytes
from metavlm_ros.method.water import channel_coefficients, lamp_transmission, path_coefficients, water_index
from metavlm_ros.method.water_scene import LAMP_HALF_ANGLE
from test.fakes import ImageStatsBackend

H, W = 60, 80
# The float path and the byte table of the constant prior each round once to sRGB bytes (0.526 of a
# byte from the exact value, method/underwater.py): they may differ by one.
ONE_BYTE = 1


@pytest.fixture(scope='module')
def noise():
    return np.random.default_rng(5).integers(0, 256, (H, W, 3), dtype=np.uint8)


def _water(frame, z, kind, lamps=0.0, scene=2.0, tilt=0.0, fov=60.0, ranges=None):
    return apply_relation(frame, 'water', z, water_index(kind), 5.0, lamps, scene, tilt, fov, ranges=ranges)


def _close(a, b, within=ONE_BYTE):
    return int(np.abs(a.astype(int) - b.astype(int)).max()) <= within


def _cos_theta(y, x, height=H, width=W, fov=60.0):
    """cos of the angle between pixel (y, x)'s ray and the optical axis: a pinhole camera whose vertical
    field is `fov` degrees (the relation's water_fov)."""
    f = (height / 2) / math.tan(math.radians(fov) / 2)
    return math.cos(math.atan(math.hypot(x - (width - 1) / 2, y - (height - 1) / 2) / f))


def _gained(r0, z, cos_theta):
    """What a path r0 metres long gains when the camera moves z metres back: |r0 u + z a| - r0."""
    return z * cos_theta if math.isinf(r0) else math.sqrt(r0**2 + z**2 + 2 * r0 * z * cos_theta) - r0


def _closed_form(j, added, kind, gain=1.0):
    c = channel_coefficients(kind, 5.0, added)
    return srgb_bytes((linear_light(j) * gain * c.transmission + c.veil).astype(np.float32)).astype(int)


@pytest.mark.parametrize('kind', ['I', '5C', '9C'])
def test_each_pixel_gains_what_its_own_points_range_gains(kind):
    grey = np.full((H + 1, W + 1, 3), 128, np.uint8)  # odd sides: pixel (30, 40) is on the axis
    ranges = np.full((H + 1, W + 1), 2.0)
    ranges[:, :20] = 0.5  # a near object on the left
    ranges[:, -20:] = 6.0  # the far floor on the right
    ranges[:5] = np.inf  # open water along the top
    out = _water(grey, 2.0, kind, ranges=ranges)
    for y, x in ((30, 40), (30, 5), (50, 75), (2, 40), (2, 2)):
        added = _gained(ranges[y, x], 2.0, _cos_theta(y, x, H + 1, W + 1))
        assert np.abs(out[y, x].astype(int) - _closed_form(grey[y, x], added, kind)).max() <= ONE_BYTE, (y, x)
    # On the axis every path gains the whole 2 m, whatever its length: the constant prior's pixel.
    assert _close(out[30, 40], _water(grey, 2.0, kind)[30, 40])


def test_a_point_far_away_is_open_water_and_the_priors_scene_range_and_tilt_are_not_used(noise):
    far = _water(noise, 3.0, '1C', ranges=np.full((H, W), 60000.0))
    assert _close(far, _water(noise, 3.0, '1C', ranges=np.full((H, W), np.inf)))
    again = _water(noise, 3.0, '1C', scene=9.0, tilt=40.0, ranges=np.full((H, W), 60000.0))
    assert np.array_equal(far, again)


def test_the_lamps_light_near_points_more_and_lose_more_of_it_as_the_camera_moves_back():
    grey = np.full((H + 1, W + 1, 3), 128, np.uint8)
    ranges = np.full((H + 1, W + 1), 5.0)
    ranges[:, :40] = 0.6
    out = _water(grey, 1.0, 'II', lamps=6.0, ranges=ranges)
    ambient = path_coefficients('II', 5.0, [0.0])[2]  # what a white face reads by daylight 5 m deep

    def lit(r):
        return lamp_transmission('II', [r])[0] / r**2

    gains = {}
    for y, x in ((30, 20), (30, 60)):
        cos_theta = _cos_theta(y, x, H + 1, W + 1)
        r0 = ranges[y, x]
        added = _gained(r0, 1.0, cos_theta)
        beam = 6.0 * math.exp(-math.log(2) * (math.acos(cos_theta) / math.radians(LAMP_HALF_ANGLE)) ** 2)
        gains[x] = (ambient + beam * lit(r0 + added)) / (ambient + beam * lit(r0))
        expected = _closed_form(grey[y, x], added, 'II', gains[x])
        assert np.abs(out[y, x].astype(int) - expected).max() <= ONE_BYTE, x
    assert (gains[20] < gains[60]).all()  # inverse square: the near point loses the larger share


def test_the_map_moves_with_the_pixels_a_geometric_relation_moved():
    grey = np.full((H, W, 3), 128, np.uint8)
    ranges = np.full((H, W), 0.6)
    ranges[:, W // 2 :] = 8.0  # near on the left, far on the right
    # With the lamps on, a point's range decides how much of their light it loses as the camera goes back.
    water = Composition.from_parameters({'water': 2.0, 'water_type': 3.0, 'water_lamp_power': 6.0})
    near = apply_composition(grey, water, ranges=np.full((H, W), 0.6))
    far = apply_composition(grey, water, ranges=np.full((H, W), 8.0))
    still = apply_composition(grey, water, ranges=ranges)
    # MR6 moves every pixel int(80 * 0.03) = 2 columns right, the near half's edge with them.
    moved = Composition.from_parameters({'translation': 0.03, **water.parameters})
    out = apply_composition(grey, moved, ranges=ranges)
    edge = W // 2
    assert not np.array_equal(near[:, edge], far[:, edge])
    for column in (edge, edge + 1):
        assert np.array_equal(out[:, column], near[:, column])
        assert np.array_equal(still[:, column], far[:, column])
    assert np.array_equal(out[:, edge + 2], far[:, edge + 2])


def test_a_map_of_another_size_than_the_frame_is_refused_in_one_line(noise):
    with pytest.raises(InputError, match='range map is 8x6, the frame 80x60'):
        _water(noise, 1.0, 'II', ranges=np.ones((6, 8)))


def test_maps_round_trip_through_their_png_in_millimetres():
    ranges = np.array([[0.0004, 1.2345, np.inf], [np.nan, 70.0, 3.0]])
    back = decode_ranges_png(encode_ranges_png(ranges))
    assert back.dtype == np.float32
    np.testing.assert_allclose(back[0, :2], [0.001, 1.234], atol=5e-4)  # a surface stays a surface
    assert np.isinf(back[0, 2]) and np.isinf(back[1, 0])  # open water and unknown: no surface
    assert back[1, 1] == pytest.approx(65.534) and back[1, 2] == pytest.approx(3.0)
    assert np.array_equal(quantise_ranges(back), back, equal_nan=True)
    assert ranges_digest(back) == ranges_digest(ranges)
    with pytest.raises(InputError, match='not a single-channel 16-bit PNG'):
        decode_ranges_png(b'not a png')


def _ranged_search(out, frame, ranges, **settings):
    config = SearchConfig(
        population=8,
        evaluations=48,
        seed=3,
        space=SearchSpace.from_options(enabled=['rotation', 'water'], ranges={'water_type': (5.0, 9.0)}),
        working_size=64,
        pareto_pngs=None,
        water_ranges='truth',
        **settings,
    ).validate()
    with ResultsStore(out) as store:
        prepared = prepare_frame(frame, config, 0, ranges)
        return config, run_search(prepared, ImageStatsBackend(), config, image_id='f', store=store)


def test_a_search_over_the_truth_keeps_its_map_and_renders_every_follow_up_again(tmp_path, noise):
    ranges = np.linspace(0.4, 9.0, H)[:, None].repeat(W, axis=1)
    ranges[:8] = np.inf
    config, result = _ranged_search(tmp_path / 'out', noise, ranges)
    assert config.identity()['water_ranges'] == 'truth'
    summary = find_search(tmp_path / 'out')
    stored = read_source_ranges(tmp_path / 'out', summary)
    assert stored.shape == (48, 64) and np.isinf(stored[0]).all()
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    frames = render_search(tmp_path / 'out', summary, [p['index'] for p in pareto])
    for p in pareto:
        assert frames[p['index']].tobytes() == _png_pixels(tmp_path / 'out' / p['frame']).tobytes()
    # The same genotypes over the prior's constant range give other follow-ups: the map was used.
    watered = [ev for ev in result.evaluations if ev.composition.parameters.get('water', 0) > 1.0]
    assert watered
    ev = watered[0]
    source = _png_pixels(tmp_path / 'out' / summary['source_frame'])
    prior = apply_composition(source, ev.composition)
    assert not np.array_equal(render_search(tmp_path / 'out', summary, [ev.index])[ev.index], prior)
    # A damaged map is named, never used.
    path = tmp_path / 'out' / summary['source_ranges']
    path.write_bytes(encode_ranges_png(stored + 1.0))
    with pytest.raises(ResultsError, match='does not match the sha256'):
        render_search(tmp_path / 'out', summary, [ev.index])


def _png_pixels(path):
    import cv2

    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def test_a_search_over_the_truth_needs_a_map_and_the_water_relation(tmp_path, noise):
    with pytest.raises(InputError, match="no range map, which water ranges 'truth' need"):
        _ranged_search(tmp_path / 'a', noise, None)
    with pytest.raises(ParameterError, match='for the relation water; the search leaves it out'):
        SearchConfig(water_ranges='truth').validate()
    with pytest.raises(ParameterError, match="unknown water ranges 'depth'"):
        SearchConfig(water_ranges='depth').validate()
