"""Benchmark of the ROS probe endpoint: throughput against in-process, and a tester fed a 1080p 30 Hz camera.

Part 1 (throughput): the same search (model, frame, seed, budget; Rand, so the genotypes do not depend
on the answers) through the perception node in a second process (DDS on loopback) and in process,
--repeats times, the order alternating (in-process first in even repetitions, ros first in odd
ones); prints min / median / max evaluations per second of both and the ratio of the medians
(target >= 0.9). Exits 1 unless every run judged the same genotypes with f_pred within 1e-4 of the
in-process run's and no probe failed.
Part 2 (camera): a tester (ros endpoint) fed by a camera process publishing 1920x1080 rgb8 at 30 Hz for
--duration seconds (120 by default); prints the tester's RSS at start and end, frames received and
dropped, and the camera callback's longest run.

    python bench/ros_probe.py                       # both parts, demo CLIP, 120 s camera run
    python bench/ros_probe.py --skip-camera --repeats 4 --evaluations 150
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

# DDS stays on this machine, in a domain of this run's own (children inherit it).
os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
os.environ.setdefault('ROS_DOMAIN_ID', str(150 + os.getpid() % 70))
os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import fmt  # noqa: E402

# Fast DDS's default shared-memory segment (512 KiB) is smaller than one raw 1080p frame (6 MiB):
# such frames fall back to UDP fragments, and with sensor-data (best effort) QoS nearly all are lost.
# --dds shm gives every process of the bench a shared-memory-only transport with a 64 MiB segment
# (no UDP at all, so nothing leaves the machine either).
SHM_PROFILE = Path(__file__).resolve().parents[1] / 'config' / 'fastdds_shm.xml'


def use_shm_profile() -> str:
    """Make this process and its children use the shipped shared-memory profile (before rclpy starts)."""
    os.environ['FASTDDS_DEFAULT_PROFILES_FILE'] = str(SHM_PROFILE)
    return str(SHM_PROFILE)


def rss_mib(pid: int | str = 'self') -> float:
    """Resident set size of a process in MiB (Linux /proc)."""
    with open(f'/proc/{pid}/status', encoding='ascii') as handle:
        for line in handle:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024.0
    return float('nan')


def synthetic_frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """Distinct underwater-like frames: the scene generator when it can, else structured noise."""
    try:
        from metavlm_ros.footage.scenes import SceneGenerator

        gen = SceneGenerator(width, height, 30.0, seed=7, environment='shallow', frames=count)
        frames = []
        for i in range(count):
            item = gen.frame(i)
            frames.append(np.ascontiguousarray(item[0] if isinstance(item, tuple) else item.rgb))
        return frames
    except Exception:  # noqa: BLE001 -- the bench only needs pixels with structure
        rng = np.random.default_rng(7)
        yy, xx = np.mgrid[0:height, 0:width]
        base = np.stack([xx * 255 // width, yy * 255 // height, np.full_like(xx, 90)], axis=2).astype(
            np.uint8
        )
        return [
            np.clip(base + rng.integers(0, 40, base.shape), 0, 255).astype(np.uint8) for _ in range(count)
        ]


def parse_size(text: str) -> tuple[int, int]:
    width, height = (int(v) for v in text.lower().split('x'))
    return width, height


# -- the camera process ------------------------------------------------------------------------------


def camera_main(args: argparse.Namespace) -> int:
    """Publish frames on `image` at a fixed rate until interrupted; print how many went out."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from metavlm_ros.ros.conversions import ns_to_stamp, rgb_to_image_msg

    width, height = parse_size(args.frame_size)
    # Messages are built once: the camera's own conversion cost is not what is measured.
    messages = [rgb_to_image_msg(f, 0, 'camera') for f in synthetic_frames(width, height, 4)]
    rclpy.init()
    node = rclpy.create_node('bench_camera')
    publisher = node.create_publisher(Image, 'image', qos_profile_sensor_data)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    period = 1.0 / args.camera_rate
    sent = 0
    late = 0
    next_at = time.monotonic()
    started = next_at
    while not stop.is_set():
        msg = messages[sent % len(messages)]
        msg.header.stamp = ns_to_stamp(time.time_ns())
        publisher.publish(msg)
        sent += 1
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        else:
            late += 1
    elapsed = time.monotonic() - started
    print(f'camera: {sent} frames in {elapsed:.1f} s ({sent / elapsed:.1f} Hz), {late} late', flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


# -- helpers of the main process -------------------------------------------------------------------


def start_perception(args: argparse.Namespace) -> subprocess.Popen:
    command = [
        sys.executable,
        '-m',
        'metavlm_ros.ros.perception_node',
        '--ros-args',
        '-p',
        'autostart:=true',
        '-p',
        f'backend:={args.backend}',
        '-p',
        f'model:={args.model}',
        '-p',
        f'device:={args.device}',
        '-p',
        f'max_batch:={min(args.population, 256)}',
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_process(process: subprocess.Popen | None, timeout: float = 15.0) -> str:
    if process is None or process.poll() is not None:
        return ''
    process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out or ''


def wait_answering(probe, frame: np.ndarray, timeout: float, perception: subprocess.Popen) -> None:
    """Probe until the perception node answers (it loads its model first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if perception.poll() is not None:
            raise SystemExit(f'perception node exited: {perception.stderr.read()[-2000:]}')
        if probe.subscribers > 0 and probe.predict([frame])[0] is not None:
            return
        time.sleep(0.5)
    raise SystemExit(f'the perception node did not answer within {timeout:g} s')


def throughput(args: argparse.Namespace, node, perception: subprocess.Popen) -> bool:
    """Alternate in-process and ros searches; print the figures; return whether every check held."""
    from metavlm_ros.method.search import SearchConfig, run_search
    from metavlm_ros.models.vlm import create_backend
    from metavlm_ros.ros.probe_client import RosProbeBackend, TransportSizeBackend

    width, height = parse_size(args.frame_size)
    frame = synthetic_frames(width, height, 1)[0]
    config = SearchConfig(
        algorithm='random',
        population=args.population,
        evaluations=args.evaluations,
        seed=args.seed,
        working_size=args.working_size,
    ).validate()
    probe = RosProbeBackend(node, timeout_s=args.probe_timeout)
    through_ros = TransportSizeBackend(probe, args.transport_size)
    wait_answering(probe, through_ros.reduce(frame), 180.0, perception)
    in_process = TransportSizeBackend(
        create_backend(args.backend, args.model, device=args.device, batch_size=args.population),
        args.transport_size,
    )
    in_process.predict([frame] * 2)  # warm-up: first-call allocations are not throughput
    through_ros.predict([frame] * 2)

    rates: dict[str, list[float]] = {'inprocess': [], 'ros': []}
    runs: dict[str, list] = {'inprocess': [], 'ros': []}
    backends = {'inprocess': in_process, 'ros': through_ros}
    for r in range(args.repeats):
        order = ['inprocess', 'ros'] if r % 2 == 0 else ['ros', 'inprocess']
        for name in order:
            result = run_search(frame, backends[name], config, image_id=name)
            rates[name].append(len(result.evaluations) / result.seconds)
            runs[name].append(result)
            failed = sum(ev.failed for ev in result.evaluations)
            print(
                f'  repetition {r} {name:>9}: {len(result.evaluations)} evaluations in '
                f'{result.seconds:.2f} s = {rates[name][-1]:.1f} eval/s '
                f'({result.frames_judged} frames judged, {failed} failed)',
                flush=True,
            )
    ratio = float(np.median(rates['ros']) / np.median(rates['inprocess']))
    print(f'    eval/s min / median / max: in-process {fmt(rates["inprocess"])}, ros {fmt(rates["ros"])}')
    pairs = ', '.join(f'{a / b:.2f}' for a, b in zip(rates['ros'], rates['inprocess'], strict=True))
    print(f'    ratio of the medians ros / in-process = {ratio:.3f} (target >= 0.9); per repetition {pairs}')
    print(
        f'    probe latency p50 {probe.latency.percentile_ms(50):.1f} ms, '
        f'p95 {probe.latency.percentile_ms(95):.1f} ms; frames {width}x{height} searched at '
        f'{runs["ros"][0].working_size} px, sent at transport {args.transport_size} px'
    )
    reference = runs['inprocess'][0].evaluations
    ok = True
    for name, results in runs.items():
        for result in results:
            same = len(result.evaluations) == len(reference) and all(
                np.array_equal(a.genotype, b.genotype)
                for a, b in zip(result.evaluations, reference, strict=True)
            )
            pairs = zip(result.evaluations, reference, strict=False)
            gap = max((abs(a.f_pred - b.f_pred) for a, b in pairs), default=0.0)
            failed = sum(ev.failed for ev in result.evaluations)
            if not same or gap > 1e-4 or failed:
                ok = False
                print(
                    f'  [FAIL] {name}: same genotypes {same}, largest f_pred difference {gap:.2e}, '
                    f'{failed} failed'
                )
    if ok:
        print(
            f'  [ok] all {2 * args.repeats} runs judged the same {len(reference)} genotypes, f_pred '
            'within 1e-4 of the first in-process run, no probe failed'
        )
    probe.close()
    return ok


def camera_run(args: argparse.Namespace, context, executor) -> None:
    from rclpy.parameter import Parameter

    from metavlm_ros.ros.managed import bring_up
    from metavlm_ros.ros.tester_node import TesterNode

    results = tempfile.mkdtemp(prefix='metavlm-bench-')
    overrides = {
        'vlm_endpoint': 'ros',
        'population': args.population,
        'evaluations': args.evaluations,
        'seed': args.seed,
        'frame_period_s': 0.0,
        'transport_size': args.transport_size,
        'working_size': {None: 0, 'auto': -1}.get(args.working_size, args.working_size),
        'probe_timeout_s': args.probe_timeout,
        'results_dir': results,
    }
    tester = TesterNode(
        context=context, parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()]
    )
    bring_up(tester)
    executor.add_node(tester)
    camera = subprocess.Popen(
        [sys.executable, __file__, '--role', 'camera', '--frame-size', args.frame_size,
         '--camera-rate', str(args.camera_rate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while tester.frames_received == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if tester.frames_received == 0:
            raise SystemExit('the tester received no camera frame within 60 s')
        rss_start = rss_mib()
        received_start = tester.frames_received
        started = time.monotonic()
        peak = rss_start
        next_report = started + 30
        while time.monotonic() - started < args.duration:
            time.sleep(0.5)
            peak = max(peak, rss_mib())
            if time.monotonic() >= next_report:
                next_report += 30
                print(
                    f'    t={time.monotonic() - started:5.0f} s: RSS {rss_mib():.0f} MiB, '
                    f'{tester.frames_received} received, {tester.frames_dropped} dropped, '
                    f'{tester.searches_done} searches',
                    flush=True,
                )
        elapsed = time.monotonic() - started
        rss_end = rss_mib()
        received = tester.frames_received - received_start
        camera_out = stop_process(camera)
        status = {kv.key: kv.value for kv in tester.diagnostics().values}
    finally:
        stop_process(camera)
        executor.remove_node(tester)
        tester.destroy_node()
    print(camera_out.strip().splitlines()[-1] if camera_out.strip() else 'camera: no report')
    print(f'   tester: RSS {rss_start:.0f} MiB at start, {rss_end:.0f} MiB at the end, peak {peak:.0f} MiB')
    print(
        f'   tester: {received} frames received in the {elapsed:.0f} s window ({received / elapsed:.1f} Hz); '
        f'in all {tester.frames_received} received, {tester.frames_dropped} dropped, '
        f'{tester.searches_done} searches, {tester.evaluations} evaluations '
        f'({tester.evaluations_failed} failed)'
    )
    print(
        f'   tester: camera callback longest run {tester.camera_callback_max_s * 1000:.2f} ms; '
        f'probe latency p50 {status["probe_latency_p50_ms"]} ms, p95 {status["probe_latency_p95_ms"]} ms'
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --role camera, the camera process it starts)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--role', choices=('bench', 'camera'), default='bench', help=argparse.SUPPRESS)
    parser.add_argument('--backend', default='clip')
    parser.add_argument('--model', default='demo', help='model id or directory (default: the demo CLIP)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--population', type=int, default=30)
    parser.add_argument('--evaluations', type=int, default=300, help='budget of the throughput search')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--transport-size', type=int, default=384)
    parser.add_argument(
        '--working-size', default='auto', help='auto (the default), full or pixels (as metavlm search)'
    )
    parser.add_argument('--repeats', type=int, default=3, help='throughput repetitions, order alternating')
    parser.add_argument('--probe-timeout', type=float, default=10.0)
    parser.add_argument('--frame-size', default='1920x1080', help='camera and search frame size WxH')
    parser.add_argument('--camera-rate', type=float, default=30.0)
    parser.add_argument(
        '--duration', type=float, default=120.0, help='seconds of the camera run (default 120)'
    )
    parser.add_argument(
        '--dds',
        choices=('default', 'shm'),
        default='default',
        help='default: Fast DDS as installed; shm: shared memory only, 64 MiB segments (large frames)',
    )
    parser.add_argument('--skip-throughput', action='store_true')
    parser.add_argument('--skip-camera', action='store_true')
    args = parser.parse_args(argv)
    if args.role == 'camera':
        return camera_main(args)  # inherits the DDS profile of the bench through the environment
    from metavlm_ros.common.images import parse_working_size

    args.working_size = parse_working_size(args.working_size)
    dds = 'Fast DDS defaults'
    if args.dds == 'shm':
        dds = f'shared memory only, 64 MiB segments ({use_shm_profile()})'

    import rclpy
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor

    print(
        f'ros_probe: {args.backend} {args.model!r} on {args.device}, {args.frame_size} frames, '
        f'population {args.population}, transport {args.transport_size} px, {os.cpu_count()} CPUs, '
        f'ROS_DOMAIN_ID {os.environ["ROS_DOMAIN_ID"]}, DDS: {dds}',
        flush=True,
    )
    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node('metavlm_bench', context=context)
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    perception = start_perception(args)
    ok = True
    try:
        if not args.skip_throughput:
            print(
                f'throughput (Rand, {args.evaluations} evaluations, seed {args.seed}, same frame and model, '
                f'{args.repeats} repetitions):'
            )
            ok = throughput(args, node, perception)
        if not args.skip_camera:
            print(f'camera run ({args.frame_size} rgb8 at {args.camera_rate:g} Hz for {args.duration:g} s):')
            camera_run(args, context, executor)
    finally:
        stop_process(perception)
        executor.shutdown(timeout_sec=2)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
