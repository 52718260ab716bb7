"""The bag format (footage/bag_format.py): its messages, as ROS reads them, and the names bags answer to."""

from pathlib import Path

import numpy as np
import pytest

from metavlm_ros.common.errors import BagError, ParameterError
from metavlm_ros.footage.bag_format import (
    CAMERA_INFO_TOPIC,
    DEFAULT_START_NS,
    GROUND_TRUTH_TOPIC,
    resolve_bag,
    resolve_bag_output,
)
from metavlm_ros.footage.bag_reader import iter_bag_messages
from metavlm_ros.footage.bag_writer import write_bag
from metavlm_ros.footage.frames import iter_frames
from test.footage.bag_helpers import FPS, N


def test_camera_info_and_ground_truth_messages(mcap_bag, scene):
    messages = list(iter_bag_messages(mcap_bag, [CAMERA_INFO_TOPIC, GROUND_TRUTH_TOPIC]))
    assert len(messages) == 2 * N
    info = next(m for topic, _, _, m in messages if topic == CAMERA_INFO_TOPIC)
    # f = 0.72 * 64 = 46.08; principal point at the centre (63 / 2, 47 / 2).
    np.testing.assert_allclose(info.k, [46.08, 0, 31.5, 0, 46.08, 23.5, 0, 0, 1])
    assert (info.width, info.height, info.distortion_model) == (64, 48, 'plumb_bob')
    diag = next(m for topic, _, _, m in messages if topic == GROUND_TRUTH_TOPIC)
    assert [s.name for s in diag.status] == [
        f'metavlm/ground_truth/{c}' for c in ('animal', 'vegetation', 'object', 'trash')
    ]
    gt0 = scene[0][1]
    for status in diag.status:
        cls = status.name.rsplit('/', 1)[1]
        values = {kv.key: kv.value for kv in status.values}
        assert values['count'] == str(gt0.counts[cls]) == status.message
        assert status.hardware_id == 'shallow'
    # Stamps: every topic of a frame carries the same header stamp as the bag time.
    for _, _, t, msg in messages:
        assert msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec == t


def test_messages_deserialise_with_ros_itself(mcap_bag, scene):
    """The bytes in the bag are what ROS 2 publishes: rclpy's own deserialiser reads them."""
    pytest.importorskip('rclpy')
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.serialization import deserialize_message
    from rosbags.rosbag2 import Reader
    from sensor_msgs.msg import CameraInfo, Image

    classes = {
        'sensor_msgs/msg/Image': Image,
        'sensor_msgs/msg/CameraInfo': CameraInfo,
        'diagnostic_msgs/msg/DiagnosticArray': DiagnosticArray,
    }
    seen = set()
    with Reader(mcap_bag) as reader:
        for conn, timestamp, raw in reader.messages():
            msg = deserialize_message(bytes(raw), classes[conn.msgtype])
            assert msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec == timestamp
            index = (timestamp - DEFAULT_START_NS) // 200_000_000
            if conn.msgtype == 'sensor_msgs/msg/Image':
                assert (msg.encoding, msg.width, msg.height, msg.step) == ('rgb8', 64, 48, 192)
                np.testing.assert_array_equal(
                    np.asarray(msg.data, np.uint8).reshape(48, 64, 3), scene[index][0]
                )
            elif conn.msgtype == 'diagnostic_msgs/msg/DiagnosticArray':
                counts = {s.name.rsplit('/', 1)[1]: int(s.message) for s in msg.status}
                assert counts == scene[index][1].counts
            seen.add(conn.msgtype)
    assert seen == set(classes)


def test_resolve_bag_output(tmp_path):
    assert resolve_bag_output('out/demo.mcap') == (Path('out/demo.mcap'), 'mcap')
    assert resolve_bag_output('demo.db3') == (Path('demo.db3'), 'sqlite3')
    assert resolve_bag_output('demo_bag/') == (Path('demo_bag'), 'mcap')
    assert resolve_bag_output('demo_bag', 'sqlite3') == (Path('demo_bag'), 'sqlite3')
    with pytest.raises(ParameterError):
        resolve_bag_output('demo.mcap', 'sqlite3')
    with pytest.raises(ParameterError):
        resolve_bag_output('demo', 'rosbag1')


@pytest.mark.parametrize('suffix', ['.mcap', '.db3'])
def test_a_single_file_bag_and_an_older_bag_directory_answer_to_the_same_name(tmp_path, scene, suffix):
    storage = 'mcap' if suffix == '.mcap' else 'sqlite3'
    single = write_bag(tmp_path / 'new' / f'dive{suffix}', scene, fps=FPS, storage=storage)
    assert single == tmp_path / 'new' / f'dive{suffix}' and single.is_file()
    assert resolve_bag(single) == single
    # What `scenes --out dive.mcap` wrote before: the directory dive/ holding dive/dive.mcap.
    older = write_bag(tmp_path / 'old' / 'dive', scene, fps=FPS, storage=storage)
    assert resolve_bag(tmp_path / 'old' / f'dive{suffix}') == older
    for name in (single, tmp_path / 'old' / f'dive{suffix}'):
        frames = list(iter_frames([name]))
        assert [f.id.split('@')[0] for f in frames] == ['dive'] * len(scene)
    with pytest.raises(BagError, match='no such bag'):
        resolve_bag(tmp_path / 'old' / 'other.mcap')
    with pytest.raises(ParameterError, match='sqlite3 storage'):
        write_bag(tmp_path / 'x.db3', scene, fps=FPS, storage='mcap')
