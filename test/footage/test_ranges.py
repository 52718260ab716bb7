"""Tests of metavlm_ros.footage.ranges: the scenes' range maps, their PNG form and their lookup."""

import struct

import cv2
import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import Frame, encode_png
from metavlm_ros.common.range_maps import MAX_MILLIMETRES
from metavlm_ros.footage.bag_reader import RANGES_TOPIC, compressed_depth_data, compressed_depth_png
from metavlm_ros.footage.bags import DEFAULT_START_NS, IMAGE_TOPIC, iter_bag_messages, list_image_topics
from metavlm_ros.footage.frames import iter_frames
from metavlm_ros.footage.ranges import (
    RANGES_DIR,
    RangeLookup,
    load_ranges_png,
    missing_ranges,
    render_with_ranges,
    scene_ranges,
    write_ranges_png,
)
from metavlm_ros.footage.scenes import ENVIRONMENTS, SceneGenerator

FRAMES = (0, 7)


def _floor_range(gen: SceneGenerator, world_row: np.ndarray) -> np.ndarray:
    """The range of the floor at a (possibly fractional) panorama row, from the scene's geometry."""
    below = np.maximum(world_row - gen.horizon, 1e-3)
    floor = gen.focal * gen.cam_h / below
    return np.minimum(floor, gen.wall) if gen.wall is not None else floor


@pytest.mark.parametrize('environment', ENVIRONMENTS)
def test_ranges_follow_the_scene_geometry(environment):
    gen = SceneGenerator(96, 64, 5, seed=5, environment=environment)
    assert gen.internal_size == (96, 64)  # small scenes are drawn at their output size
    for index in FRAMES:
        _, _, labels = gen.render(index)
        ranges = scene_ranges(gen, index, labels)
        assert ranges.dtype == np.float32 and ranges.shape == (64, 96)
        # Every drawn object's pixels carry exactly its distance.
        drawn = set(np.unique(labels)) - {-1}
        assert drawn
        for obj in gen.objects:
            if obj.index in drawn:
                assert (ranges[labels == obj.index] == np.float32(obj.d)).all()
        # Elsewhere, the floor (or wall) the camera's row sees: row y shows panorama row map_y[y].
        _, map_y = gen.camera_maps(index)
        world = map_y[:, 0].astype(np.float64) - gen.my
        surface = labels < 0
        near, far = _floor_range(gen, np.ceil(world)), _floor_range(gen, np.floor(world))
        floor_rows = np.floor(world) > gen.horizon + 1  # both neighbours well below the horizon
        assert floor_rows.any()
        for y in np.nonzero(floor_rows)[0]:
            row = ranges[y, surface[y]]
            assert np.isfinite(row).all()
            assert ((row >= near[y] * (1 - 1e-5)) & (row <= far[y] * (1 + 1e-5))).all()
        # Floor ranges grow toward the horizon: per column, down the rows of floor, they never grow.
        for x in range(96):
            column = ranges[floor_rows & surface[:, x], x]
            assert (np.diff(column) <= 0).all()
        # Above the horizon the camera sees open water, except the pool's wall.
        sky = np.ceil(world) < gen.horizon
        if environment == 'deep':
            assert not sky.any()  # the deep camera looks down: no horizon in the frame
        above = ranges[sky[:, None] & surface]
        if gen.wall is None:
            assert np.isinf(above).all()
        else:
            assert np.isin(above, [np.float32(gen.wall), np.inf]).all()
            assert (ranges[surface & np.isfinite(ranges)] <= np.float32(gen.wall)).all()
            assert (ranges == np.float32(gen.wall)).any() and np.isinf(ranges[0]).all()
        if environment == 'shallow':
            assert np.isinf(ranges[0, surface[0]]).all() and sky.any()


def test_ranges_at_an_output_size_larger_than_the_drawing():
    gen = SceneGenerator(1280, 160, 5, seed=2, environment='shallow')
    iw, ih = gen.internal_size
    assert (iw, ih) == (960, 120)
    _, truth, labels = gen.render(3)
    ranges = scene_ranges(gen, 3, labels)
    assert ranges.shape == (160, 1280) and ranges.dtype == np.float32
    distance = {obj.index: np.float32(obj.d) for obj in gen.objects}
    # The output pixel takes the value of the internal pixel nearest neighbour resizing maps it to.
    resized = cv2.resize(labels, (1280, 160), interpolation=cv2.INTER_NEAREST)
    for index in set(np.unique(resized)) - {-1}:
        assert (ranges[resized == index] == distance[index]).all()
    # Each object in the ground truth shows its distance inside its box (in output pixels).
    assert truth.boxes
    for box in truth.boxes:
        x0, y0, x1, y1 = box['box']
        assert (ranges[y0:y1, x0:x1] == distance[box['id']]).any()


def test_render_with_ranges_renders_once(monkeypatch):
    gen = SceneGenerator(96, 64, 5, seed=8, environment='pool')
    rgb, truth = gen.frame(4)
    _, _, labels = gen.render(4)
    calls = []
    render = gen.render
    monkeypatch.setattr(gen, 'render', lambda index: calls.append(index) or render(index))
    got_rgb, got_truth, ranges = render_with_ranges(gen, 4)
    assert calls == [4]
    np.testing.assert_array_equal(got_rgb, rgb)
    assert got_truth.to_dict() == truth.to_dict()
    np.testing.assert_array_equal(ranges, scene_ranges(gen, 4, labels))


def test_labels_of_another_size_are_refused():
    gen = SceneGenerator(96, 64, 5, seed=8, environment='pool')
    with pytest.raises(ParameterError, match='internal size 96x64'):
        scene_ranges(gen, 0, np.full((32, 48), -1, np.int16))


def test_png_round_trip_within_a_millimetre(tmp_path):
    rng = np.random.default_rng(0)
    ranges = rng.uniform(0.0, 65.0, (20, 30)).astype(np.float32)
    ranges[0, :5] = np.inf
    ranges[1, 0], ranges[1, 1], ranges[1, 2] = 0.0002, 65.5345, 1000.0
    path = write_ranges_png(tmp_path / 'r.png', ranges)
    mm = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert mm.dtype == np.uint16 and mm.shape == (20, 30)
    assert (mm[0, :5] == 0).all() and mm[1, 0] == 1 and mm[1, 1] == mm[1, 2] == MAX_MILLIMETRES
    back = load_ranges_png(path)
    assert back.dtype == np.float32 and back.shape == (20, 30)
    assert np.isinf(back[0, :5]).all() and np.isfinite(back[1:]).all() and np.isfinite(back[0, 5:]).all()
    assert back[1, 1] == back[1, 2] == np.float32(65.534)  # clipped, not open water
    assert back[1, 0] == np.float32(0.001)  # under a millimetre: 1, not 0 (open water)
    finite = np.isfinite(ranges) & (ranges <= 65.534)
    assert np.abs(back[finite] - ranges[finite]).max() <= 0.001  # rounded: within half a millimetre


def test_png_refuses_what_is_no_range_map(tmp_path):
    with pytest.raises(InputError, match='2-D|(H, W)'):
        write_ranges_png(tmp_path / 'bad.png', np.zeros((4, 4, 3)))
    assert not (tmp_path / 'bad.png').exists()
    (tmp_path / 'rgb.png').write_bytes(encode_png(np.zeros((4, 4, 3), np.uint8)))
    for name in ('rgb.png', 'missing.png'):
        with pytest.raises(InputError, match=name) as caught:
            load_ranges_png(tmp_path / name)
        assert '\n' not in str(caught.value)


def _scenes_folder(folder, gen: SceneGenerator, count: int, *, with_ranges: bool = True):
    """A folder as `metavlm scenes --format png` writes it (its ground_truth.jsonl left out)."""
    folder.mkdir()
    for index in range(count):
        rgb, _, ranges = render_with_ranges(gen, index)
        (folder / f'frame_{index:06d}.png').write_bytes(encode_png(rgb))
        if with_ranges:
            (folder / RANGES_DIR).mkdir(exist_ok=True)
            write_ranges_png(folder / RANGES_DIR / f'frame_{index:06d}.png', ranges)


def test_range_lookup_finds_each_frames_map_and_none_elsewhere(tmp_path):
    gen = SceneGenerator(96, 64, 5, seed=3, environment='shallow')
    _scenes_folder(tmp_path / 'scene', gen, 2)
    frames = list(iter_frames(tmp_path / 'scene'))
    assert [f.id for f in frames] == ['frame_000000', 'frame_000001']  # ranges/ holds no frames
    lookup = RangeLookup()
    for index, frame in enumerate(frames):
        expected = load_ranges_png(tmp_path / 'scene' / RANGES_DIR / f'{frame.id}.png')
        np.testing.assert_array_equal(lookup(frame), expected)
        np.testing.assert_array_equal(lookup.at(frame.file), expected)  # the size read from the file
        _, _, labels = gen.render(index)
        true = scene_ranges(gen, index, labels)
        assert (np.isinf(expected) == np.isinf(true)).all()
        finite = np.isfinite(true)
        assert np.abs(expected - np.minimum(true, MAX_MILLIMETRES / 1000))[finite].max() <= 0.001
    _scenes_folder(tmp_path / 'plain', gen, 1, with_ranges=False)
    (plain,) = iter_frames(tmp_path / 'plain')
    assert lookup(plain) is None
    assert lookup.at('') is None and lookup.at(None) is None
    assert lookup.at(tmp_path / 'dive.mcap', 5) is None and lookup.at(tmp_path / 'dive.mp4', 5) is None
    assert lookup(Frame('x', plain.rgb)) is None  # a frame not read from a file


def test_range_lookup_refuses_a_map_of_another_size(tmp_path):
    gen = SceneGenerator(96, 64, 5, seed=3, environment='deep')
    _scenes_folder(tmp_path / 'scene', gen, 1)
    write_ranges_png(tmp_path / 'scene' / RANGES_DIR / 'frame_000000.png', np.ones((32, 48), np.float32))
    (frame,) = iter_frames(tmp_path / 'scene')
    for call in (lambda: RangeLookup()(frame), lambda: RangeLookup().at(frame.file)):
        with pytest.raises(InputError, match=r'frame_000000\.png: range map is 48x32, its frame') as caught:
            call()
        assert '96x64' in str(caught.value) and '\n' not in str(caught.value)


def test_a_scenes_bag_carries_each_frames_range_map_as_a_compressed_depth_image(tmp_path):
    """`metavlm scenes --out X.mcap`: one 16UC1 compressedDepth message per frame on the depth topic,
    stamped as its image; RangeLookup gives each frame the map `scene_ranges` makes, open water kept."""
    bag = tmp_path / 'dive.mcap'
    size = ['--frames', '3', '--size', '64x48', '--fps', '5', '--seed', '3', '--environment', 'shallow']
    assert main(['scenes', '--out', str(bag), *size]) == 0
    assert list_image_topics(bag) == [IMAGE_TOPIC]  # the depth topic holds no camera frames
    images = [m.header.stamp for _, _, _, m in iter_bag_messages(bag, [IMAGE_TOPIC])]
    depth = list(iter_bag_messages(bag, [RANGES_TOPIC]))
    assert [m.header.stamp for _, _, _, m in depth] == images and len(images) == 3
    assert [t for _, _, t, _ in depth] == [DEFAULT_START_NS + i * 200_000_000 for i in range(3)]
    for _, msgtype, _, msg in depth:
        assert msgtype == 'sensor_msgs/msg/CompressedImage' and msg.header.frame_id == 'camera'
        assert msg.format == '16UC1; compressedDepth png'
        data = bytes(msg.data)
        # compressed_depth_image_transport's ConfigHeader: int32 format INV_DEPTH (0), float32
        # depthParam[2] (0 for 16UC1), little-endian; then the PNG of millimetres.
        assert struct.unpack('<iff', data[:12]) == (0, 0.0, 0.0)
        mm = cv2.imdecode(np.frombuffer(data[12:], np.uint8), cv2.IMREAD_UNCHANGED)
        assert mm.dtype == np.uint16 and mm.shape == (48, 64)
    gen = SceneGenerator(64, 48, 5, seed=3, environment='shallow')
    lookup = RangeLookup()
    for index, frame in enumerate(iter_frames(bag)):
        ranges = lookup(frame)
        _, _, labels = gen.render(index)
        true = scene_ranges(gen, index, labels)
        assert ranges.shape == (48, 64) and ranges.dtype == np.float32
        assert (np.isinf(ranges) == np.isinf(true)).all() and np.isinf(true).any()  # open water kept
        finite = np.isfinite(true)
        assert np.abs(ranges - np.minimum(true, MAX_MILLIMETRES / 1000))[finite].max() <= 0.001
        np.testing.assert_array_equal(lookup.at(frame.file, frame.stamp_ns), ranges)  # size unchecked
        assert missing_ranges(frame, lookup) is None
    assert lookup.at(bag, frame.stamp_ns + 1) is None  # no message of that stamp
    with pytest.raises(InputError, match=r'dive\.mcap: the range map at \d+ is 64x48, its frame is 32x24'):
        lookup.at(bag, frame.stamp_ns, size=(32, 24))


def test_a_bag_without_range_maps_has_none(mcap_bag):
    """A bag of pairs (as other tools record footage): no depth topic, no map, and the one-line refusal."""
    lookup = RangeLookup()
    frames = list(iter_frames(mcap_bag))
    assert [lookup(f) for f in frames] == [None] * len(frames)
    error = missing_ranges(frames[0], lookup)
    assert 'no range map at' in str(error) and RANGES_TOPIC in str(error) and '\n' not in str(error)


def test_compressed_depth_of_another_kind_is_refused():
    data = compressed_depth_data(np.full((4, 6), 2.5, np.float32))
    assert compressed_depth_png('16UC1; compressedDepth png', data)[:4] == b'\x89PNG'
    assert compressed_depth_png('16UC1; compressedDepth', data) == data[12:]  # older publishers
    for fmt, payload in [
        ('32FC1; compressedDepth png', data),  # quantised inverse depth: not millimetres
        ('16UC1; compressedDepth rvl', data),
        ('16UC1; compressedDepth png', data[:12]),  # a header and nothing after it
    ]:
        with pytest.raises(InputError, match='the range map: ') as caught:
            compressed_depth_png(fmt, payload)
        assert '\n' not in str(caught.value)
