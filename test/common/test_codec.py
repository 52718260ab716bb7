"""Tests of metavlm_ros.common.codec: every encoding, the 16-bit rule, JPEG and PNG, bad input."""

import cv2
import numpy as np
import pytest

from metavlm_ros.common.codec import (
    JPEG_FORMAT,
    JPEG_QUALITY,
    PNG_FORMAT,
    RAW_ENCODINGS,
    decode_compressed,
    decode_raw,
    encode_compressed,
    encode_raw,
    reduce_to_8bit,
    to_rgb8,
)
from metavlm_ros.common.errors import InputError

# A 2x3 frame whose pixels all differ, so any channel or row mix-up shows.
RGB = np.array(
    [[[10, 20, 30], [40, 50, 60], [70, 80, 90]], [[100, 110, 120], [130, 140, 150], [160, 170, 180]]],
    np.uint8,
)


def fields(encoding: str, pixels: np.ndarray, *, padding: int = 0, bigendian: bool = False) -> dict:
    """The Image fields of `pixels` (H, W, C) in `encoding`, rows padded by `padding` bytes of 0xEE."""
    height, width = pixels.shape[:2]
    row = pixels.reshape(height, -1)
    if bigendian:
        row = row.astype(row.dtype.newbyteorder('>'))
    rows = row.view(np.uint8).reshape(height, -1)
    rows = np.concatenate([rows, np.full((height, padding), 0xEE, np.uint8)], axis=1)
    return {
        'encoding': encoding,
        'width': width,
        'height': height,
        'step': rows.shape[1],
        'is_bigendian': int(bigendian),
        'data': rows.tobytes(),
    }


def as_encoding(encoding: str, rgb: np.ndarray) -> np.ndarray:
    """`rgb` laid out as `encoding` stores it: channel order, alpha 7, 16 bits as 257 * v (exact)."""
    channels, depth, order = RAW_ENCODINGS[encoding]
    if channels == 1:
        pixels = rgb[..., :1]
    else:
        pixels = rgb if order == 'rgb' else rgb[..., ::-1]
        if channels == 4:
            pixels = np.concatenate([pixels, np.full(rgb.shape[:2] + (1,), 7, np.uint8)], axis=2)
    return (pixels.astype(np.uint16) * 257) if depth == 2 else np.ascontiguousarray(pixels)


def test_the_16_bit_rule_is_the_nearest_8_bit_level():
    # Hand-computed: x / 257 rounded. 128 / 257 = 0.498 -> 0, 129 -> 0.502 -> 1, 385 -> 1.498 -> 1,
    # 386 -> 1.502 -> 2, 32767 -> 127.498 -> 127, 32768 -> 127.502 -> 128, 65406 -> 254.498 -> 254.
    x = np.array([0, 128, 129, 255, 256, 385, 386, 1000, 32767, 32768, 32896, 65406, 65407, 65535], np.uint16)
    expected = [0, 0, 1, 1, 1, 1, 2, 4, 127, 128, 128, 254, 255, 255]
    out = reduce_to_8bit(x)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)
    # Every 16-bit value goes to the level v whose 257 * v is nearest (never halfway: 257 is odd).
    every = np.arange(65536, dtype=np.int64)
    levels = reduce_to_8bit(every.astype(np.uint16)).astype(np.int64)
    assert np.all(np.abs(every - 257 * levels) <= 128)


@pytest.mark.parametrize('encoding', list(RAW_ENCODINGS))
def test_every_encoding_decodes_to_rgb(encoding):
    channels = RAW_ENCODINGS[encoding][0]
    expected = RGB if channels > 1 else np.repeat(RGB[..., :1], 3, axis=2)
    out = decode_raw(**fields(encoding, as_encoding(encoding, RGB)))
    assert out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.owndata
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize('encoding', [e for e, (_, depth, _) in RAW_ENCODINGS.items() if depth == 2])
def test_16_bit_encodings_round_in_either_byte_order_with_padded_rows(encoding):
    channels = RAW_ENCODINGS[encoding][0]
    values = np.array([[128, 129, 385], [386, 65406, 65407]], np.uint16)
    pixels = np.repeat(values[..., None], channels, axis=2)
    expected = np.repeat(np.array([[0, 1, 1], [2, 254, 255]], np.uint8)[..., None], 3, axis=2)
    for bigendian in (False, True):
        out = decode_raw(**fields(encoding, pixels, padding=5, bigendian=bigendian))
        np.testing.assert_array_equal(out, expected)


def test_padding_is_dropped_and_the_buffer_is_not_aliased():
    data = bytearray(fields('rgb8', RGB, padding=3)['data'])
    out = decode_raw('rgb8', 3, 2, 12, 0, data)
    np.testing.assert_array_equal(out, RGB)
    data[0] = 255  # the frame owns its pixels: changing the message afterwards changes nothing
    assert out[0, 0, 0] == 10


@pytest.mark.parametrize(
    ('change', 'reason'),
    [
        ({'encoding': 'yuv422'}, "unsupported image encoding 'yuv422' \\(supported: rgb8, bgr8"),
        ({'encoding': 'RGB8'}, 'unsupported image encoding'),
        ({'encoding': 'bayer_rggb8'}, 'unsupported image encoding'),
        ({'width': 0, 'step': 0, 'data': b''}, r'empty image \(0x2\)'),
        ({'height': 0, 'data': b''}, 'empty image'),
        ({'step': 8}, 'image step 8 is smaller than a 3-pixel rgb8 row \\(9 bytes\\)'),
        ({'data': bytes(17)}, r'image data has 17 bytes but step\*height is 18'),
        ({'data': bytes(19)}, r'step\*height is 18'),
    ],
)
def test_bad_raw_images_are_one_line_input_errors(change, reason):
    with pytest.raises(InputError, match=reason) as info:
        decode_raw(**{**fields('rgb8', RGB), **change})
    assert '\n' not in str(info.value)


def test_encode_raw_round_trips_as_rgb8():
    raw = encode_raw(RGB)
    assert (raw.encoding, raw.width, raw.height, raw.step, raw.is_bigendian) == ('rgb8', 3, 2, 9, 0)
    assert raw.data == RGB.tobytes()
    np.testing.assert_array_equal(decode_raw(**vars(raw)), RGB)


@pytest.mark.parametrize(
    'bad', [np.zeros((2, 2), np.uint8), np.zeros((2, 2, 3), np.float32), np.zeros((0, 2, 3))]
)
def test_encoders_refuse_what_is_not_an_rgb_frame(bad):
    with pytest.raises(InputError, match='expected an RGB uint8 frame'):
        encode_raw(bad)
    with pytest.raises(InputError, match='expected an RGB uint8 frame'):
        encode_compressed(bad)


def test_jpeg_round_trip_and_format():
    rng = np.random.default_rng(3)
    # A smooth frame (JPEG's case): a gradient plus a little noise.
    y, x = np.mgrid[0:48, 0:64]
    frame = np.stack([x * 4, y * 5, (x + y) * 2], axis=2) + rng.integers(0, 3, (48, 64, 3))
    frame = np.clip(frame, 0, 255).astype(np.uint8)
    fmt, data = encode_compressed(frame)
    assert fmt == JPEG_FORMAT == 'rgb8; jpeg compressed bgr8'
    assert JPEG_QUALITY == 90
    assert data[:2] == b'\xff\xd8'  # a JPEG stream
    out = decode_compressed(fmt, data)
    assert out.shape == frame.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - frame).mean() < 2
    # Channels not swapped: red still dominates where the frame is red.
    assert out[5, 60, 0] > out[5, 60, 2]
    # The same bytes as OpenCV at the one quality (bags keep their bytes).
    expected = cv2.imencode('.jpg', cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
    assert data == expected.tobytes()


def test_png_round_trip_is_exact():
    fmt, data = encode_compressed(RGB, 'png')
    assert fmt == PNG_FORMAT == 'rgb8; png compressed bgr8'
    np.testing.assert_array_equal(decode_compressed(fmt, data), RGB)
    with pytest.raises(InputError, match="unknown compressed image kind 'gif'"):
        encode_compressed(RGB, 'gif')


@pytest.mark.parametrize(
    'fmt', ['', 'jpeg', 'JPG', 'png', 'rgb8; png compressed bgr8', 'mono8; png compressed']
)
def test_compressed_formats_that_name_jpeg_or_png_or_nothing_decode(fmt):
    grey = np.array([[0, 100, 200]], np.uint8)
    out = decode_compressed(fmt, cv2.imencode('.png', grey)[1].tobytes())
    np.testing.assert_array_equal(out, np.repeat(grey[..., None], 3, axis=2))


def test_16_bit_and_alpha_pngs_follow_the_codec_rules():
    grey16 = np.array([[128, 129, 65406, 65407]], np.uint16)
    out = decode_compressed('png', cv2.imencode('.png', grey16)[1].tobytes())
    np.testing.assert_array_equal(out[..., 0], [[0, 1, 254, 255]])
    bgra = np.concatenate([RGB[..., ::-1], np.full((2, 3, 1), 9, np.uint8)], axis=2)
    np.testing.assert_array_equal(decode_compressed('png', cv2.imencode('.png', bgra)[1].tobytes()), RGB)


@pytest.mark.parametrize(
    ('fmt', 'data', 'reason'),
    [
        ('jpeg', b'', "empty compressed image \\(format 'jpeg'\\)"),
        ('jpeg', b'\xff\xd8\xff\xe0 not really a jpeg', 'corrupt or undecodable compressed image'),
        ('png', b'\x89PNG\r\n\x1a\n' + bytes(30), 'corrupt or undecodable'),
        ('16UC1; compressedDepth png', b'\x00' * 20, 'compressed depth images are not camera frames'),
        ('tiff', b'II*\x00', "unsupported compressed image format 'tiff' \\(expected jpeg or png\\)"),
    ],
)
def test_bad_compressed_images_are_one_line_input_errors(fmt, data, reason):
    with pytest.raises(InputError, match=reason) as info:
        decode_compressed(fmt, data)
    assert '\n' not in str(info.value)


def test_to_rgb8_takes_strided_views_in_either_order():
    bgra = np.arange(4 * 6 * 4, dtype=np.uint8).reshape(4, 6, 4)
    view = bgra[:, ::2]  # every other column: not contiguous
    np.testing.assert_array_equal(to_rgb8(view, order='bgr'), view[..., 2::-1])
    np.testing.assert_array_equal(to_rgb8(view, order='rgb'), view[..., :3])
    assert to_rgb8(view).flags.c_contiguous
