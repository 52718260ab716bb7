"""A ROS 1 bag in an export (viewer/bag_merge.py): frames checked by hash, messages copied as ROS 2 CDR."""

import foxglove
import numpy as np
import pytest

from metavlm_ros.common.errors import InputError
from metavlm_ros.footage.bag_format import bag_typestore
from metavlm_ros.footage.bag_writer import write_bag
from metavlm_ros.footage.frames import frame_digest, iter_frames
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.viewer.bag_merge import check_bag_frames, merge_bag
from test.viewer.mcap_decode import read_mcap


@pytest.fixture(scope='module')
def ros1_bag(tmp_path_factory):
    generator = SceneGenerator(32, 24, 5.0, seed=3, environment='pool', frames=3)
    return write_bag(tmp_path_factory.mktemp('ros1') / 'dive.bag', generator, fps=5.0)


def test_frames_of_a_ros1_bag_are_matched_by_stamp_and_hash(ros1_bag):
    frames = list(iter_frames([ros1_bag]))
    wanted = {f.stamp_ns: frame_digest(f.rgb) for f in frames[1:]}
    assert sorted(check_bag_frames(ros1_bag, wanted)) == sorted(wanted)
    with pytest.raises(InputError, match='does not match the results'):
        check_bag_frames(ros1_bag, {frames[0].stamp_ns: '0' * 16})


def test_a_ros1_bags_messages_are_copied_as_their_ros2_types(ros1_bag, tmp_path):
    context = foxglove.Context()
    out = tmp_path / 'merged.mcap'
    writer = foxglove.open_mcap(out, context=context)
    try:
        copied = merge_bag(ros1_bag, context)
    finally:
        writer.close()
    assert copied == 9  # image, camera info and ground truth of 3 frames
    topics = read_mcap(out)['topics']
    typestore = bag_typestore()
    (_time, data, schema) = topics['/camera/image_raw'][0]
    assert schema.name == 'sensor_msgs/msg/Image' and 'seq' not in schema.data.decode()
    image = typestore.deserialize_cdr(data, 'sensor_msgs/msg/Image')
    first = next(iter_frames([ros1_bag]))
    assert image.encoding == 'rgb8' and image.header.frame_id == 'camera'
    np.testing.assert_array_equal(image.data.reshape(24, 32, 3), first.rgb)
    (_time, data, _schema) = topics['/camera/camera_info'][0]
    info = typestore.deserialize_cdr(data, 'sensor_msgs/msg/CameraInfo')
    assert info.width == 32 and info.k[0] == pytest.approx(0.72 * 32)


def test_a_depth_image_at_the_frames_stamp_is_no_frame(tmp_path):
    """A compressedDepth message logged before its camera image, at the image's stamp (as other tools may
    record them): the frame is still the camera's, the depth never taken for it."""
    from metavlm_ros.footage.bag_reader import COMPRESSED_DEPTH_FORMAT, RANGES_TOPIC, compressed_depth_data
    from test.conftest import make_frame
    from test.footage.bag_helpers import image, write_custom

    rgb = make_frame(32, 24, seed=4)
    frame = image('rgb8', rgb.reshape(-1), 32, 24, 96, stamp_s=1)
    types = bag_typestore().types
    depth = types['sensor_msgs/msg/CompressedImage'](
        header=frame.header,
        format=COMPRESSED_DEPTH_FORMAT,
        data=np.frombuffer(compressed_depth_data(np.full((24, 32), 2.5)), np.uint8),
    )
    bag = write_custom(
        tmp_path / 'depth_first',
        [
            (RANGES_TOPIC, 'sensor_msgs/msg/CompressedImage', depth),
            ('/camera/image_raw', 'sensor_msgs/msg/Image', frame),
        ],
    )
    found = check_bag_frames(bag, {1_000_000_000: frame_digest(rgb)})
    assert list(found) == [1_000_000_000]
