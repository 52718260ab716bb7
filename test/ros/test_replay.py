"""`metavlm replay`: bags written here replayed to real rclpy subscribers: stamps, spacing, /clock, errors."""

import threading
from pathlib import Path

import numpy as np
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image
from std_msgs.msg import String

from metavlm_ros import cli
from metavlm_ros.common.errors import BagError
from metavlm_ros.ros.bag_player import bag_topics, iter_raw_messages, replay_bag
from metavlm_ros.ros.conversions import image_msg_to_rgb, stamp_to_ns
from test.ros.helpers import TopicCollector, ros_context, wait_for

TYPESTORE = get_typestore(Stores.LATEST)
T0 = 1_700_000_000_000_000_000  # bag time of the first message
SPACING_NS = 100_000_000  # 10 Hz camera
N_FRAMES = 6
# Header stamps differ from bag (log) times, so the test tells them apart.
STAMP_OFFSET_NS = -7_000_123


def _image(i: int):
    cls = TYPESTORE.types['sensor_msgs/msg/Image']
    header_cls = TYPESTORE.types['std_msgs/msg/Header']
    time_cls = TYPESTORE.types['builtin_interfaces/msg/Time']
    stamp = T0 + i * SPACING_NS + STAMP_OFFSET_NS
    pixels = np.full((4, 6, 3), i * 10, np.uint8)
    header = header_cls(stamp=time_cls(sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id='camera')
    return cls(
        header=header, height=4, width=6, encoding='rgb8', is_bigendian=0, step=18, data=pixels.reshape(-1)
    )


def _string(text: str):
    return TYPESTORE.types['std_msgs/msg/String'](data=text)


def messages():
    """(topic, msgtype, bag time, rosbags message): six frames and two strings in between."""
    out = [
        ('/camera/image_raw', 'sensor_msgs/msg/Image', T0 + i * SPACING_NS, _image(i))
        for i in range(N_FRAMES)
    ]
    out.append(('/note', 'std_msgs/msg/String', T0 + 150_000_000, _string('after frame 1')))
    out.append(('/note', 'std_msgs/msg/String', T0 + 350_000_000, _string('after frame 3')))
    return sorted(out, key=lambda m: m[2])


def write_rosbag2(path: Path, storage: StoragePlugin = StoragePlugin.MCAP) -> Path:
    with Writer(path, version=9, storage_plugin=storage) as writer:
        connections = {}
        for topic, msgtype, stamp, msg in messages():
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, msgtype, typestore=TYPESTORE)
            writer.write(connections[topic], stamp, TYPESTORE.serialize_cdr(msg, msgtype))
    return path


def write_bare_mcap(path: Path) -> Path:
    from mcap.writer import Writer as McapWriter

    with path.open('wb') as stream:
        writer = McapWriter(stream)
        writer.start(profile='ros2', library='metavlm_ros tests')
        channels = {}
        for topic, msgtype, stamp, msg in messages():
            if topic not in channels:
                msgdef, _ = TYPESTORE.generate_msgdef(msgtype, ros_version=2)
                schema = writer.register_schema(msgtype, 'ros2msg', msgdef.encode())
                channels[topic] = writer.register_channel(topic, 'cdr', schema)
            writer.add_message(channels[topic], stamp, TYPESTORE.serialize_cdr(msg, msgtype), stamp)
        writer.finish()
    return path


def write_ros1_bag(path: Path) -> Path:
    """The same messages in a ROS 1 bag, as a Noetic robot records them (Noetic types, header seq)."""
    from rosbags.rosbag1 import Writer as Writer1

    noetic = get_typestore(Stores.ROS1_NOETIC)
    t = noetic.types
    with Writer1(path) as writer:
        connections = {}
        for seq, (topic, msgtype, stamp, msg) in enumerate(messages()):
            if msgtype == 'sensor_msgs/msg/Image':
                header = t['std_msgs/msg/Header'](
                    seq=seq,
                    stamp=t['builtin_interfaces/msg/Time'](
                        sec=msg.header.stamp.sec, nanosec=msg.header.stamp.nanosec
                    ),
                    frame_id=msg.header.frame_id,
                )
                fields = {
                    k: getattr(msg, k)
                    for k in ('height', 'width', 'encoding', 'is_bigendian', 'step', 'data')
                }
                msg = t[msgtype](header=header, **fields)
            else:
                msg = t[msgtype](data=msg.data)
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, msgtype, typestore=noetic)
            writer.write(connections[topic], stamp, noetic.serialize_ros1(msg, msgtype))
    return path


@pytest.fixture
def bag(tmp_path) -> Path:
    return write_rosbag2(tmp_path / 'dive')


def _replay_in_thread(context, bag_path, **kwargs):
    result = {}

    def target():
        try:
            result['stats'] = replay_bag(bag_path, context, wait_for_subscribers_s=5.0, **kwargs)
        except Exception as exc:  # surfaced by the test below
            result['error'] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def test_bag_topics_and_raw_messages(bag):
    assert bag_topics(bag) == {'/camera/image_raw': 'sensor_msgs/msg/Image', '/note': 'std_msgs/msg/String'}
    raw = list(iter_raw_messages(bag, ['/note']))
    assert [(t, s) for t, _, s, _ in raw] == [('/note', T0 + 150_000_000), ('/note', T0 + 350_000_000)]


def test_replay_delivers_every_message_with_original_stamps_and_spacing(bag):
    rate = 1.25
    with ros_context() as context:
        images = TopicCollector(context, '/camera/image_raw', Image, name='images')
        notes = TopicCollector(context, '/note', String, name='notes')
        thread, result = _replay_in_thread(context, bag, rate=rate)
        try:
            wait_for(
                lambda: (
                    len(images.messages) == N_FRAMES and len(notes.messages) == 2 or not thread.is_alive()
                ),
                15,
                [images, notes],
                'all replayed messages',
            )
        finally:
            thread.join(10)
        assert 'error' not in result, result.get('error')
        stats = result['stats']
        assert stats.published == {'/camera/image_raw': N_FRAMES, '/note': 2} and stats.loops == 1
        assert len(images.messages) == N_FRAMES
        stamps = [stamp_to_ns(m.header.stamp) for m in images.messages]
        assert stamps == [T0 + i * SPACING_NS + STAMP_OFFSET_NS for i in range(N_FRAMES)]
        assert [image_msg_to_rgb(m)[0, 0, 0] for m in images.messages] == [i * 10 for i in range(N_FRAMES)]
        assert [m.data for m in notes.messages] == ['after frame 1', 'after frame 3']
        # Recorded spacing 100 ms at rate 1.25 -> 80 ms; 5 gaps span 400 ms. Measured on the
        # publisher's source timestamps; a late wake-up shortens the next gap (the schedule is
        # absolute), so the span is checked, with room for busy shared cores but not for rate 1.
        gaps = np.diff(images.sent)
        span = images.sent[-1] - images.sent[0]
        assert 0.36 <= span <= 0.47, gaps
        assert (gaps > 0.01).all(), gaps
        # the note recorded between frames 1 and 2 is sent between them
        assert images.sent[1] < notes.sent[0] < images.sent[2]


def test_clock_carries_bag_time(bag):
    with ros_context() as context:
        clock = TopicCollector(context, '/clock', Clock, name='clock_listener')
        images = TopicCollector(context, '/camera/image_raw', Image, name='images')
        thread, result = _replay_in_thread(
            context, bag, rate=4.0, clock_hz=100.0, topics=['/camera/image_raw']
        )
        try:
            wait_for(lambda: not thread.is_alive(), 15, [clock, images], 'the replay to end')
            wait_for(lambda: len(images.messages) == N_FRAMES, 5, [clock, images], 'the frames')
            last = T0 + (N_FRAMES - 1) * SPACING_NS
            wait_for(lambda: stamp_to_ns(clock.messages[-1].clock) == last, 3, clock, 'the last clock')
        finally:
            thread.join(10)
        assert 'error' not in result, result.get('error')
        times = [stamp_to_ns(m.clock) for m in clock.messages]
        assert len(times) >= N_FRAMES  # one before every frame at least, plus the periodic ones
        assert times == sorted(times)
        assert times[0] >= T0 and times[-1] == T0 + (N_FRAMES - 1) * SPACING_NS
        assert result['stats'].published == {'/camera/image_raw': N_FRAMES}


def test_loops_sqlite3_storage_and_remap(tmp_path):
    bag_path = write_rosbag2(tmp_path / 'sq', StoragePlugin.SQLITE3)
    with ros_context() as context:
        notes = TopicCollector(context, '/renamed', String, name='notes')
        thread, result = _replay_in_thread(
            context, bag_path, rate=10.0, loops=2, topics=['/note'], remap={'/note': '/renamed'}
        )
        try:
            wait_for(lambda: len(notes.messages) == 4 or not thread.is_alive(), 15, notes, 'two passes')
            wait_for(lambda: len(notes.messages) == 4, 3, notes, 'the last note')
        finally:
            thread.join(10)
        assert [m.data for m in notes.messages] == ['after frame 1', 'after frame 3'] * 2
        assert result['stats'].loops == 2


def write_bare_db3(path: Path) -> Path:
    import shutil

    bag_dir = write_rosbag2(path.parent / 'db3-bag', StoragePlugin.SQLITE3)
    shutil.copy(next(bag_dir.glob('*.db3')), path)
    return path


@pytest.mark.parametrize(
    ('name', 'write'),
    [('dive.mcap', write_bare_mcap), ('dive.db3', write_bare_db3)],
)
def test_bare_storage_files_replay(tmp_path, name, write):
    path = write(tmp_path / name)
    assert bag_topics(path)['/camera/image_raw'] == 'sensor_msgs/msg/Image'
    with ros_context() as context:
        images = TopicCollector(context, '/camera/image_raw', Image, name='images')
        thread, result = _replay_in_thread(context, path, rate=10.0, topics=['/camera/image_raw'])
        try:
            wait_for(lambda: len(images.messages) == N_FRAMES or not thread.is_alive(), 15, images, 'frames')
            wait_for(lambda: len(images.messages) == N_FRAMES, 3, images, 'the last frame')
        finally:
            thread.join(10)
        assert 'error' not in result, result.get('error')
        stamps = [stamp_to_ns(m.header.stamp) for m in images.messages]
        assert stamps == [T0 + i * SPACING_NS + STAMP_OFFSET_NS for i in range(N_FRAMES)]
        assert image_msg_to_rgb(images.messages[-1])[0, 0, 0] == 50


def _replay(argv: list[str], images, collectors) -> list[int]:
    """Run `metavlm ARGV` in a thread while `collectors` spin, until it ends and `images` holds every
    frame; its exit codes."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(cli.main(argv)))
    thread.start()
    try:
        wait_for(lambda: not thread.is_alive(), 20, collectors, 'metavlm replay to finish')
        wait_for(lambda: len(images.messages) == N_FRAMES, 3, images, 'all frames')
    finally:
        thread.join(10)
    return codes


def test_a_ros1_bag_replays_as_its_ros2_types(tmp_path, capsys):
    path = write_ros1_bag(tmp_path / 'dive.bag')
    assert bag_topics(path) == {'/camera/image_raw': 'sensor_msgs/msg/Image', '/note': 'std_msgs/msg/String'}
    with ros_context() as context:
        images = TopicCollector(context, '/camera/image_raw', Image, name='images')
        notes = TopicCollector(context, '/note', String, name='notes')
        argv = ['replay', str(path), '--rate', '10', '--wait-for-subscribers', '5']
        codes = _replay(argv, images, [images, notes])
    assert codes == [0], capsys.readouterr().err
    stamps = [stamp_to_ns(m.header.stamp) for m in images.messages]
    assert stamps == [T0 + i * SPACING_NS + STAMP_OFFSET_NS for i in range(N_FRAMES)]
    assert [image_msg_to_rgb(m)[0, 0, 0] for m in images.messages] == [i * 10 for i in range(N_FRAMES)]
    assert [m.data for m in notes.messages] == ['after frame 1', 'after frame 3']


def test_a_video_replays_as_a_camera_topic_at_its_frame_rate(tmp_path, capsys):
    from metavlm_ros.footage.video import VIDEO_EPOCH_NS, write_video

    frames = [np.full((24, 32, 3), 20 * i, np.uint8) for i in range(N_FRAMES)]
    video = write_video(tmp_path / 'dive.mkv', frames, fps=10.0)
    assert bag_topics(video) == {'/camera/image_raw': 'sensor_msgs/msg/Image'}
    with ros_context() as context:
        images = TopicCollector(context, '/camera/image_raw', Image, name='images')
        argv = ['replay', str(video), '--rate', '2', '--wait-for-subscribers', '5']
        codes = _replay(argv, images, images)
    assert codes == [0], capsys.readouterr().err
    stamps = [stamp_to_ns(m.header.stamp) for m in images.messages]
    # Stamped the video epoch plus their position, 100 ms apart; sent 50 ms apart at rate 2.
    assert stamps == [VIDEO_EPOCH_NS + i * 100_000_000 for i in range(N_FRAMES)]
    levels = [round(float(image_msg_to_rgb(m).mean()) / 20) for m in images.messages]
    assert levels == list(range(N_FRAMES)) and images.messages[0].encoding == 'rgb8'
    assert 0.2 <= images.sent[-1] - images.sent[0] <= 0.4
    assert f'published {N_FRAMES} messages on 1 topic(s)' in capsys.readouterr().out


def test_a_cut_video_is_refused_in_one_line_before_anything_is_published(tmp_path, capsys):
    from metavlm_ros.footage.video import write_video

    video = write_video(tmp_path / 'dive.mkv', [np.zeros((24, 32, 3), np.uint8)] * 12, fps=10.0)
    cut = tmp_path / 'cut.mkv'
    cut.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    assert cli.main(['replay', str(cut)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f'metavlm: error: {cut}: truncated or damaged video') and '\n' not in err


def test_cli_replays_to_a_best_effort_subscriber(bag, capsys):
    with ros_context() as context:
        sensor_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
        images = TopicCollector(context, '/cam', Image, sensor_qos, name='images')
        argv = ['replay', str(bag), '--topic', '/camera/image_raw', '--remap', '/camera/image_raw:=/cam']
        argv += ['--rate', '10', '--wait-for-subscribers', '5']
        codes = _replay(argv, images, images)
    assert codes == [0]
    assert f'published {N_FRAMES} messages on 1 topic(s) in ' in capsys.readouterr().out


def test_qos_override_file_is_applied(bag, tmp_path):
    from metavlm_ros.ros.bag_player import load_qos_overrides

    path = tmp_path / 'qos.yaml'
    path.write_text('/cam:\n  reliability: best_effort\n  history: keep_last\n  depth: 3\n')
    profile = load_qos_overrides(path)['/cam']
    assert profile.reliability == ReliabilityPolicy.BEST_EFFORT and profile.depth == 3
    path.write_text('/cam:\n  reliability: sometimes\n')
    assert cli.main(['replay', str(bag), '--qos-profile-overrides-path', str(path)]) == 2


@pytest.mark.parametrize(
    ('argv', 'message'),
    [
        (['{missing}'], 'no such bag'),
        (['{empty_dir}'], 'no metadata.yaml'),
        (['{text_file}'], 'unknown bag storage'),
        (['{ros1}'], 'unreadable ROS 1 bag'),
        (['{bag}', '--topic', '/sonar'], 'topic /sonar is not in dive'),
        (['{bag}', '--rate', '0'], '--rate must be positive'),
        (['{bag}', '--remap', '/note'], 'not of the form OLD:=NEW'),
        (['{corrupt}'], 'unreadable bag'),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(bag, tmp_path, capsys, argv, message):
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'notes.txt').write_text('hello')
    corrupt = tmp_path / 'broken.mcap'
    corrupt.write_bytes(b'\x89MCAP0\r\n' + bytes(40))
    (tmp_path / 'old.bag').write_bytes(b'#ROSBAG V2.0\n')
    paths = {
        'ros1': tmp_path / 'old.bag',
        'missing': tmp_path / 'nope',
        'empty_dir': tmp_path / 'empty',
        'text_file': tmp_path / 'notes.txt',
        'bag': bag,
        'corrupt': corrupt,
    }
    argv = [a.format(**paths) for a in argv]
    assert cli.main(['replay', *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error: ') and message in err and '\n' not in err


def test_unknown_topic_raises_bag_error(bag):
    with pytest.raises(BagError, match='topic /x is not in'):
        list(iter_raw_messages(bag, ['/x']))


def test_interrupting_a_looping_replay_exits_0_with_a_summary(bag):
    import signal
    import subprocess
    import sys

    command = [sys.executable, '-m', 'metavlm_ros.cli', 'replay', str(bag), '--loop', '--rate', '5']
    with ros_context() as context:
        notes = TopicCollector(context, '/note', String, name='notes')
        # The replay must see Ctrl-C as an interactive user's would: a test runner that ignores
        # SIGINT (some of the in-process ROS tests can leave it so) would pass SIG_IGN on through
        # exec, and Python then never raises KeyboardInterrupt.
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            wait_for(
                lambda: len(notes.messages) >= 3 or process.poll() is not None, 30, notes, 'a second pass'
            )
            process.send_signal(signal.SIGINT)
            try:
                out, err = process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                # Say where it hung: what the replay had printed by then.
                process.kill()
                out, err = process.communicate()
                pytest.fail(f'replay ignored Ctrl-C for 20 s; stdout {out[-500:]!r} stderr {err[-1500:]!r}')
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, err
    assert '(interrupted)' in out and 'Traceback' not in err


def test_scenes_names_replay_under_the_same_name_and_older_bag_directories_too(tmp_path):
    from metavlm_ros.footage.bags import write_bag
    from metavlm_ros.footage.scenes import SceneGenerator

    frames = list(SceneGenerator(32, 24, 10, seed=2, frames=3))
    assert cli.main(['scenes', '--out', str(tmp_path / 'dive.mcap'), '--frames', '3', '--size', '32x24']) == 0
    write_bag(tmp_path / 'old', frames, fps=10)  # what `scenes --out old.mcap` wrote before
    for name in ('dive.mcap', 'old.mcap', 'old'):
        topics = bag_topics(tmp_path / name)
        assert topics['/camera/image_raw'] == 'sensor_msgs/msg/Image', name
        assert len([m for m in iter_raw_messages(tmp_path / name) if m[0] == '/camera/image_raw']) == 3
    with pytest.raises(BagError, match='no such bag'):
        bag_topics(tmp_path / 'other.mcap')


@pytest.mark.parametrize('damage', ['chunk', 'tail'])
def test_a_damaged_bag_is_refused_in_one_line_before_anything_is_published(
    tmp_path, capsys, monkeypatch, damage
):
    from metavlm_ros.footage.bags import write_bag
    from metavlm_ros.ros import bag_player as replay_module
    from test.conftest import make_frame

    def no_start(*args, **kwargs):
        raise AssertionError('the replay started before the bag was checked')

    monkeypatch.setattr(replay_module, 'replay_bag', no_start)
    frames = [(make_frame(64, 48, seed=i), None) for i in range(3)]
    bag = write_bag(tmp_path / 'dive', frames, fps=5.0)
    storage = bag / 'dive.mcap'
    data = bytearray(storage.read_bytes())
    if damage == 'chunk':  # 200 bytes of the second frame overwritten: only the chunk CRC tells
        start = data.find(frames[1][0].tobytes())
        data[start + 100 : start + 300] = bytes(200)
    else:  # the last third cut off, as by a full disk or an interrupted copy
        data = data[: len(data) * 2 // 3]
    storage.write_bytes(bytes(data))
    assert cli.main(['replay', str(bag)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error: ') and '\n' not in err, err
    assert 'damaged bag' in err or 'unreadable bag' in err or 'cannot read bag' in err, err
