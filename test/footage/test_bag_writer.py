"""Writing bags (footage/bag_writer.py): round trips (rosbags, mcap), storages, checksums, overwrite."""

import sqlite3

import numpy as np
import pytest

from metavlm_ros.common.errors import InputError
from metavlm_ros.footage.bag_format import (
    CAMERA_INFO_TOPIC,
    COMPRESSED_TOPIC,
    GROUND_TRUTH_TOPIC,
    IMAGE_TOPIC,
    bag_typestore,
)
from metavlm_ros.footage.bag_reader import (
    iter_bag_frames,
    iter_bag_messages,
    list_image_topics,
    read_ground_truth,
)
from metavlm_ros.footage.bag_writer import write_bag
from test.footage.bag_helpers import FPS, N, stamps, tree_hash


def test_mcap_layout_and_rosbags_round_trip(mcap_bag, scene):
    assert sorted(p.name for p in mcap_bag.iterdir()) == ['demo.mcap', 'metadata.yaml']
    assert list_image_topics(mcap_bag) == [IMAGE_TOPIC]
    frames = list(iter_bag_frames(mcap_bag))
    assert [f.stamp_ns for f in frames] == stamps()
    assert [f.id for f in frames] == [f'demo@{s}' for s in stamps()]
    for frame, (rgb, _) in zip(frames, scene, strict=True):
        np.testing.assert_array_equal(frame.rgb, rgb)
    truth = read_ground_truth(mcap_bag)
    assert [s for s, _ in truth] == stamps()
    assert [gt.to_dict() for _, gt in truth] == [gt.to_dict() for _, gt in scene]


def test_mcap_library_reads_the_bag(mcap_bag, scene):
    from mcap.reader import make_reader

    typestore = bag_typestore()
    per_topic: dict[str, int] = {}
    schemas = {}
    decoded = []
    with open(mcap_bag / 'demo.mcap', 'rb') as stream:
        reader = make_reader(stream)
        for schema, channel, message in reader.iter_messages():
            per_topic[channel.topic] = per_topic.get(channel.topic, 0) + 1
            schemas[channel.topic] = (schema.name, schema.encoding, channel.message_encoding)
            if channel.topic == IMAGE_TOPIC:
                msg = typestore.deserialize_cdr(message.data, schema.name)
                assert message.log_time == message.publish_time
                decoded.append(np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.width, 3))
    assert per_topic == {IMAGE_TOPIC: N, CAMERA_INFO_TOPIC: N, GROUND_TRUTH_TOPIC: N}
    assert schemas[IMAGE_TOPIC] == ('sensor_msgs/msg/Image', 'ros2msg', 'cdr')
    assert schemas[CAMERA_INFO_TOPIC][0] == 'sensor_msgs/msg/CameraInfo'
    assert schemas[GROUND_TRUTH_TOPIC][0] == 'diagnostic_msgs/msg/DiagnosticArray'
    for pixels, (rgb, _) in zip(decoded, scene, strict=True):
        np.testing.assert_array_equal(pixels, rgb)


def test_sqlite3_and_compressed(tmp_path, scene):
    bag = write_bag(tmp_path / 'c', scene, fps=FPS, storage='sqlite3', compressed=True)
    assert sorted(p.name for p in bag.iterdir()) == ['c.db3', 'metadata.yaml']
    with sqlite3.connect(f'file:{bag / "c.db3"}?mode=ro', uri=True) as db:
        topics = dict(db.execute('select name, type from topics'))
        (count,) = db.execute('select count(*) from messages').fetchone()
    assert topics[COMPRESSED_TOPIC] == 'sensor_msgs/msg/CompressedImage'
    assert count == 3 * N
    assert list_image_topics(bag) == [COMPRESSED_TOPIC]
    frames = list(iter_bag_frames(bag / 'c.db3'))
    assert [f.stamp_ns for f in frames] == stamps()
    for frame, (rgb, _) in zip(frames, scene, strict=True):
        # JPEG at quality 90: close to, not equal to, the source.
        assert frame.rgb.shape == rgb.shape
        assert np.abs(frame.rgb.astype(int) - rgb).mean() < 4
    s = stamps()
    assert [f.stamp_ns for f in iter_bag_frames(bag, start=0.2, end=0.6, every=2)] == [s[1], s[3]]
    fmt = next(m.format for topic, _, _, m in iter_bag_messages(bag, [COMPRESSED_TOPIC]))
    assert 'jpeg' in fmt
    assert len(read_ground_truth(bag)) == N


def test_overwrite_rules(tmp_path, scene):
    bag = write_bag(tmp_path / 'b', scene[:2], fps=FPS)
    before = tree_hash(bag)
    with pytest.raises(InputError, match='already exists'):
        write_bag(bag, scene, fps=FPS)
    assert tree_hash(bag) == before
    write_bag(bag, scene, fps=FPS, overwrite=True)
    assert len(list(iter_bag_frames(bag))) == N
    precious = tmp_path / 'precious'
    precious.mkdir()
    (precious / 'notes.txt').write_text('keep me')
    with pytest.raises(InputError, match='not a bag'):
        write_bag(precious, scene, fps=FPS, overwrite=True)
    assert (precious / 'notes.txt').read_text() == 'keep me'
    # A failed write leaves nothing behind: no bag, no staging directory.
    with pytest.raises(InputError, match='frame 1'):
        write_bag(tmp_path / 'bad', [scene[0], (np.zeros((4, 4), np.uint8), None)], fps=FPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['b', 'precious']


def test_mcap_chunks_carry_their_crc_and_the_mcap_library_checks_it(mcap_bag):
    from mcap.records import Chunk
    from mcap.stream_reader import StreamReader

    with open(mcap_bag / 'demo.mcap', 'rb') as stream:
        chunks = [
            r
            for r in StreamReader(stream, emit_chunks=True, validate_crcs=True).records
            if isinstance(r, Chunk)
        ]
    assert chunks and all(c.uncompressed_crc != 0 for c in chunks)
