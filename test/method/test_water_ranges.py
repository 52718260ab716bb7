"""MR12 over a frame's own range map: the priors' special cases, the closed form per pixel, the map moved
with the pixels, and a search that keeps the map with its evidence and renders its follow-ups again."""

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
from metavlm_ros.method.water import channel_coefficients, water_index
from metavlm_ros.method.water_scene import RANGE_GROWTH_MAX, range_growth
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


@pytest.mark.parametrize('kind', ['I', 'II', '5C', '9C'])
@pytest.mark.parametrize('lamps', [0.0, 6.0])
def test_a_constant_map_is_the_constant_prior_at_its_range(noise, kind, lamps):
    prior = _water(noise, 3.0, kind, lamps, scene=1.7)
    # scene_range and tilt are the map's now: other values there change nothing.
    truth = _water(noise, 3.0, kind, lamps, scene=9.0, tilt=40.0, ranges=np.full((H, W), 1.7))
    assert _close(prior, truth)


@pytest.mark.parametrize('lamps', [0.0, 6.0])
def test_a_map_of_a_flat_seabed_is_the_seabed_prior(noise, lamps):
    # Rows of the seabed prior at 30 degrees down, 50-degree field, 1.5 m at the centre; an odd height
    # puts the prior's centre on a pixel row, the row the map's centre range is read from.
    frame = noise[:-1]
    rows = 1.5 * range_growth(H - 1, 30.0, 50.0)
    prior = _water(frame, 3.0, '1C', lamps, scene=1.5, tilt=30.0, fov=50.0)
    truth = _water(frame, 3.0, '1C', lamps, fov=50.0, ranges=np.repeat(rows[:, None], W, axis=1))
    assert _close(prior, truth)


def test_each_pixel_gets_the_closed_form_at_its_own_added_range():
    grey = np.full((H, W, 3), 128, np.uint8)
    ranges = np.full((H, W), 2.0)
    ranges[:, : W // 4] = 0.5  # a near object on the left
    ranges[:, -W // 4 :] = 6.0  # the far floor on the right
    ranges[:5] = np.inf  # open water along the top
    out = _water(grey, 2.0, '5C', ranges=ranges)
    # The centre is at 2 m, so the camera's 2 m back is each range doubled: z_xy = 2 * r / 2.
    for (y, x), added in (
        ((30, 5), 0.5),
        ((30, 40), 2.0),
        ((30, 75), 6.0),
        ((2, 40), 2.0 * RANGE_GROWTH_MAX),
    ):
        c = channel_coefficients('5C', 5.0, added)
        expected = srgb_bytes((linear_light(grey[y, x]) * c.transmission + c.veil).astype(np.float32))
        assert np.abs(out[y, x].astype(int) - expected.astype(int)).max() <= ONE_BYTE, (y, x)
    # More water, less contrast: the far right is nearer the water's own colour than the near left.
    veil = srgb_bytes(channel_coefficients('5C', 5.0, 40.0).veil.astype(np.float32)).astype(int)
    assert np.abs(out[30, 75].astype(int) - veil).sum() < np.abs(out[30, 5].astype(int) - veil).sum()


def test_the_map_moves_with_the_pixels_a_geometric_relation_moved():
    grey = np.full((H, W, 3), 128, np.uint8)
    ranges = np.full((H, W), 1.0)
    ranges[:, W // 2 :] = 8.0  # near on the left, far on the right
    water = {'water': 3.0, 'water_type': 7.0}
    still = apply_composition(grey, Composition.from_parameters(water), ranges=ranges)
    # MR6 moves every pixel int(80 * 0.03) = 2 columns right, the near half's edge with them.
    out = apply_composition(grey, Composition.from_parameters({'translation': 0.03, **water}), ranges=ranges)
    near, far = still[:, 10], still[:, W - 10]
    assert not np.array_equal(near, far)
    edge = W // 2
    for column in (edge, edge + 1):
        assert np.array_equal(out[:, column], near) and np.array_equal(still[:, column], far)
    assert np.array_equal(out[:, edge + 2], far)


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
