"""Reading bags (footage/bag_reader.py): selection, encodings, topics, damaged and foreign bags."""

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from metavlm_ros.common.errors import BagError, InputError
from metavlm_ros.footage.bag_format import bag_typestore
from metavlm_ros.footage.bag_reader import (
    iter_bag_frames,
    iter_bag_messages,
    list_image_topics,
    read_ground_truth,
    verify_bag,
)
from metavlm_ros.footage.bag_writer import write_bag
from metavlm_ros.footage.frames import iter_frames
from test.footage.bag_helpers import FPS, compressed, image, stamps, tree_hash, write_custom


def test_selection(mcap_bag):
    def stamps_of(**kw):
        return [f.stamp_ns for f in iter_bag_frames(mcap_bag, **kw)]

    s = stamps()
    assert stamps_of(every=2) == [s[0], s[2], s[4]]
    assert stamps_of(max_frames=2) == s[:2]
    assert stamps_of(start=0.2, end=0.6) == s[1:4]  # seconds after the first message, inclusive
    assert stamps_of(start=0.2, end=0.6, every=2) == [s[1], s[3]]
    assert stamps_of(start=5.0) == []
    # Through iter_frames: the bag directory or its storage file, mixed with other sources.
    assert [f.stamp_ns for f in iter_frames([mcap_bag / 'demo.mcap'], every=2, max_frames=2)] == [s[0], s[2]]
    assert len(list(iter_frames([mcap_bag, mcap_bag], max_frames=7))) == 7


def test_reading_never_modifies_the_bag(tmp_path, scene, mcap_bag):
    sq = write_bag(tmp_path / 'sq', scene, fps=FPS, storage='sqlite3')
    for bag in (mcap_bag, sq):
        before = tree_hash(bag)
        list(iter_bag_frames(bag))
        list(iter_bag_messages(bag))
        read_ground_truth(bag)
        list_image_topics(bag)
        assert tree_hash(bag) == before
        assert sorted(p.name for p in bag.iterdir()) == sorted(before)


@pytest.mark.parametrize(
    ('encoding', 'pixel', 'expected'),
    [
        ('rgb8', [10, 20, 30], (10, 20, 30)),
        ('bgr8', [10, 20, 30], (30, 20, 10)),
        ('rgba8', [10, 20, 30, 0], (10, 20, 30)),
        ('bgra8', [10, 20, 30, 255], (30, 20, 10)),
        ('mono8', [77], (77, 77, 77)),
    ],
)
def test_image_encodings(tmp_path, encoding, pixel, expected):
    n = len(pixel)
    data = np.tile(np.array(pixel, np.uint8), 2 * 3)
    bag = write_custom(
        tmp_path / 'b', [('/cam', 'sensor_msgs/msg/Image', image(encoding, data, 3, 2, 3 * n))]
    )
    (frame,) = iter_bag_frames(bag)
    assert frame.rgb.shape == (2, 3, 3)
    assert tuple(frame.rgb[1, 2]) == expected
    assert frame.stamp_ns == 1_000_000_000 and frame.id == 'b@1000000000'


def test_mono16_rounds_to_the_nearest_8_bit_level(tmp_path):
    values = np.array([0, 255, 256, 65535], np.uint16)
    data = values.view(np.uint8)  # little endian, is_bigendian = 0
    bag = write_custom(tmp_path / 'b', [('/depth', 'sensor_msgs/msg/Image', image('mono16', data, 4, 1, 8))])
    (frame,) = iter_bag_frames(bag)
    # x / 257 rounded (common/codec.py, as the nodes): 255 / 257 = 0.99 -> 1, 256 / 257 -> 1.
    np.testing.assert_array_equal(frame.rgb[0, :, 1], [0, 1, 1, 255])


def test_compressed_png_and_bad_formats(tmp_path):
    bgr = np.zeros((4, 5, 3), np.uint8)
    bgr[..., 2] = 200  # red in OpenCV's BGR
    png = cv2.imencode('.png', bgr)[1].tobytes()
    bag = write_custom(tmp_path / 'ok', [('/c', 'sensor_msgs/msg/CompressedImage', compressed('png', png))])
    (frame,) = iter_bag_frames(bag)
    assert tuple(frame.rgb[0, 0]) == (200, 0, 0) and frame.stamp_ns == 2_000_000_005
    bag = write_custom(
        tmp_path / 'tiff', [('/c', 'sensor_msgs/msg/CompressedImage', compressed('tiff', png))]
    )
    with pytest.raises(InputError, match='unsupported compressed image format'):
        list(iter_bag_frames(bag))
    bag = write_custom(
        tmp_path / 'junk', [('/c', 'sensor_msgs/msg/CompressedImage', compressed('jpeg', b'xx'))]
    )
    with pytest.raises(InputError, match='corrupt or undecodable compressed image'):
        list(iter_bag_frames(bag))


@pytest.mark.parametrize('encoding', ['yuv422', '32FC1', 'bayer_rggb8'])
def test_unsupported_encoding(tmp_path, encoding):
    bag = write_custom(
        tmp_path / 'b', [('/cam', 'sensor_msgs/msg/Image', image(encoding, np.zeros(16, np.uint8), 2, 2, 4))]
    )
    with pytest.raises(InputError, match='unsupported image encoding') as info:
        list(iter_bag_frames(bag))
    assert not isinstance(info.value, BagError)


def test_topic_choice(tmp_path):
    data = np.zeros(2 * 2 * 3, np.uint8)
    t = bag_typestore().types
    status = t['diagnostic_msgs/msg/DiagnosticArray'](
        header=t['std_msgs/msg/Header'](
            stamp=t['builtin_interfaces/msg/Time'](sec=0, nanosec=0), frame_id=''
        ),
        status=[],
    )
    msgs = [
        ('/left', 'sensor_msgs/msg/Image', image('rgb8', data, 2, 2, 6)),
        ('/right', 'sensor_msgs/msg/Image', image('rgb8', data + 9, 2, 2, 6)),
        ('/diag', 'diagnostic_msgs/msg/DiagnosticArray', status),
    ]
    bag = write_custom(tmp_path / 'two', msgs)
    assert list_image_topics(bag) == ['/left', '/right']
    with pytest.raises(BagError, match='several image topics.*/left, /right'):
        list(iter_bag_frames(bag))
    assert iter_bag_frames(bag, '/right').__next__().rgb[0, 0, 0] == 9
    with pytest.raises(BagError, match="no image topic '/diag'; image topics: /left, /right"):
        list(iter_bag_frames(bag, '/diag'))
    with pytest.raises(BagError, match='no topic /nope'):
        list(iter_bag_messages(bag, ['/nope']))
    only_diag = write_custom(tmp_path / 'diag', [msgs[2]])
    with pytest.raises(BagError, match='no image topics'):
        list(iter_bag_frames(only_diag))


def test_corrupt_and_unknown_bags(tmp_path, mcap_bag):
    truncated = tmp_path / 'cut.mcap'
    data = (mcap_bag / 'demo.mcap').read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(BagError) as info:
        list(iter_bag_frames(truncated))
    assert '\n' not in str(info.value) and 'cut.mcap' in str(info.value)
    garbage = tmp_path / 'junk.mcap'
    garbage.write_bytes(b'not a bag at all' * 10)
    with pytest.raises(BagError):
        list(iter_bag_frames(garbage))
    garbage_db = tmp_path / 'junk.db3'
    garbage_db.write_bytes(b'not sqlite' * 10)
    with pytest.raises(BagError):
        list(iter_bag_frames(garbage_db))
    other = tmp_path / 'x.txt'
    other.write_bytes(b'x')
    with pytest.raises(BagError, match='unknown bag storage'):
        list(iter_bag_frames(other))
    ros1 = tmp_path / 'x.bag'
    ros1.write_bytes(b'#ROSBAG V2.0\n')
    with pytest.raises(BagError, match='x.bag: unreadable ROS 1 bag'):
        list(iter_bag_frames(ros1))
    with pytest.raises(BagError, match='no such bag'):
        list(iter_bag_frames(tmp_path / 'missing'))
    (tmp_path / 'emptydir').mkdir()
    with pytest.raises(BagError, match='not a bag'):
        list(iter_bag_frames(tmp_path / 'emptydir'))


def _damaged_copies(bag: Path, tmp_path: Path, scene):
    """Copies of a bag, each with 200 bytes overwritten in one frame's pixels (first, middle or last
    bytes of each frame's payload), as a disk or a copy damages a recording."""
    single = bag.is_file()
    (storage,) = [bag] if single else [p for p in bag.iterdir() if p.suffix in ('.mcap', '.db3')]
    data = storage.read_bytes()
    rng = np.random.default_rng(7)
    for index, (rgb, _) in enumerate(scene):
        pixels = rgb.tobytes()
        offsets = []
        # sqlite3 splits a large row over pages: look for a 256-byte run of the frame's pixels.
        for wanted in (0, len(pixels) // 2, len(pixels) - 2048):
            for start in range(wanted, wanted + 2048, 256):
                found = data.find(pixels[start : start + 256])
                if found >= 0:
                    offsets.append(found + 28)
                    break
        assert len(offsets) == 3, 'raw frames are stored as they are'
        for offset in offsets:
            copy = tmp_path / f'damaged-{storage.suffix[1:]}-{index}-{offset}' / bag.name
            if single:
                copy.parent.mkdir()
                shutil.copy(bag, copy)
            else:
                shutil.copytree(bag, copy)
            with open(copy if single else copy / storage.name, 'r+b') as handle:
                handle.seek(offset)
                handle.write(rng.integers(0, 256, 200, dtype=np.uint8).tobytes())
            yield offset, copy


@pytest.mark.parametrize(
    ('name', 'storage'),
    [('demo', 'mcap'), ('demo', 'sqlite3'), ('demo.mcap', 'mcap'), ('demo.db3', 'sqlite3')],
)
def test_damage_to_any_frame_of_a_written_bag_is_detected(tmp_path, scene, name, storage):
    bag = write_bag(tmp_path / name, scene, fps=FPS, storage=storage)
    verify_bag(bag)
    for offset, copy in _damaged_copies(bag, tmp_path, scene):
        with pytest.raises(BagError) as info:
            verify_bag(copy)
        message = str(info.value)
        assert 'damaged' in message and str(copy) in message and '\n' not in message, offset


def test_damaged_mcap_chunks_fail_while_streaming_too(tmp_path, scene):
    bag = write_bag(tmp_path / 'demo', scene, fps=FPS)
    for _offset, copy in _damaged_copies(bag, tmp_path, scene[:2]):
        with pytest.raises(BagError, match='checksum mismatch'):
            list(iter_bag_frames(copy))


def test_bags_without_our_digest_are_still_read_whole(tmp_path, mcap_bag):
    # Bags recorded by ros2 bag carry no metavlm digest: verification reads them whole all the same.
    pixels = np.zeros((2, 2, 3), np.uint8)
    plain = write_custom(
        tmp_path / 'plain', [('/cam', 'sensor_msgs/msg/Image', image('rgb8', pixels.reshape(-1), 2, 2, 6))]
    )
    verify_bag(plain)
    data = (mcap_bag / 'demo.mcap').read_bytes()
    cut = tmp_path / 'cut.mcap'
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BagError):
        verify_bag(cut)


def test_a_compressed_depth_topic_is_no_camera(tmp_path):
    """A depth camera's image_transport topic beside the colour one (as other tools record them): the
    colour topic stays the bag's only image topic, and its frames read without --topic."""
    data = np.zeros(2 * 2 * 3, np.uint8)
    depth = bytes(12) + cv2.imencode('.png', np.full((2, 2), 1500, np.uint16))[1].tobytes()
    bag = write_custom(
        tmp_path / 'rgbd',
        [
            ('/cam/color/image_raw', 'sensor_msgs/msg/Image', image('rgb8', data, 2, 2, 6)),
            ('/cam/depth/image_rect_raw/compressedDepth', 'sensor_msgs/msg/CompressedImage',
             compressed('16UC1; compressedDepth png', depth)),
        ],
    )  # fmt: skip
    assert list_image_topics(bag) == ['/cam/color/image_raw']
    assert [f.rgb.shape for f in iter_bag_frames(bag)] == [(2, 2, 3)]
