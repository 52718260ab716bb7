"""Benchmark: the share of raw camera frames that reach a subscriber like the tester's, per DDS transport.

A camera process publishes rgb8 sensor_msgs/Image frames at --rate Hz (default 10) on `image` with
the sensor-data QoS of camera drivers; a second process subscribes with the tester's QoS for its
image subscription (`qos_profile_sensor_data`: best effort, keep last 5) and counts its callbacks.
Both processes get the transport under test through the environment, as `ros2 launch` and the
`metavlm` commands give it to the nodes they start:

- default: Fast DDS as installed (UDPv4 and shared memory with 512 KiB segments);
- project: what local runs of metavlm_ros use (`metavlm_ros.ros.transport.local_transport_env`);
- shm: the shipped profile config/fastdds_shm.xml on its own (shared memory only, 64 MiB segments);
- large_data: FASTDDS_BUILTIN_TRANSPORTS=LARGE_DATA (Fast DDS >= 2.13);
- external: a camera driver left as installed (default) sending to nodes on the project's transport.

Repetitions are interleaved (repeat, then size, then transport), and the shares are printed as
min / median / max over the repetitions. Target: >= 95 % at 1920x1080 for `project`.

    python bench/frame_delivery.py                                  # 640x360 and 1080p, 3 repeats
    python bench/frame_delivery.py --repeats 5 --frames 100 --transports default project shm large_data
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRANSPORTS = ('default', 'project', 'external', 'shm', 'large_data', 'xml')
# Everything that chooses Fast DDS transports: each run starts from none of them.
from metavlm_ros.ros.transport import USER_VARIABLES as TRANSPORT_VARIABLES  # noqa: E402


def transport_env(name: str) -> dict[str, str]:
    """The environment of both processes for one transport (DDS stays on this machine)."""
    env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_VARIABLES}
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env.setdefault('ROS_DOMAIN_ID', str(150 + os.getpid() % 70))
    if name == 'project':
        from metavlm_ros.ros.transport import local_transport_env

        env.update(local_transport_env())
    elif name == 'shm':
        env['FASTDDS_DEFAULT_PROFILES_FILE'] = str(ROOT / 'config' / 'fastdds_shm.xml')
    elif name == 'large_data':
        env['FASTDDS_BUILTIN_TRANSPORTS'] = 'LARGE_DATA'
    elif name == 'xml':
        env['FASTDDS_DEFAULT_PROFILES_FILE'] = os.environ['BENCH_XML']
    return env


# -- the two processes --------------------------------------------------------------------------------


def camera_main(args: argparse.Namespace) -> int:
    """Wait for the subscriber, publish --frames frames at --rate Hz, print how many went out."""
    import numpy as np
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from metavlm_ros.ros.conversions import ns_to_stamp, rgb_to_image_msg

    width, height = (int(v) for v in args.size.split('x'))
    rng = np.random.default_rng(0)
    messages = [rgb_to_image_msg(rng.integers(0, 256, (height, width, 3), np.uint8), 0) for _ in range(2)]
    rclpy.init()
    node = rclpy.create_node('bench_camera')
    publisher = node.create_publisher(Image, 'image', qos_profile_sensor_data)
    deadline = time.monotonic() + 20
    while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # both directions of discovery settled: the first frames count too
    period = 1.0 / args.rate
    next_at = time.monotonic()
    for i in range(args.frames):
        msg = messages[i % 2]
        msg.header.stamp = ns_to_stamp(time.time_ns())
        publisher.publish(msg)
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    time.sleep(1.0)  # let the last frames arrive before the publisher goes
    print(args.frames, flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def subscriber_main(args: argparse.Namespace) -> int:
    """Count callbacks with the tester's image QoS until the camera has come and gone; print the count."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node('bench_tester')
    received = [0]

    def on_image(msg: Image) -> None:
        received[0] += 1

    subscription = node.create_subscription(Image, 'image', on_image, qos_profile_sensor_data)
    seen = False
    deadline = time.monotonic() + 30 + args.frames / args.rate
    while time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
        publishers = subscription.get_publisher_count()
        seen = seen or publishers > 0
        if seen and publishers == 0:
            break
    for _ in range(10):  # what is already queued
        rclpy.spin_once(node, timeout_sec=0.01)
    print(received[0], flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def trial(transport: str, size: str, frames: int, rate: float) -> float:
    """Run one camera/subscriber pair; the share of published frames that reached the callback."""
    env = transport_env('project' if transport == 'external' else transport)
    camera_env = transport_env('default') if transport == 'external' else env
    common = ['--size', size, '--frames', str(frames), '--rate', str(rate)]
    me = [sys.executable, str(Path(__file__).resolve())]
    sub = subprocess.Popen([*me, '--role', 'subscriber', *common], env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    cam = subprocess.run(
        [*me, '--role', 'camera', *common], env=camera_env, capture_output=True, text=True, timeout=120
    )
    out, _ = sub.communicate(timeout=60)
    if cam.returncode != 0 or sub.returncode != 0:
        raise RuntimeError(
            f'{transport} {size}: camera {cam.returncode}, subscriber {sub.returncode}: {cam.stderr}'
        )
    return int(out.split()[-1]) / int(cam.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--role', choices=('bench', 'camera', 'subscriber'), default='bench', help=argparse.SUPPRESS
    )
    parser.add_argument('--size', default='640x360', help=argparse.SUPPRESS)
    parser.add_argument('--sizes', nargs='+', default=['640x360', '1920x1080'], help='frame sizes WxH')
    parser.add_argument('--transports', nargs='+', choices=TRANSPORTS, default=['default', 'project'])
    parser.add_argument('--frames', type=int, default=50, help='frames per trial (default 50)')
    parser.add_argument('--rate', type=float, default=10.0, help='camera rate in Hz (default 10)')
    parser.add_argument('--repeats', type=int, default=3, help='interleaved repetitions (default 3)')
    args = parser.parse_args()
    if args.role == 'camera':
        return camera_main(args)
    if args.role == 'subscriber':
        return subscriber_main(args)

    print(
        f"{args.frames} rgb8 frames at {args.rate:g} Hz per trial, subscriber QoS = the tester's "
        f'(sensor data: best effort, keep last 5), {args.repeats} interleaved repeats, '
        f'ROS_DOMAIN_ID {transport_env("default")["ROS_DOMAIN_ID"]}, LOCALHOST discovery'
    )
    shares: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for size in args.sizes:
            for transport in args.transports:
                share = trial(transport, size, args.frames, args.rate)
                shares.setdefault((size, transport), []).append(share)
                print(f'  repeat {repeat + 1} {size:>9} {transport:>10}: {share:6.1%}', flush=True)
    print(f'\n{"size":>9} {"transport":>10}   share of frames received: min / median / max')
    for (size, transport), values in shares.items():
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f'{size:>9} {transport:>10}   {low:6.1%} / {mid:6.1%} / {high:6.1%}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
