"""The player of `metavlm replay`: a bag's messages, or a video's frames, published by rclpy in their time."""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from metavlm_ros.common.errors import BagError, InputError, ParameterError
from metavlm_ros.ros.launcher import require_rclpy
from metavlm_ros.ros.transport import use_transport

__all__ = [
    'ReplayStats',
    'bag_topics',
    'check_topics',
    'iter_raw_messages',
    'load_qos_overrides',
    'parse_remaps',
    'play',
    'replay_bag',
]

NODE_NAME = 'metavlm_replay'
DEFAULT_CLOCK_HZ = 40.0  # as `ros2 bag play --clock`
PUBLISH_DEPTH = 10
SETTLE_S = 0.25

# A raw message: topic, message type ('sensor_msgs/msg/Image'), bag timestamp in ns, CDR bytes.
RawMessage = tuple[str, str, int, bytes]


# -- reading raw messages ---------------------------------------------------------------------------


def check_topics(available: Mapping[str, str], topics: Sequence[str] | None, path: Path) -> list[str]:
    if not topics:
        return sorted(available)
    missing = [t for t in topics if t not in available]
    if missing:
        known = ', '.join(sorted(available)) or 'none'
        raise BagError(f'topic {missing[0]} is not in {path.name} (topics: {known})')
    return list(dict.fromkeys(topics))


def _is_video(path: str | Path) -> bool:
    from metavlm_ros.footage.frames import is_video_path

    return is_video_path(path)


def bag_topics(path: str | Path) -> dict[str, str]:
    """Topics of a bag (ROS 2 or ROS 1) and their message types; a video's is its camera topic.

    Raises:
        BagError: not a bag, unreadable, or corrupt.
        InputError: a video that does not read.
    """
    if _is_video(path):
        from metavlm_ros.footage.bag_format import IMAGE_MSGTYPE, IMAGE_TOPIC
        from metavlm_ros.footage.video import video_rate

        video_rate(path)  # it opens
        return {IMAGE_TOPIC: IMAGE_MSGTYPE}
    from metavlm_ros.footage.bags import open_bag  # rosbags loads only when a bag is read

    with open_bag(path) as reader:
        return {conn.topic: conn.msgtype for conn in reader.connections}


def iter_raw_messages(path: str | Path, topics: Sequence[str] | None = None) -> Iterator[RawMessage]:
    """Yield (topic, msgtype, timestamp_ns, ROS 2 CDR bytes) in bag time order, of a ROS 2 or ROS 1 bag.

    A video is its frames as rgb8 sensor_msgs/Image on /camera/image_raw, stamped VIDEO_EPOCH_NS
    plus their presentation time.

    Raises:
        BagError: not a bag, unknown topic, or corrupt data.
        InputError: a video that does not read.
    """
    path = Path(path)
    if _is_video(path):
        yield from _video_messages(path, topics)
        return
    from metavlm_ros.footage.bags import cdr_bytes, open_bag  # rosbags loads only when a bag is read

    with open_bag(path) as reader:
        available = {conn.topic: conn.msgtype for conn in reader.connections}
        selected = set(check_topics(available, topics, path))
        connections = [c for c in reader.connections if c.topic in selected]
        to_cdr = cdr_bytes(reader)  # a ROS 1 bag's messages as their ROS 2 types
        messages = reader.messages(connections=connections)
        while True:
            try:
                conn, timestamp, rawdata = next(messages)
            except StopIteration:
                return
            except Exception as exc:
                raise BagError(f'{path}: corrupt or truncated bag ({_one_line(exc)})') from None
            yield conn.topic, conn.msgtype, timestamp, to_cdr(conn, rawdata)


def _video_messages(path: Path, topics: Sequence[str] | None) -> Iterator[RawMessage]:
    """A video's frames as camera messages: one decoded and serialised at a time."""
    from metavlm_ros.footage.bag_format import IMAGE_MSGTYPE, IMAGE_TOPIC, bag_typestore, image_message
    from metavlm_ros.footage.video import VIDEO_EPOCH_NS, iter_video_frames

    if not check_topics({IMAGE_TOPIC: IMAGE_MSGTYPE}, topics, path):
        return
    typestore = bag_typestore()
    for frame in iter_video_frames(path):
        stamp = VIDEO_EPOCH_NS + frame.stamp_ns  # a video's time 0 is 'no stamp' in ROS
        message = image_message(frame.rgb, stamp)
        yield IMAGE_TOPIC, IMAGE_MSGTYPE, stamp, bytes(typestore.serialize_cdr(message, IMAGE_MSGTYPE))


# -- publishing -------------------------------------------------------------------------------------


def message_class(msgtype: str) -> type:
    """The rclpy class of a ROS 2 message type name such as 'sensor_msgs/msg/Image'.

    Raises:
        InputError: the type name is malformed or its package is not installed.
    """
    parts = msgtype.split('/')
    if len(parts) == 2:  # ROS 1 style 'sensor_msgs/Image'
        parts = [parts[0], 'msg', parts[1]]
    if len(parts) != 3 or parts[1] != 'msg':
        raise InputError(f'not a message type name: {msgtype!r}')
    try:
        return getattr(importlib.import_module(f'{parts[0]}.msg'), parts[2])
    except (ImportError, AttributeError):
        raise InputError(f'message type {msgtype} is not installed for rclpy') from None


def load_qos_overrides(path: str | Path) -> dict[str, Any]:
    """Read a `ros2 bag play --qos-profile-overrides-path` file into QoS profiles by topic.

    Raises:
        ParameterError: unreadable file or unknown policy values.
    """
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ParameterError(f'cannot read QoS override file {path}: {_one_line(exc)}') from None
    if not isinstance(data, dict):
        raise ParameterError(f'QoS override file {path} must map topics to profiles')
    policies = {'reliability': ReliabilityPolicy, 'durability': DurabilityPolicy, 'history': HistoryPolicy}
    profiles = {}
    for topic, spec in data.items():
        if not isinstance(spec, dict):
            raise ParameterError(f'QoS override of {topic} must be a mapping')
        profile = QoSProfile(depth=int(spec.get('depth', PUBLISH_DEPTH)))
        for key, enum in policies.items():
            if key in spec:
                try:
                    setattr(profile, key, enum[str(spec[key]).upper()])
                except KeyError:
                    raise ParameterError(f'QoS override of {topic}: unknown {key} {spec[key]!r}') from None
        profiles[str(topic)] = profile
    return profiles


@dataclass
class ReplayStats:
    """What a replay published."""

    published: dict[str, int] = field(default_factory=dict)
    loops: int = 0
    seconds: float = 0.0
    clock_messages: int = 0

    @property
    def total(self) -> int:
        """Messages published on the bag's topics (not counting /clock)."""
        return sum(self.published.values())


def parse_remaps(remaps: Sequence[str]) -> dict[str, str]:
    table = {}
    for item in remaps:
        old, sep, new = item.partition(':=')
        if not sep or not old or not new:
            raise ParameterError(f'remap {item!r} is not of the form OLD:=NEW')
        table[old] = new
    return table


def replay_bag(
    path: str | Path,
    context: Any,
    *,
    topics: Sequence[str] | None = None,
    rate: float = 1.0,
    loops: int | None = 1,
    clock_hz: float | None = None,
    remap: Mapping[str, str] | None = None,
    qos_overrides: Mapping[str, Any] | None = None,
    wait_for_subscribers_s: float = 0.0,
    stop: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
    stats: ReplayStats | None = None,
) -> ReplayStats:
    """Publish a bag's messages with their recorded spacing, scaled by `rate`.

    Args:
        path: the bag.
        context: an initialised rclpy Context.
        topics: topics to publish (default: all whose types are installed).
        rate: playback speed factor (2.0: twice as fast).
        loops: times through the bag; None repeats until `stop` is set.
        clock_hz: when set, /clock (rosgraph_msgs/Clock) carries the bag time at this rate and
            just before every message.
        remap: bag topic -> published topic.
        qos_overrides: published topic -> rclpy QoSProfile (default RELIABLE, depth 10, which
            reaches both reliable and best-effort subscribers).
        wait_for_subscribers_s: wait up to this long for every topic to have a subscriber first.
        stop: set it to end the replay early.
        progress: called with 1 after each published message.
        stats: filled as the replay goes (so a caller interrupted midway still has the counts).

    Raises:
        BagError: unreadable bag or unknown topic.
        ParameterError: rate not positive.
        InputError: a requested topic whose type is not installed.
    """
    from rclpy.duration import Duration
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    if not rate > 0:
        raise ParameterError(f'rate must be positive, got {rate}')
    if clock_hz is not None and not clock_hz > 0:
        raise ParameterError(f'clock rate must be positive, got {clock_hz}')
    path = Path(path)
    available = bag_topics(path)
    selected = check_topics(available, topics, path)
    remap = dict(remap or {})
    qos_overrides = dict(qos_overrides or {})
    stop = stop or threading.Event()
    classes: dict[str, type] = {}
    for topic in selected:
        try:
            classes[topic] = message_class(available[topic])
        except InputError:
            if topics:
                raise
            print(f'metavlm replay: skipping {topic}: type {available[topic]} not installed', file=sys.stderr)
    if not classes:
        raise BagError(f'no topic of {path.name} can be published')

    node = Node(NODE_NAME, context=context)
    stats = stats if stats is not None else ReplayStats()
    stats.published.update({topic: 0 for topic in classes})
    try:
        default_qos = QoSProfile(depth=PUBLISH_DEPTH, reliability=ReliabilityPolicy.RELIABLE)
        publishers = {}
        for topic, cls in classes.items():
            out = remap.get(topic, topic)
            publishers[topic] = node.create_publisher(cls, out, qos_overrides.get(out, default_qos))
        clock_pub = None
        if clock_hz is not None:
            from rosgraph_msgs.msg import Clock

            clock_pub = node.create_publisher(Clock, '/clock', default_qos)

        deadline = time.monotonic() + wait_for_subscribers_s
        while time.monotonic() < deadline and not stop.is_set():
            if all(p.get_subscription_count() > 0 for p in publishers.values()):
                # The publisher sees the subscriber before the subscriber has matched the publisher;
                # a first message sent in between arrives late by a retransmission, so let it settle.
                stop.wait(SETTLE_S)
                break
            stop.wait(0.02)

        player = _Player(path, classes, publishers, clock_pub, clock_hz, rate, stop, stats, progress)
        started = time.monotonic()
        while (loops is None or stats.loops < loops) and not stop.is_set():
            player.play_once()
            stats.loops += 1
        stats.seconds = time.monotonic() - started
        # Reliable delivery of the tail: give subscribers a moment to acknowledge before the
        # publishers go away.
        for publisher in [*publishers.values(), *([clock_pub] if clock_pub is not None else [])]:
            publisher.wait_for_all_acked(Duration(seconds=1))
        return stats
    finally:
        node.destroy_node()


@dataclass
class _Player:
    """One bag's publishing loop (state shared by the passes of replay_bag)."""

    path: Path
    classes: dict[str, type]
    publishers: dict[str, Any]
    clock_pub: Any
    clock_hz: float | None
    rate: float
    stop: threading.Event
    stats: ReplayStats
    progress: Callable[[int], None] | None

    def play_once(self) -> None:
        """Publish the bag once, each message at its recorded offset from the first, over `rate`."""
        from rclpy.serialization import deserialize_message

        first_ns = None
        wall_start = next_clock = 0.0
        for topic, _msgtype, timestamp, rawdata in iter_raw_messages(self.path, list(self.classes)):
            if first_ns is None:
                # The clock starts with the first message in hand: opening the bag takes time too.
                first_ns = timestamp
                wall_start = next_clock = time.monotonic()
            due = wall_start + (timestamp - first_ns) / 1e9 / self.rate
            while True:
                now = time.monotonic()
                if self.clock_pub is not None and now >= next_clock:
                    bag_now = first_ns + int((now - wall_start) * self.rate * 1e9)
                    self._clock(min(bag_now, timestamp))
                    next_clock = now + 1.0 / self.clock_hz
                if now >= due or self.stop.is_set():
                    break
                wake = due if self.clock_pub is None else min(due, next_clock)
                self.stop.wait(max(0.0, wake - now))
            if self.stop.is_set():
                return
            if self.clock_pub is not None:
                self._clock(timestamp)
            try:
                msg = deserialize_message(rawdata, self.classes[topic])
            except Exception as exc:
                raise BagError(
                    f'message on {topic} at {timestamp} ns cannot be decoded: {_one_line(exc)}'
                ) from None
            self.publishers[topic].publish(msg)
            self.stats.published[topic] += 1
            if self.progress is not None:
                self.progress(1)

    def _clock(self, stamp_ns: int) -> None:
        from builtin_interfaces.msg import Time
        from rosgraph_msgs.msg import Clock

        self.clock_pub.publish(
            Clock(clock=Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000))
        )
        self.stats.clock_messages += 1


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def play(
    bag: str,
    *,
    topics: Sequence[str] | None = None,
    rate: float = 1.0,
    loop: bool = False,
    clock_hz: float | None = None,
    remaps: Sequence[str] = (),
    qos_overrides_path: str | None = None,
    wait_for_subscribers_s: float = 0.0,
    dds_transport: str | None = None,
) -> tuple[ReplayStats, bool]:
    """Check a bag (or video) whole, then publish it in a context of its own until it ends or SIGINT/SIGTERM.

    Returns:
        The replay's statistics, and whether a signal ended it.

    Raises:
        BagError, InputError, ParameterError: a bag, topic, remap or QoS file that cannot be used, or no
            rclpy; nothing is published then.
    """
    remap = parse_remaps(remaps)
    available = bag_topics(bag)
    check_topics(available, topics, Path(bag))

    # The whole bag is read once before anything starts: a damaged chunk (checksum mismatch) or a cut
    # tail is one line and exit 2 here, not an error after half the bag was published.
    if _is_video(bag):
        from metavlm_ros.footage.video import verify_video

        verify_video(bag)  # opens, holds frames, not cut short
    else:
        from metavlm_ros.footage.bags import verify_bag

        verify_bag(bag)
    require_rclpy('replay')
    import rclpy
    from rclpy.context import Context

    qos = load_qos_overrides(qos_overrides_path) if qos_overrides_path else None

    from tqdm import tqdm

    # The writer's shared-memory segment decides whether large frames fit: the transport comes first.
    with use_transport(dds_transport):
        context = Context()
        # SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group, and `ros2 launch`
        # sends its own) end the replay after the current message, exit code 0, as `ros2 bag play` does.
        from rclpy.signals import SignalHandlerOptions

        rclpy.init(args=[], context=context, signal_handler_options=SignalHandlerOptions.NO)
        stop = threading.Event()
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            previous = {
                sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
            }
        total = None if loop else _count(bag, topics)
        bar = tqdm(total=total, unit='msg', desc='replay', disable=None, file=sys.stderr)
        stats = ReplayStats()
        started = time.monotonic()
        try:
            replay_bag(
                bag,
                context,
                topics=topics,
                rate=rate,
                loops=None if loop else 1,
                clock_hz=clock_hz,
                remap=remap,
                qos_overrides=qos,
                wait_for_subscribers_s=wait_for_subscribers_s,
                stop=stop,
                progress=bar.update,
                stats=stats,
            )
        finally:
            bar.close()
            rclpy.try_shutdown(context=context)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if stop.is_set():
            stats.seconds = time.monotonic() - started
    return stats, stop.is_set()


def _count(bag: str, topics: Sequence[str] | None) -> int | None:
    """Messages a single pass publishes, for the progress bar; None when the bag does not say."""
    if _is_video(bag):
        return None  # a container's frame count may be an estimate
    try:
        from metavlm_ros.footage.bags import open_bag

        with open_bag(bag) as reader:
            counts = [c.msgcount for c in reader.connections if not topics or c.topic in topics]
    except BagError:
        return None
    return sum(counts) or None
