"""ROS 1 bags read where rosbag2 bags are (footage/bag_reader.py): written as a Noetic robot records them."""

import numpy as np
import pytest

from metavlm_ros.common.errors import BagError
from metavlm_ros.footage.bag_reader import iter_bag_frames, iter_bag_messages, list_image_topics, verify_bag
from metavlm_ros.footage.frames import iter_frames, verify_sources
from test.footage.bag_helpers import (
    NOETIC,
    N,
    noetic_image,
    stamps,
    tree_hash,
    write_ros1,
    write_ros1_scene,
)


@pytest.fixture(scope='module')
def ros1_bag(tmp_path_factory, scene):
    return write_ros1_scene(tmp_path_factory.mktemp('ros1') / 'dive.bag', scene)


def test_frames_pixels_stamps_and_positions(ros1_bag, scene):
    before = tree_hash(ros1_bag.parent)
    frames = list(iter_frames([ros1_bag]))
    assert [f.stamp_ns for f in frames] == stamps()
    assert [f.id for f in frames] == [f'dive@{s}' for s in stamps()]
    assert [f.index for f in frames] == list(range(N)) and {f.file for f in frames} == {str(ros1_bag)}
    for frame, (rgb, _) in zip(frames, scene, strict=True):
        np.testing.assert_array_equal(frame.rgb, rgb)  # bgr8 on the wire, RGB here
    assert tree_hash(ros1_bag.parent) == before  # read-only
    verify_bag(ros1_bag)
    verify_sources([ros1_bag])


@pytest.mark.parametrize('compression', ['bz2', 'lz4'])
def test_bags_recorded_with_compressed_chunks(tmp_path, scene, compression):
    bag = write_ros1_scene(tmp_path / f'{compression}.bag', scene, compression=compression)
    verify_bag(bag)
    frames = list(iter_frames([bag], start=0.4))
    assert [f.index for f in frames] == [2, 3, 4] and [f.stamp_ns for f in frames] == stamps()[2:]
    np.testing.assert_array_equal(frames[0].rgb, scene[2][0])


def test_selection_as_for_rosbag2_bags(ros1_bag):
    def picked(**kw):
        return [(f.index, f.stamp_ns) for f in iter_bag_frames(ros1_bag, **kw)]

    s = stamps()
    assert picked(every=2) == [(0, s[0]), (2, s[2]), (4, s[4])]
    assert picked(max_frames=2) == [(0, s[0]), (1, s[1])]
    # Seconds after the first message, inclusive; the index counts from the topic's first message.
    assert picked(start=0.2, end=0.6) == [(1, s[1]), (2, s[2]), (3, s[3])]
    assert picked(start=0.2, end=0.6, every=2) == [(1, s[1]), (3, s[3])]
    assert picked(start=5.0) == []


def test_compressed_images_and_topic_choice(tmp_path, scene):
    bag = write_ros1_scene(tmp_path / 'jpeg.bag', scene, compressed=True)
    assert list_image_topics(bag) == ['/camera/image_raw/compressed']
    frames = list(iter_bag_frames(bag))
    assert len(frames) == N
    # JPEG at quality 95: close to the scene, not equal.
    assert np.abs(frames[0].rgb.astype(int) - scene[0][0].astype(int)).mean() < 4
    bgr = np.zeros((4, 6, 3), np.uint8)
    two = write_ros1(
        tmp_path / 'two.bag',
        [
            ('/left/image_raw', 'sensor_msgs/msg/Image', 10**9, noetic_image(bgr, 10**9)),
            ('/right/image_raw', 'sensor_msgs/msg/Image', 2 * 10**9, noetic_image(bgr + 9, 2 * 10**9)),
        ],
    )
    with pytest.raises(BagError, match='several image topics.*/left/image_raw, /right/image_raw'):
        list(iter_bag_frames(two))
    (right,) = iter_bag_frames(two, '/right/image_raw')
    assert right.rgb[0, 0, 0] == 9 and right.stamp_ns == 2 * 10**9


def test_a_header_stamp_of_zero_takes_the_bag_time(tmp_path):
    bag = write_ros1(
        tmp_path / 'nostamp.bag',
        [('/cam', 'sensor_msgs/msg/Image', 5 * 10**9, noetic_image(np.zeros((2, 2, 3), np.uint8), 0))],
    )
    (frame,) = iter_bag_frames(bag)
    assert frame.stamp_ns == 5 * 10**9


def test_messages_keep_their_ros1_fields(ros1_bag):
    topic, msgtype, timestamp, msg = next(iter_bag_messages(ros1_bag))
    assert (topic, msgtype, timestamp) == ('/camera/image_raw', 'sensor_msgs/msg/Image', stamps()[0])
    assert msg.header.seq == 0 and msg.encoding == 'bgr8'


def test_bad_ros1_bags_are_one_line(tmp_path, ros1_bag):
    status = NOETIC.types['std_msgs/msg/String'](data='no camera here')
    no_images = write_ros1(tmp_path / 'strings.bag', [('/note', 'std_msgs/msg/String', 10**9, status)])
    with pytest.raises(BagError, match=r'strings.bag: no image topics \(sensor_msgs/Image or'):
        list(iter_frames([no_images]))
    data = ros1_bag.read_bytes()
    cut = tmp_path / 'cut.bag'
    cut.write_bytes(data[: len(data) // 2])
    for bad in (cut, tmp_path / 'junk.bag'):
        if bad.name == 'junk.bag':
            bad.write_bytes(b'not a bag at all' * 64)
        with pytest.raises(BagError) as info:
            verify_sources([bad])
        message = str(info.value)
        assert message.startswith(f'{bad}: ') and 'ROS 1 bag' in message and '\n' not in message
    with pytest.raises(BagError, match='no such bag'):
        list(iter_frames([tmp_path / 'missing.bag']))
