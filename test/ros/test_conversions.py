"""Tests of metavlm_ros.ros.conversions: every encoding, a bag decoded both ways, bad input, predictions."""

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from metavlm_ros.common.codec import JPEG_FORMAT, RAW_ENCODINGS, encode_compressed, reduce_to_8bit
from metavlm_ros.common.errors import InputError
from metavlm_ros.footage.bags import image_message, iter_bag_frames
from metavlm_ros.ros import conversions
from metavlm_ros.ros.bag_player import iter_raw_messages, message_class
from metavlm_ros.ros.conversions import (
    MAX_SIDE,
    array_to_prediction,
    convert_image_msg,
    image_msg_to_rgb,
    latency_of,
    ns_to_stamp,
    prediction_to_array,
    rgb_to_compressed_msg,
    rgb_to_image_msg,
    stamp_to_ns,
)
from test.common.test_codec import fields
from test.footage.bag_helpers import compressed as bag_compressed
from test.footage.bag_helpers import image as bag_image
from test.footage.bag_helpers import write_custom

# A 2x3 frame whose pixels are all different, so any channel or row mix-up shows.
RGB = np.array(
    [[[10, 20, 30], [40, 50, 60], [70, 80, 90]], [[100, 110, 120], [130, 140, 150], [160, 170, 180]]],
    np.uint8,
)


def raw(encoding: str, pixels: np.ndarray, step_padding: int = 0, bigendian: bool = False) -> Image:
    height, width = pixels.shape[:2]
    row = pixels.reshape(height, -1)
    if bigendian:
        row = row.astype(row.dtype.newbyteorder('>'))
    rows = row.view(np.uint8).reshape(height, -1)
    rows = np.concatenate([rows, np.full((height, step_padding), 0xEE, np.uint8)], axis=1)
    msg = Image(
        height=height, width=width, encoding=encoding, is_bigendian=int(bigendian), step=rows.shape[1]
    )
    msg.data = rows.tobytes()
    return msg


def compressed(fmt: str, data: bytes) -> CompressedImage:
    msg = CompressedImage(format=fmt)
    msg.data = data
    return msg


def test_rgb8_is_unchanged():
    out = image_msg_to_rgb(raw('rgb8', RGB))
    assert out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.owndata
    np.testing.assert_array_equal(out, RGB)


def test_bgr8_channels_are_swapped():
    np.testing.assert_array_equal(image_msg_to_rgb(raw('bgr8', RGB[..., ::-1].copy())), RGB)


@pytest.mark.parametrize('encoding', ['rgba8', 'bgra8'])
def test_alpha_is_dropped(encoding):
    colour = RGB if encoding == 'rgba8' else RGB[..., ::-1]
    alpha = np.full(RGB.shape[:2] + (1,), 7, np.uint8)
    np.testing.assert_array_equal(image_msg_to_rgb(raw(encoding, np.concatenate([colour, alpha], 2))), RGB)


def test_mono8_is_replicated():
    grey = np.array([[0, 1, 2], [3, 254, 255]], np.uint8)
    out = image_msg_to_rgb(raw('mono8', grey))
    assert out.shape == (2, 3, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], grey)


@pytest.mark.parametrize('bigendian', [False, True])
def test_mono16_maps_full_range_to_8_bits(bigendian):
    grey = np.array([[0, 257, 1000], [128, 65535, 32896]], np.uint16)
    # value / 257 rounded: 1000/257 = 3.89 -> 4, 128/257 = 0.498 -> 0, 32896/257 = 128
    expected = np.array([[0, 1, 4], [0, 255, 128]], np.uint8)
    out = image_msg_to_rgb(raw('mono16', grey, bigendian=bigendian))
    np.testing.assert_array_equal(out[..., 1], expected)


def test_row_padding_is_dropped():
    np.testing.assert_array_equal(image_msg_to_rgb(raw('rgb8', RGB, step_padding=3)), RGB)


def test_output_does_not_alias_the_message():
    msg = raw('rgb8', RGB)
    out = image_msg_to_rgb(msg)
    out[0, 0] = 0
    np.testing.assert_array_equal(image_msg_to_rgb(msg), RGB)


@pytest.mark.parametrize(
    ('change', 'reason'),
    [
        ({'encoding': 'yuv422'}, 'unsupported image encoding'),
        ({'encoding': ''}, 'unsupported image encoding'),
        ({'width': 0, 'step': 0, 'data': b''}, 'empty image'),
        ({'height': 0, 'data': b''}, 'empty image'),
        ({'step': 8}, 'smaller than a 3-pixel rgb8 row'),
        ({'data': bytes(17)}, r'step\*height is 18'),
        ({'data': bytes(19)}, r'step\*height is 18'),
    ],
)
def test_bad_raw_images_raise_input_error(change, reason):
    msg = raw('rgb8', RGB)
    for key, value in change.items():
        setattr(msg, key, value)
    with pytest.raises(InputError, match=reason):
        image_msg_to_rgb(msg)


def test_png_and_jpeg_decode_to_rgb():
    ok, png = cv2.imencode('.png', cv2.cvtColor(RGB, cv2.COLOR_RGB2BGR))
    assert ok
    np.testing.assert_array_equal(image_msg_to_rgb(compressed('png', png.tobytes())), RGB)
    flat = np.full((16, 16, 3), (200, 40, 90), np.uint8)
    ok, jpeg = cv2.imencode('.jpg', cv2.cvtColor(flat, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    out = image_msg_to_rgb(compressed('jpeg', jpeg.tobytes()))
    assert out.shape == (16, 16, 3)
    # JPEG is lossy; a flat colour survives within a few levels, and R stays the largest channel.
    assert np.abs(out.astype(int) - flat).max() <= 4


def test_grey_png_becomes_three_channels():
    grey = np.array([[0, 100, 200]], np.uint8)
    ok, png = cv2.imencode('.png', grey)
    assert ok
    out = image_msg_to_rgb(compressed('mono8; png compressed', png.tobytes()))
    assert out.shape == (1, 3, 3)
    np.testing.assert_array_equal(out[0, :, 2], [0, 100, 200])


@pytest.mark.parametrize(
    ('fmt', 'data', 'reason'),
    [
        ('jpeg', b'', 'empty compressed image'),
        ('jpeg', b'\xff\xd8\xff\xe0 not really a jpeg', 'corrupt or undecodable'),
        ('png', b'\x89PNG\r\n\x1a\n' + bytes(30), 'corrupt or undecodable'),
        ('16UC1; compressedDepth', b'\x00' * 20, 'compressed depth'),
    ],
)
def test_bad_compressed_images_raise_input_error(fmt, data, reason):
    with pytest.raises(InputError, match=reason):
        image_msg_to_rgb(compressed(fmt, data))


def test_truncated_jpeg_raises_or_decodes_without_crash():
    ok, jpeg = cv2.imencode('.jpg', np.zeros((64, 64, 3), np.uint8))
    assert ok
    try:
        out = image_msg_to_rgb(compressed('jpeg', jpeg.tobytes()[:40]))
    except InputError as exc:
        assert 'corrupt' in str(exc)
    else:
        assert out.shape[2] == 3


def test_frames_above_8k_are_downscaled_and_flagged(monkeypatch):
    monkeypatch.setattr(conversions, 'MAX_SIDE', 8)  # same code path as 7680, on a tiny frame
    wide = np.zeros((4, 16, 3), np.uint8)
    wide[:, 8:] = 200
    out, reduced = convert_image_msg(raw('rgb8', wide), max_side=8)
    assert reduced and out.shape == (2, 8, 3)
    np.testing.assert_array_equal(out[:, :4], 0)
    np.testing.assert_array_equal(out[:, 4:], 200)
    same, reduced = convert_image_msg(raw('rgb8', RGB), max_side=8)
    assert not reduced and same.shape == RGB.shape
    assert MAX_SIDE == 7680


def test_rgb_to_image_msg_round_trips_and_sets_header():
    msg = rgb_to_image_msg(RGB, 5_000_000_007, 'cam')
    assert (msg.encoding, msg.width, msg.height, msg.step) == ('rgb8', 3, 2, 9)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (5, 7, 'cam')
    np.testing.assert_array_equal(image_msg_to_rgb(msg), RGB)
    header = Header(stamp=ns_to_stamp(42), frame_id='probe')
    assert rgb_to_image_msg(RGB, header).header.frame_id == 'probe'
    assert stamp_to_ns(rgb_to_image_msg(RGB, header.stamp).header.stamp) == 42


@pytest.mark.parametrize('bad', [RGB[..., 0], RGB.astype(np.float32), np.zeros((0, 3, 3), np.uint8)])
def test_rgb_to_image_msg_rejects_non_frames(bad):
    with pytest.raises(InputError, match='expected an RGB uint8 frame'):
        rgb_to_image_msg(bad, 0)


def test_stamp_conversions():
    assert stamp_to_ns(ns_to_stamp(1_700_000_000_123_456_789)) == 1_700_000_000_123_456_789
    with pytest.raises(InputError, match='negative stamp'):
        ns_to_stamp(-1)
    with pytest.raises(InputError, match='expected a Header'):
        rgb_to_image_msg(RGB, 'now')


def _prediction(kind, values, text=''):
    from metavlm_ros.method.prediction import Prediction

    return Prediction(kind=kind, values=values, text=text)


def test_confidence_prediction_message_fields_and_round_trip():
    pytest.importorskip('metavlm_ros.models.vlm')
    values = {'animal': 0.25, 'vegetation': 0.1 + 0.2, 'object': -0.0625, 'trash': 1 / 3}
    header = Header(stamp=ns_to_stamp(3_000_000_009), frame_id='cam')
    msg = prediction_to_array(_prediction('confidence', values), header, 'tiny-clip', 12.3456)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (3, 9, 'cam')
    assert len(msg.status) == 1
    status = msg.status[0]
    assert status.name == 'metavlm/prediction' and status.hardware_id == 'tiny-clip'
    assert status.level == DiagnosticStatus.OK
    assert [kv.key for kv in status.values] == [
        'animal',
        'vegetation',
        'object',
        'trash',
        'latency_ms',
        'kind',
    ]
    assert status.values[0].value == '0.25' and status.values[-1].value == 'confidence'
    assert status.values[4].value == '12.346'
    assert status.message == 'animal 0.250, vegetation 0.300, object -0.062, trash 0.333'
    back = array_to_prediction(msg)
    assert back.kind == 'confidence' and back.text == ''
    assert back.values == values  # exact: floats travel as repr
    assert latency_of(msg) == pytest.approx(12.346)


def test_count_prediction_carries_the_text():
    pytest.importorskip('metavlm_ros.models.vlm')
    text = 'Animals: 2 fish Vegetation: None Objects: None Trash: 1 bottle'
    values = {'animal': 2.0, 'vegetation': 0.0, 'object': 0.0, 'trash': 1.0}
    msg = prediction_to_array(_prediction('count', values, text), Header(), 'tiny-blip', 1.0)
    assert msg.status[0].message == text
    assert msg.status[0].values[0].value == '2.0'
    back = array_to_prediction(msg)
    assert (back.kind, back.values, back.text) == ('count', values, text)


def _array(values, name='metavlm/prediction'):
    status = DiagnosticStatus(name=name, values=[KeyValue(key=k, value=v) for k, v in values])
    return DiagnosticArray(status=[status])


@pytest.mark.parametrize(
    ('msg', 'reason'),
    [
        (DiagnosticArray(), 'no .metavlm/prediction. status'),
        (_array([('animal', '1')], name='other'), 'no .metavlm/prediction. status'),
        (_array([('animal', '1')]), 'kind None'),
        (_array([('animal', '1'), ('kind', 'boxes')]), "kind 'boxes'"),
        (_array([('animal', 'many'), ('kind', 'count')]), "class 'animal' is not a number"),
        (_array([('animal', 'nan'), ('kind', 'confidence')]), "class 'animal' is not finite"),
    ],
)
def test_bad_prediction_messages_raise_input_error(msg, reason):
    pytest.importorskip('metavlm_ros.models.vlm')
    with pytest.raises(InputError, match=reason):
        array_to_prediction(msg)


def test_reserved_class_names_are_refused():
    pytest.importorskip('metavlm_ros.models.vlm')
    with pytest.raises(InputError, match='reserved'):
        prediction_to_array(_prediction('confidence', {'kind': 0.5}), Header(), 'm', 0.0)


# -- one bag, both ways: offline (footage/bags.py) and as the player hands it to the nodes ---------


def _bag_image(encoding: str, pixels: np.ndarray, *, padding: int = 0, bigendian: bool = False):
    """A rosbags sensor_msgs/Image of `pixels` in `encoding` (what a recorder wrote)."""
    f = fields(encoding, pixels, padding=padding, bigendian=bigendian)
    msg = bag_image(encoding, np.frombuffer(f['data'], np.uint8), f['width'], f['height'], f['step'])
    msg.is_bigendian = f['is_bigendian']
    return msg


def _both_ways(bag) -> tuple[np.ndarray, np.ndarray]:
    """The bag's one frame read offline and read through rclpy from the CDR bytes the player sends."""
    (offline,) = iter_bag_frames(bag)
    ((_, msgtype, _, raw),) = iter_raw_messages(bag)
    through_nodes, reduced = convert_image_msg(deserialize_message(raw, message_class(msgtype)))
    assert not reduced
    return offline.rgb, through_nodes


@pytest.mark.parametrize('layout', ['plain', 'padded', 'bigendian'])
@pytest.mark.parametrize('encoding', list(RAW_ENCODINGS))
def test_a_bag_decodes_to_the_same_pixels_offline_and_through_the_nodes(tmp_path, encoding, layout):
    channels, depth, _ = RAW_ENCODINGS[encoding]
    rng = np.random.default_rng(len(encoding) + depth)
    # Random values, and for 16 bits a row either side of halfway, where truncating (x >> 8) and
    # rounding part.
    dtype = np.uint16 if depth == 2 else np.uint8
    pixels = rng.integers(0, np.iinfo(dtype).max + 1, (5, 7, channels), dtype=dtype)
    if depth == 2:
        pixels[0, :, :] = np.array([128, 129, 255, 385, 386, 65406, 65407], np.uint16)[:, None]
    msg = _bag_image(
        encoding, pixels, padding=3 if layout == 'padded' else 0, bigendian=layout == 'bigendian'
    )
    bag = write_custom(tmp_path / 'b', [('/camera', 'sensor_msgs/msg/Image', msg)])
    offline, through_nodes = _both_ways(bag)
    assert offline.dtype == through_nodes.dtype == np.uint8
    assert offline.tobytes() == through_nodes.tobytes()
    # And both are the codec's pixels: the nearest 8-bit level, in RGB order.
    expected = reduce_to_8bit(pixels) if depth == 2 else pixels
    if channels == 1:
        expected = np.repeat(expected, 3, axis=2)
    elif RAW_ENCODINGS[encoding][2] == 'bgr':
        expected = expected[..., 2::-1]
    np.testing.assert_array_equal(offline, expected[..., :3])


@pytest.mark.parametrize('kind', ['jpeg', 'png', 'png16'])
def test_a_compressed_bag_decodes_to_the_same_pixels_offline_and_through_the_nodes(tmp_path, kind):
    rng = np.random.default_rng(5)
    grey16 = rng.integers(0, 65536, (6, 8), np.uint16)
    if kind == 'png16':
        fmt, data = 'mono16; png compressed', cv2.imencode('.png', grey16)[1].tobytes()
    else:
        fmt, data = encode_compressed(
            rng.integers(0, 256, (6, 8, 3), np.uint8), 'jpeg' if kind == 'jpeg' else 'png'
        )
    bag = write_custom(
        tmp_path / 'c', [('/camera', 'sensor_msgs/msg/CompressedImage', bag_compressed(fmt, data))]
    )
    offline, through_nodes = _both_ways(bag)
    assert offline.tobytes() == through_nodes.tobytes()
    assert offline.shape == (6, 8, 3)
    if kind == 'png16':  # the 16-bit rule of raw images, not OpenCV's own reduction
        np.testing.assert_array_equal(offline[..., 1], reduce_to_8bit(grey16))


def test_the_launcher_and_bags_write_the_same_compressed_frames():
    y, x = np.mgrid[0:16, 0:24]
    frame = np.stack([x * 10, y * 15, 200 - x * 5], axis=2).astype(np.uint8)  # smooth: JPEG's case
    ours = rgb_to_compressed_msg(frame, 5_000_000_007, 'camera')
    bags = image_message(frame, 5_000_000_007, compressed=True)
    assert ours.format == bags.format == JPEG_FORMAT
    assert bytes(ours.data) == bags.data.tobytes()
    assert stamp_to_ns(ours.header.stamp) == 5_000_000_007 and ours.header.frame_id == 'camera'
    assert np.abs(image_msg_to_rgb(ours).astype(int) - frame).mean() < 3
