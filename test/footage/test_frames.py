"""Tests of metavlm_ros.footage.frames: image loading, conversions, folder streaming and selection."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import (
    UNKNOWN_INPUT_SIDE,
    Frame,
    parse_working_size,
    resize_longer_side,
    to_rgb8,
    working_size_for,
)
from metavlm_ros.footage.frames import iter_frames, load_image
from test.conftest import make_frame, write_frames


def write_png_rgb(path, rgb):
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return path


def test_load_png_round_trip_is_rgb(tmp_path):
    rgb = make_frame(40, 30)
    loaded = load_image(write_png_rgb(tmp_path / 'a.png', rgb))
    assert loaded.dtype == np.uint8 and loaded.shape == (30, 40, 3)
    assert loaded.flags['C_CONTIGUOUS']
    np.testing.assert_array_equal(loaded, rgb)


def test_pure_red_pixel_stays_red(tmp_path):
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 0] = 255
    loaded = load_image(write_png_rgb(tmp_path / 'red.png', rgb))
    assert tuple(loaded[0, 0]) == (255, 0, 0)


def test_grayscale_becomes_three_equal_channels(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    cv2.imwrite(str(tmp_path / 'g.png'), gray)
    loaded = load_image(tmp_path / 'g.png')
    assert loaded.shape == (3, 4, 3)
    for c in range(3):
        np.testing.assert_array_equal(loaded[..., c], gray)


def test_bgra_drops_alpha(tmp_path):
    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[..., 0] = 10  # B
    bgra[..., 1] = 20  # G
    bgra[..., 2] = 30  # R
    bgra[..., 3] = 0  # fully transparent: colour is kept, not composited
    cv2.imwrite(str(tmp_path / 'a.png'), bgra)
    loaded = load_image(tmp_path / 'a.png')
    assert loaded.shape == (2, 2, 3)
    assert tuple(loaded[1, 1]) == (30, 20, 10)


def test_sixteen_bit_rounds_to_the_nearest_8_bit_level(tmp_path):
    gray16 = np.array([[0, 255, 256, 65535], [1000, 40000, 512, 300]], np.uint16)
    cv2.imwrite(str(tmp_path / 'd.png'), gray16)
    loaded = load_image(tmp_path / 'd.png')
    # x / 257 rounded, as a 16-bit camera message (common/codec.py): 255 -> 0.99 -> 1, 1000 -> 3.89 -> 4.
    np.testing.assert_array_equal(loaded[..., 0], np.array([[0, 1, 1, 255], [4, 156, 2, 1]], np.uint8))


def test_to_rgb8_float_and_rgb_order():
    img = np.array([[[0.0, 0.5, 1.0]]], np.float32)
    np.testing.assert_array_equal(to_rgb8(img, order='rgb'), [[[0, 128, 255]]])
    with pytest.raises(InputError):
        to_rgb8(np.zeros((2, 2, 2), np.uint8))


@pytest.mark.parametrize('kind', ['missing', 'directory', 'empty', 'garbage', 'truncated'])
def test_load_image_bad_input(tmp_path, kind):
    path = tmp_path / 'x.png'
    if kind == 'directory':
        path.mkdir()
    elif kind == 'empty':
        path.write_bytes(b'')
    elif kind == 'garbage':
        path.write_bytes(b'this is not an image at all')
    elif kind == 'truncated':
        ok, buf = cv2.imencode('.png', make_frame(32, 32))
        path.write_bytes(buf.tobytes()[:40])
    with pytest.raises(InputError) as info:
        load_image(path)
    message = str(info.value)
    assert str(path) in message and '\n' not in message
    if kind in ('garbage', 'truncated'):
        assert message.startswith(f'{path}: not a readable image')


def test_a_damaged_png_gives_one_line_and_nothing_from_libpng(tmp_path, capfd):
    ok, buf = cv2.imencode('.png', make_frame(64, 48))
    data = buf.tobytes()
    damaged = {
        f'cut-{n}': data[:n] for n in (9, 40, len(data) // 3, len(data) // 2, len(data) - 12, len(data) - 1)
    }
    for offset in (40, len(data) // 2, len(data) - 30):
        flipped = bytearray(data)
        flipped[offset] ^= 0x55
        damaged[f'flip-{offset}'] = bytes(flipped)
    capfd.readouterr()
    for name, content in damaged.items():
        path = tmp_path / f'{name}.png'
        path.write_bytes(content)
        with pytest.raises(InputError, match='not a readable image'):
            load_image(path)
    # libpng writes its own 'libpng error:' lines straight to the process's stderr.
    assert capfd.readouterr().err == ''
    (tmp_path / 'whole.png').write_bytes(data)
    assert load_image(tmp_path / 'whole.png').shape == (48, 64, 3)


def test_resize_longer_side():
    frame = np.zeros((100, 200, 3), np.uint8)
    assert resize_longer_side(frame, 50).shape == (25, 50, 3)
    assert resize_longer_side(frame, None) is frame
    assert resize_longer_side(frame, 0) is frame
    assert resize_longer_side(frame, 400) is frame
    tall = np.zeros((300, 100, 3), np.uint8)
    assert resize_longer_side(tall, 60).shape == (60, 20, 3)


def test_resize_area_averages():
    frame = np.zeros((2, 4, 3), np.uint8)
    frame[:, :2] = 100  # left half
    frame[:, 2:] = 200
    out = resize_longer_side(frame, 2)
    np.testing.assert_array_equal(out[0, :, 0], [100, 200])


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / 'imgs'
    folder.mkdir()
    for i in range(6):
        write_png_rgb(folder / f'f{i:02d}.png', make_frame(24, 24, seed=i))
    (folder / 'notes.txt').write_text('not an image')
    (folder / 'sub').mkdir()
    return folder


def test_folder_sorted_images_only(folder):
    frames = list(iter_frames([folder]))
    assert [f.id for f in frames] == [f'f{i:02d}' for i in range(6)]
    assert all(isinstance(f, Frame) and f.stamp_ns == 0 for f in frames)
    np.testing.assert_array_equal(frames[3].rgb, make_frame(24, 24, seed=3))


def test_selection_on_folder(folder):
    ids = lambda **kw: [f.id for f in iter_frames(folder, **kw)]  # noqa: E731
    assert ids(every=2) == ['f00', 'f02', 'f04']
    assert ids(max_frames=2) == ['f00', 'f01']
    assert ids(start=2, end=4) == ['f02', 'f03', 'f04']
    assert ids(start=1, every=2) == ['f01', 'f03', 'f05']
    assert ids(max_frames=0) == []


def test_max_frames_spans_sources(folder, tmp_path):
    single = write_png_rgb(tmp_path / 'one.png', make_frame(24, 24))
    ids = [f.id for f in iter_frames([single, folder], max_frames=3)]
    assert ids == ['one', 'f00', 'f01']


def test_iter_frames_is_lazy(folder):
    gen = iter_frames([folder])
    (folder / 'f05.png').write_bytes(b'broken')  # only read when reached
    assert next(gen).id == 'f00'
    with pytest.raises(InputError, match='not a readable image'):
        list(gen)


def test_iter_frames_bad_input(tmp_path):
    with pytest.raises(InputError, match='no such file'):
        list(iter_frames([tmp_path / 'nope.png']))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(InputError, match='holds no images'):
        list(iter_frames([tmp_path / 'empty']))
    with pytest.raises(InputError, match='no frame sources'):
        list(iter_frames([]))
    with pytest.raises(ParameterError):
        list(iter_frames([tmp_path], every=0))
    with pytest.raises(ParameterError):
        list(iter_frames([tmp_path], start=3, end=1))


@pytest.mark.parametrize(
    ('value', 'parsed'),
    [('auto', 'auto'), ('full', None), (None, None), (0, None), ('0', None), (448, 448), ('448', 448)],
)
def test_working_size_settings(value, parsed):
    assert parse_working_size(value) == parsed


@pytest.mark.parametrize('value', ['-1', -5, 'big', 4.5, '', True])
def test_bad_working_sizes_are_refused(value):
    with pytest.raises(ParameterError, match='working size'):
        parse_working_size(value)


def test_auto_working_size_is_twice_the_model_input_side():
    assert working_size_for('auto', 1920, 1080, 224) == 448
    assert working_size_for('auto', 1080, 1920, 384) == 768
    # The shorter side keeps the model's input side on frames wider than 2:1.
    assert working_size_for('auto', 3000, 1000, 224) == 672
    # Model unknown here (behind the ros endpoint): the largest base model's side.
    assert working_size_for('auto', 3840, 2160, 0) == 2 * UNKNOWN_INPUT_SIDE
    # Never enlarged; full and explicit sizes as given.
    assert working_size_for('auto', 400, 300, 224) is None
    assert working_size_for('full', 1920, 1080, 224) is None
    assert working_size_for(640, 1920, 1080, 224) == 640
    assert working_size_for(4000, 1920, 1080, 224) is None


def test_two_folders_of_the_same_file_names_give_each_frame_its_own_id(tmp_path):
    for name in ('dive1', 'dive2'):
        write_frames(tmp_path / name, 2, 32, 24)
    frames = list(iter_frames([tmp_path / 'dive1', tmp_path / 'dive2', tmp_path / 'dive1' / 'frame0.png']))
    assert [f.id for f in frames] == ['frame0', 'frame1', 'frame0~2', 'frame1~2', 'frame0~3']
    assert [Path(f.file).parent.name for f in frames] == ['dive1', 'dive1', 'dive2', 'dive2', 'dive1']
