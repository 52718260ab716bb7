"""Tests of metavlm_ros.footage.bags: round trips through rosbags and the mcap library, selection, errors."""

import hashlib
import shutil
import sqlite3
from pathlib import Path

import cv2
import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from metavlm_ros.common.errors import BagError, InputError, ParameterError
from metavlm_ros.footage.bags import (
    CAMERA_INFO_TOPIC,
    COMPRESSED_TOPIC,
    DEFAULT_START_NS,
    GROUND_TRUTH_TOPIC,
    IMAGE_TOPIC,
    bag_typestore,
    iter_bag_frames,
    iter_bag_messages,
    list_image_topics,
    read_ground_truth,
    resolve_bag,
    resolve_bag_output,
    verify_bag,
    write_bag,
)
from metavlm_ros.footage.frames import iter_frames
from metavlm_ros.footage.scenes import SceneGenerator

FPS = 5.0
N = 5


@pytest.fixture(scope='module')
def scene():
    gen = SceneGenerator(64, 48, FPS, seed=21, environment='shallow', frames=N)
    return [gen.frame(i) for i in range(N)]


@pytest.fixture(scope='module')
def mcap_bag(tmp_path_factory, scene):
    return write_bag(tmp_path_factory.mktemp('bags') / 'demo', scene, fps=FPS)


def tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob('*'))
        if p.is_file()
    }


def stamps(n: int = N) -> list[int]:
    return [DEFAULT_START_NS + i * 200_000_000 for i in range(n)]


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


def write_custom(path: Path, messages: list[tuple[str, str, object]], storage=StoragePlugin.MCAP) -> Path:
    """A bag of arbitrary (topic, msgtype, message) entries, one per 0.1 s."""
    ts = bag_typestore()
    with Writer(path, version=8, storage_plugin=storage) as writer:
        conns = {}
        for i, (topic, msgtype, msg) in enumerate(messages):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=ts)
            writer.write(conns[topic], DEFAULT_START_NS + i * 100_000_000, ts.serialize_cdr(msg, msgtype))
    return path


def image(encoding: str, data: np.ndarray, width: int, height: int, step: int, stamp_s: int = 1):
    t = bag_typestore().types
    header = t['std_msgs/msg/Header'](
        stamp=t['builtin_interfaces/msg/Time'](sec=stamp_s, nanosec=0), frame_id='cam'
    )
    return t['sensor_msgs/msg/Image'](
        header=header, height=height, width=width, encoding=encoding, is_bigendian=0, step=step, data=data
    )


def compressed(fmt: str, data: bytes):
    t = bag_typestore().types
    header = t['std_msgs/msg/Header'](
        stamp=t['builtin_interfaces/msg/Time'](sec=2, nanosec=5), frame_id='cam'
    )
    return t['sensor_msgs/msg/CompressedImage'](header=header, format=fmt, data=np.frombuffer(data, np.uint8))


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
    with pytest.raises(BagError, match='ROS 1 bag; convert it first'):
        list(iter_bag_frames(ros1))
    with pytest.raises(BagError, match='no such bag'):
        list(iter_bag_frames(tmp_path / 'missing'))
    (tmp_path / 'emptydir').mkdir()
    with pytest.raises(BagError, match='not a bag'):
        list(iter_bag_frames(tmp_path / 'emptydir'))


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


def test_resolve_bag_output(tmp_path):
    assert resolve_bag_output('out/demo.mcap') == (Path('out/demo.mcap'), 'mcap')
    assert resolve_bag_output('demo.db3') == (Path('demo.db3'), 'sqlite3')
    assert resolve_bag_output('demo_bag/') == (Path('demo_bag'), 'mcap')
    assert resolve_bag_output('demo_bag', 'sqlite3') == (Path('demo_bag'), 'sqlite3')
    with pytest.raises(ParameterError):
        resolve_bag_output('demo.mcap', 'sqlite3')
    with pytest.raises(ParameterError):
        resolve_bag_output('demo', 'rosbag1')


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
