"""Both nodes in one process (rclpy, no ROS distribution needed), fed from a bag or a folder of images."""

from __future__ import annotations

import math
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from metavlm_ros.common.errors import InputError, ModelError, ParameterError
from metavlm_ros.ros.transport import use_transport

__all__ = ['DEFAULT_FOLDER_RATE_HZ', 'load_parameter_file', 'require_rclpy', 'run_nodes']

TESTER = 'metavlm_tester'
PERCEPTION = 'metavlm_perception'
DEFAULT_FOLDER_RATE_HZ = 2.0
# After the footage ends, how long a tester that cannot start its last search (no perception node)
# is waited for before the run ends anyway.
STALLED_END_S = 30.0


def load_parameter_file(params: str | Path | Mapping | None) -> dict[str, dict[str, Any]]:
    """Read a ROS parameter file (or a ready dict) into node name -> parameters.

    Blocks may be written `node: {ros__parameters: {...}}` (ROS form) or `node: {...}`; nested
    dictionaries (like `ranges: {rotation: [...]}`) are kept as they are.

    Raises:
        InputError: the file is missing or is not YAML.
        ParameterError: the content is not a mapping of node blocks.
    """
    if params is None:
        return {}
    if isinstance(params, Mapping):
        data: Any = dict(params)
        where = 'parameters'
    else:
        path = Path(params)
        if not path.is_file():
            raise InputError(f'{path}: no such parameter file')
        try:
            data = yaml.safe_load(path.read_text(encoding='utf-8'))
        except yaml.YAMLError as exc:
            raise InputError(f'{path}: not valid YAML ({str(exc).splitlines()[0]})') from None
        where = str(path)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ParameterError(f'{where}: expected node blocks like "{TESTER}: ros__parameters: ..."')
    nodes: dict[str, dict[str, Any]] = {}
    for node, block in data.items():
        if not isinstance(block, Mapping):
            raise ParameterError(f'{where}: block {node!r} must be a mapping of parameters')
        inner = block.get('ros__parameters', block)
        if not isinstance(inner, Mapping):
            raise ParameterError(f'{where}: {node}.ros__parameters must be a mapping')
        nodes[str(node).lstrip('/')] = dict(inner)
    return nodes


def _flatten(values: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f'{prefix}{key}'
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def _write_ros_file(nodes: Mapping[str, Mapping[str, Any]], directory: Path) -> Path:
    """Write node blocks as a ROS parameter file that rcl's parser accepts."""
    from metavlm_ros.ros.tester_settings import coerce_parameters

    blocks = {}
    for node, values in nodes.items():
        flat = _flatten(values)
        if node == TESTER:
            flat = coerce_parameters(flat)
        # rcl cannot type an empty list, nor a list mixing integers and floats.
        clean = {}
        for name, value in flat.items():
            if isinstance(value, list):
                if not value:
                    continue
                if any(isinstance(v, float) for v in value):
                    value = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
            clean[name] = value
        blocks[node] = {'ros__parameters': clean}
    path = directory / 'params.yaml'
    path.write_text(yaml.safe_dump(blocks, sort_keys=False), encoding='utf-8')
    return path


def _footage(
    source: str | None, topic: str | None, rate: float | None, loop: bool
) -> Iterator[tuple[Any, float]]:
    """Yield (frame, seconds to wait before publishing it) from a bag, video or folder, looping when asked."""
    from metavlm_ros.footage.frames import footage_kind, iter_frames

    if source is None:
        return
    timed = footage_kind(source) in ('bag', 'video')  # spaced by their own stamps
    if rate is not None and not rate > 0:
        raise ParameterError(f'--rate must be positive, got {rate:g}')
    period = 1.0 / rate if rate else (None if timed else 1.0 / DEFAULT_FOLDER_RATE_HZ)
    first = True
    gap = 0.0
    while True:
        previous = None
        count = 0
        for frame in iter_frames([source], topic=topic):
            if first:
                wait = 0.0
            elif period is not None:
                wait = period
            elif previous is None:
                wait = gap  # a loop starts again one frame spacing after its last frame
            else:
                # A bag's own spacing, bounded so a gap in the recording does not stall the run.
                wait = gap = min(max((frame.stamp_ns - previous) / 1e9, 0.0), 5.0)
            previous = frame.stamp_ns
            first = False
            count += 1
            yield frame, wait
        if count == 0:
            raise InputError(f'{source}: no frames')
        if not loop:
            return


def _check_footage(source: str | Path, topic: str | None) -> None:
    """Refuse missing, damaged or frameless footage before any node starts or model loads."""
    from metavlm_ros.footage.frames import iter_frames, verify_sources

    if not Path(source).exists():
        raise InputError(f'{source}: no such file or directory')
    verify_sources([source])
    if next(iter_frames([source], topic=topic, max_frames=1), None) is None:
        raise InputError(f'{source}: no frames')


def _check_results(tester_values: Mapping[str, Any]) -> None:
    """Refuse an unwritable results_dir, or one with searches of another identity, before nodes start."""
    from metavlm_ros.common.results import check_output_dir
    from metavlm_ros.ros.tester_identity import check_identity, tester_model_identity
    from metavlm_ros.ros.tester_settings import coerce_parameters, settings_from_parameters

    try:
        settings = settings_from_parameters(coerce_parameters(_flatten(tester_values)))
        # An inprocess model is read as `metavlm search` reads it (weights included); the model a
        # perception node answers with is compared once it answers.
        model = tester_model_identity(settings)
    except (ParameterError, ModelError):
        return  # the tester node names the parameter or the model when it starts, before any model loads
    check_output_dir(settings.results_dir)
    check_identity(settings, model)


def run_nodes(
    params: str | Path | Mapping | None = None,
    *,
    source: str | Path | None = None,
    topic: str | None = None,
    duration: float | None = None,
    rate: float | None = None,
    loop: bool = False,
    results_dir: str | Path | None = None,
    tester_overrides: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    dds_transport: str = 'shm',
) -> dict[str, Any]:
    """Run the perception node and the tester node in this process, optionally publishing footage.

    Both nodes take their parameters from one ROS parameter file (or dict of node blocks), applied
    through rcl exactly as `--ros-args --params-file` would on a robot. The perception node is only
    started for the `ros` endpoint. Footage is published as sensor_msgs/Image on the camera topic
    `image` at `rate` Hz (a bag's own spacing by default); without footage the tester listens to the
    camera topic of the ROS graph.

    Args:
        params: the parameter file, a dict of node blocks, or None for the defaults.
        source: a bag or a folder of images to replay on the camera topic.
        topic: the image topic to read from the bag.
        duration: seconds to run; None ends after the footage and the last search.
        rate: camera rate in Hz; None uses the bag's spacing (folders: 2 Hz).
        loop: replay the footage until `duration` ends.
        results_dir: overrides the tester's results_dir.
        tester_overrides: more tester parameters, applied over the file's.
        log: where progress lines go (None: nowhere).
        should_stop: polled; True ends the run early.
        dds_transport: 'shm' (Fast DDS shared memory large enough for raw frames from and to other
            processes of this machine, unless the environment already chooses) or 'default'.

    Returns:
        A summary: frames_published, frames_received, frames_dropped, searches, searches_paused_disk,
        evaluations, failed, violations, violation_rate, last_hypervolume, results_dir, endpoint,
        seconds.

    Raises:
        InputError, ParameterError, ModelError: bad footage, parameters or model (nothing is left running).
    """

    say = log or (lambda _line: None)
    if duration is not None and not duration > 0:
        raise ParameterError(f'--duration must be positive, got {duration:g}')
    if rate is not None and not rate > 0:
        raise ParameterError(f'--rate must be positive, got {rate:g}')
    if loop and duration is None:
        raise ParameterError('--loop needs --duration (otherwise the run never ends)')
    if source is not None and not Path(source).exists():
        from metavlm_ros.footage.bags import resolve_bag
        from metavlm_ros.footage.frames import BAG_SUFFIXES

        if Path(source).suffix.lower() not in BAG_SUFFIXES:
            raise InputError(f'{source}: no such file or directory')
        source = resolve_bag(source)  # BagError when there is no such bag either
    if source is not None:
        _check_footage(source, topic)
    nodes = load_parameter_file(params)
    tester_values = dict(nodes.get(TESTER, {}))
    tester_values.update(tester_overrides or {})
    if results_dir is not None:
        tester_values['results_dir'] = str(results_dir)
    nodes[TESTER] = tester_values
    _check_results(tester_values)
    footage = _footage(str(source) if source is not None else None, topic, rate, loop)

    started = time.monotonic()
    # Ctrl-C (or SIGTERM) ends the loop below at its next check instead of raising KeyboardInterrupt
    # wherever the main thread is (inside rclpy, a handle would stay in use and destroying the nodes
    # would wait for ever); it is raised once everything is shut down and the summaries are written.
    interrupted = threading.Event()
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[signum] = signal.signal(signum, lambda *_: interrupted.set())
    try:
        return _run_in_context(
            nodes, footage, source, duration, dds_transport, say, should_stop, interrupted, started
        )
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def _run_in_context(nodes, footage, source, duration, dds_transport, say, should_stop, interrupted, started):
    """run_nodes once its arguments are checked: the nodes in one rclpy context, fed with footage."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.qos import qos_profile_sensor_data
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import CompressedImage, Image

    from metavlm_ros.footage.frames import footage_kind
    from metavlm_ros.footage.video import VIDEO_EPOCH_NS
    from metavlm_ros.ros.managed import bring_up, shut_down

    published = 0
    # A video's times start at 0, which ROS takes for no stamp: they are published from VIDEO_EPOCH_NS.
    video = source is not None and footage_kind(source) == 'video'
    # The transport is chosen before rclpy starts DDS in this process.
    with use_transport(dds_transport) as transport, tempfile.TemporaryDirectory(prefix='metavlm-run-') as tmp:
        path = _write_ros_file(nodes, Path(tmp))
        context = Context()
        try:
            # rclpy's SIGINT handler would invalidate the context at once, and the running search could
            # not publish nor finish: Ctrl-C raises KeyboardInterrupt here, and `finally` shuts down.
            rclpy.init(
                args=['--ros-args', '--params-file', str(path)],
                context=context,
                signal_handler_options=SignalHandlerOptions.NO,
            )
        except Exception as exc:  # rcl's parser reports a bad file as RCLError, with a long text
            raise ParameterError(f'parameter file refused: {str(exc).splitlines()[0]}') from None
        created: list[Any] = []
        executor = None
        spinning = spinner = None
        try:
            from metavlm_ros.ros.tester_node import TesterNode

            tester = TesterNode(context=context)
            created.append(tester)
            if tester.settings.endpoint == 'ros':
                from metavlm_ros.ros.perception_node import PerceptionNode

                created.append(PerceptionNode(context=context))
            camera = rclpy.create_node('metavlm_camera', context=context)
            created.append(camera)
            compressed = tester.settings.image_transport == 'compressed'
            publisher = camera.create_publisher(
                CompressedImage if compressed else Image,
                'image/compressed' if compressed else 'image',
                qos_profile_sensor_data,
            )
            # Both are managed nodes: configure (load the model, open the results), then activate.
            for node in reversed(created[:-1]):
                bring_up(node)
            executor = MultiThreadedExecutor(num_threads=4, context=context)
            for node in created:
                executor.add_node(node)
            spinning = threading.Event()
            spinning.set()

            def spin() -> None:
                # spin_once in a loop, not spin(): the loop ends before the executor is shut down.
                while spinning.is_set() and context.ok():
                    executor.spin_once(timeout_sec=0.1)

            spinner = threading.Thread(target=spin, name='metavlm-run-executor', daemon=True)
            spinner.start()
            say(
                f'nodes running ({tester.settings.endpoint} endpoint, {transport}); '
                f'results in {tester.settings.results_dir}'
            )

            # Frames published before the subscriptions are matched would be lost (sensor-data QoS).
            wanted = 1 + int(tester.settings.endpoint == 'ros')
            deadline = time.monotonic() + 5.0
            while publisher.get_subscription_count() < wanted and time.monotonic() < deadline:
                time.sleep(0.02)

            # The duration counts from the moment the nodes run, not from the model loading.
            end = time.monotonic() + duration if duration is not None else math.inf
            next_at = time.monotonic()
            exhausted = source is None
            exhausted_at = None

            def stop_now() -> bool:
                if interrupted.is_set() or tester.storage_failure is not None:
                    return True  # a full or read-only results disk ends the run: nothing more can be kept
                return time.monotonic() >= end or (should_stop is not None and should_stop())

            while not stop_now():
                if not exhausted:
                    item = next(footage, None)
                    if item is None:
                        exhausted, exhausted_at = True, time.monotonic()
                        say(f'footage ended after {published} frame(s)')
                        continue
                    frame, wait = item
                    next_at += wait
                    while time.monotonic() < next_at and not stop_now():
                        time.sleep(min(0.01, max(0.0, next_at - time.monotonic())))
                    if stop_now():
                        break
                    if video:
                        stamp = VIDEO_EPOCH_NS + frame.stamp_ns
                    else:
                        stamp = frame.stamp_ns or time.time_ns()
                    publisher.publish(_camera_message(frame.rgb, stamp, compressed))
                    published += 1
                    continue
                if duration is None and source is not None:
                    # The run ends with the footage, once the tester has searched what it kept.
                    pending = tester.has_pending_frame
                    # Sensor-data QoS may lose a frame: wait for the last ones only a little.
                    arrived = tester.frames_received >= published or time.monotonic() - exhausted_at > 2.0
                    if arrived and not tester.busy and not pending:
                        break
                    if pending and not tester.busy and time.monotonic() - exhausted_at > STALLED_END_S:
                        say(f'the last frame was not searched within {STALLED_END_S:g} s ({tester.state})')
                        break
                time.sleep(0.05)
        finally:
            if created:
                # The tester first, while the executor still delivers probe replies: its running
                # search stops after its generation and writes its summary. The transitions that
                # destroy entities come after the executor has stopped.
                created[0].prepare_shutdown()
            if spinner is not None:
                spinning.clear()
                spinner.join(5.0)
                # Callbacks handed to the pool by the last spin_once finish before the executor's
                # guard condition goes: rclpy destroys it before it joins its pool.
                time.sleep(0.2)
            if executor is not None:
                executor.shutdown(timeout_sec=5.0)
            for node in created[:2]:
                if hasattr(node, 'prepare_shutdown'):
                    shut_down(node)  # the tester's results are closed, the perception node's model freed
            summary = _summary(created[0], published, started) if created else None
            failure = created[0].storage_failure if created else None
            for node in reversed(created):
                node.destroy_node()
            rclpy.try_shutdown(context=context)
    if interrupted.is_set():
        raise KeyboardInterrupt  # the command's own message and exit code; the results are complete
    if failure is not None:
        raise failure  # one line and exit 2; everything written before is intact
    return summary


def _camera_message(rgb: Any, stamp_ns: int, compressed: bool) -> Any:
    """A camera message for a frame: raw rgb8, or JPEG as a bag's compressed topic holds it."""
    from metavlm_ros.ros.conversions import rgb_to_compressed_msg, rgb_to_image_msg

    convert = rgb_to_compressed_msg if compressed else rgb_to_image_msg
    return convert(rgb, stamp_ns, frame_id='camera')


def _summary(tester: Any, published: int, started: float) -> dict[str, Any]:
    judged = tester.judged
    return {
        'frames_published': published,
        'frames_received': tester.frames_received,
        'frames_dropped': tester.frames_dropped,
        'searches': tester.searches_done,
        'searches_paused_disk': tester.searches_paused_disk,
        'evaluations': tester.evaluations,
        'failed': tester.evaluations_failed,
        'violations': tester.violations,
        'violation_rate': tester.violations / judged if judged else float('nan'),
        'last_hypervolume': tester.last_hypervolume,
        'results_dir': str(tester.settings.results_dir),
        'endpoint': tester.settings.endpoint,
        'seconds': time.monotonic() - started,
    }


def require_rclpy(command: str) -> None:
    """Refuse, in one line, a command that needs rclpy where it is not installed.

    Raises:
        InputError: rclpy cannot be imported.
    """
    try:
        import rclpy  # noqa: F401
    except ImportError:
        raise InputError(
            f'metavlm {command} needs rclpy (a ROS 2 distribution, or pip install .[ros])'
        ) from None
