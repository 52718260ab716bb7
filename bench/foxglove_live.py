"""Benchmark: the live Foxglove server's cost on the tester node's evaluations/s (or `metavlm search`'s),
with one client connected and with none.

Usage: python bench/foxglove_live.py [--subject tester|search] [--model tiny|base] [--frames 2]
       [--size 640x480] [--population 20] [--evaluations 1000] [--repeats 7] [--threads 1]
Each repetition searches the same frames with the same seed in three variants, in an order rotated by
one each time: no server (`foxglove_port` 0, no `--foxglove-port`); serving with no client; serving
with one client, a separate process that speaks Foxglove's WebSocket protocol (subprotocol
`foxglove.sdk.v1`), subscribes to every channel and drains what it receives, as a viewer's socket
does; the frames go out once it has subscribed. The tester (the default subject) runs in this
process with the inprocess endpoint, brought to active as the launch files do, fed one camera frame
per search over DDS (loopback, a domain of its own); `metavlm search` runs through its CLI entry
point with `--foxglove-wait`. Two figures per variant: evaluations/s as the searches report them
(summary.jsonl: evaluations / seconds; model load excluded), and the CPU seconds the process spent
searching (every thread: the search's, the server's, the executor's), which other load on a shared
machine barely moves. The tiny model is the worst case: the less the model costs, the larger the
server's share. Torch runs --threads threads (1: OpenMP threads spinning against other processes
make wall time noise). Checks: every variant writes the same records; the client received every
violation written (the tester's violations.jsonl, the search's violating evaluations).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import torch
import websockets

# DDS stays on this machine, in a domain of this run's own.
os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
os.environ.setdefault('ROS_DOMAIN_ID', str(150 + os.getpid() % 70))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, rotations  # noqa: E402

from metavlm_ros.cli import main as cli_main
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.models.tiny import build_base_model, build_tiny_model

SUBPROTOCOL = 'foxglove.sdk.v1'
VARIANTS = ('no server', 'server, no client', 'server, one client')


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


async def watch(port: int) -> dict[str, int]:
    """Be a Foxglove client until the server goes: subscribe to every channel, count messages per topic."""
    for _ in range(3000):
        try:
            ws = await websockets.connect(f'ws://127.0.0.1:{port}', subprotocols=[SUBPROTOCOL])
            break
        except OSError:
            await asyncio.sleep(0.01)
    else:
        return {}
    counts: dict[str, int] = {}
    topics: dict[int, str] = {}
    try:
        async for message in ws:
            if isinstance(message, str):
                parsed = json.loads(message)
                if parsed['op'] == 'advertise':
                    subscribe = []
                    for channel in parsed['channels']:
                        topics[len(topics) + 1] = channel['topic']
                        subscribe.append({'id': len(topics), 'channelId': channel['id']})
                    await ws.send(json.dumps({'op': 'subscribe', 'subscriptions': subscribe}))
                continue
            _opcode, subscription, _time = struct.unpack_from('<BIQ', message)
            counts[topics[subscription]] = counts.get(topics[subscription], 0) + 1
    except websockets.ConnectionClosed:
        pass  # the search ended and its server stopped
    return counts


def _client(port: int) -> subprocess.Popen:
    # A process of its own: its CPU is the viewer's, not the searcher's.
    return subprocess.Popen(
        [sys.executable, __file__, '--client', str(port)], stdout=subprocess.PIPE, text=True
    )


def _counts(client: subprocess.Popen | None) -> dict:
    if client is None:
        return {}
    stdout, _ = client.communicate(timeout=60)
    return json.loads(stdout.splitlines()[-1])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def search(variant: str, args, model: Path, frames: Path, out: Path) -> tuple[float, float, dict]:
    """One `metavlm search`; returns (evaluations/s, CPU seconds, messages per topic the client got)."""
    port = free_port()
    command = [
        'search', str(frames), '--backend', 'clip', '--model', str(model), '--quiet',
        '--population', str(args.population), '--evaluations', str(args.evaluations), '--seed', '1',
        '--out', str(out), '--overwrite',
    ]  # fmt: skip
    if variant != 'no server':
        command += ['--foxglove-port', str(port)]
    client = None
    if variant == 'server, one client':
        # The search starts once the client has subscribed, as when a viewer is already open; the
        # wait (a sleep on a condition) is in the CPU figure of this variant only, and costs nothing.
        command += ['--foxglove-wait', '60']
        client = _client(port)
    before = _cpu()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(command)
    cpu = _cpu() - before
    if code != 0:
        raise SystemExit(f'{variant}: metavlm search exited {code}')
    counts = _counts(client)
    summaries = read_jsonl(out / 'summary.jsonl')
    rate = sum(x['evaluations'] for x in summaries) / sum(x['seconds'] for x in summaries)
    return rate, cpu, counts


def tester(variant: str, args, model: Path, frames: Path, out: Path) -> tuple[float, float, dict]:
    """The tester node (inprocess endpoint) searching each frame of `frames` once; as `search`."""
    import shutil

    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from metavlm_ros.ros.conversions import rgb_to_image_msg
    from metavlm_ros.ros.managed import bring_up, shut_down
    from metavlm_ros.ros.tester_node import TesterNode

    shutil.rmtree(out, ignore_errors=True)
    port = free_port() if variant != 'no server' else 0
    values = {
        'vlm_endpoint': 'inprocess', 'model': str(model), 'device': 'cpu', 'population': args.population,
        'evaluations': args.evaluations, 'seed': 1, 'frame_period_s': 0.0, 'results_dir': str(out),
        'foxglove_port': port, 'report_threshold': 0.01,  # the smallest: the most violations go out
    }  # fmt: skip
    context = Context()
    rclpy.init(context=context)
    node = TesterNode(context=context, parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
    camera = rclpy.create_node('bench_camera', context=context)
    publisher = camera.create_publisher(Image, 'image', qos_profile_sensor_data)
    executor = SingleThreadedExecutor(context=context)
    client = None
    try:
        bring_up(node)  # the model loads here: not counted
        for each in (node, camera):
            executor.add_node(each)

        def spin_until(done, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                if time.monotonic() > deadline:
                    raise SystemExit(f'{variant}: no {what} within {timeout:g} s')
                executor.spin_once(timeout_sec=0.05)

        spin_until(lambda: publisher.get_subscription_count() > 0, 30, 'camera subscription')
        if variant == 'server, one client':
            client = _client(port)
            spin_until(lambda: node.live.viewers > 0, 60, 'Foxglove client')
            time.sleep(0.3)  # its other subscriptions (one message: there are none)
        before = _cpu()
        images = [cv2.imread(str(path))[..., ::-1].copy() for path in sorted(frames.glob('*.png'))]
        for i, frame in enumerate(images):
            publisher.publish(rgb_to_image_msg(frame, 1_000_000_000 * (i + 1), 'camera'))
            spin_until(lambda i=i: node.searches_done == i + 1, 3600, f'search {i + 1}')
        cpu = _cpu() - before
        if client is not None:
            time.sleep(0.5)  # what the server has queued reaches the client before it stops
    finally:
        executor.shutdown(timeout_sec=2)
        shut_down(node)  # the server stops: the client ends and reports
        node.destroy_node()
        camera.destroy_node()
        rclpy.try_shutdown(context=context)
    counts = _counts(client)
    summaries = read_jsonl(out / 'summary.jsonl')
    rate = sum(x['evaluations'] for x in summaries) / sum(x['seconds'] for x in summaries)
    return rate, cpu, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--subject', choices=('tester', 'search'), default='tester')
    parser.add_argument('--model', choices=('tiny', 'base'), default='tiny')
    parser.add_argument('--frames', type=int, default=2)
    parser.add_argument('--size', default='640x480')
    parser.add_argument('--population', type=int, default=20)
    parser.add_argument('--evaluations', type=int, default=1000)
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--threads', type=int, default=1, help='torch threads')
    parser.add_argument('--client', type=int, metavar='PORT', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        print(json.dumps(asyncio.run(watch(args.client))))
        return 0
    torch.set_num_threads(args.threads)
    width, height = (int(v) for v in args.size.split('x'))
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-live-') as root:
        root = Path(root)
        build = build_base_model if args.model == 'base' else build_tiny_model
        model = build('clip', root / 'model', seed=0)
        frames = root / 'frames'
        frames.mkdir()
        scenes = SceneGenerator(width, height, 0.5, seed=3, frames=args.frames)
        for i in range(args.frames):
            cv2.imwrite(str(frames / f'f{i}.png'), scenes.frame(i)[0][..., ::-1])
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
        records: dict[str, list] = {}
        received: list[tuple[dict, int]] = []
        run = tester if args.subject == 'tester' else search
        for variant in VARIANTS:  # warm-up, not counted: the first search in a process pays for lazy imports
            run(variant, args, model, frames, root / 'warm-up')
        for order in rotations(VARIANTS, args.repeats):
            for variant in order:
                out = root / 'out' / variant.replace(' ', '_').replace(',', '')
                rate, cpu, counts = run(variant, args, model, frames, out)
                rates[variant].append(rate)
                cpus[variant].append(cpu)
                evaluations = read_jsonl(out / 'evaluations.jsonl')
                records.setdefault(variant, [(r['index'], r['f_trans'], r['f_pred']) for r in evaluations])
                if variant == 'server, one client':
                    if args.subject == 'tester':  # what it published, at its report threshold
                        violating = len(read_jsonl(out / 'violations.jsonl'))
                    else:
                        violating = sum(1 for r in evaluations if r['order'] and any(r['violation'].values()))
                    received.append((counts, violating))
        subject = 'tester node (inprocess endpoint)' if args.subject == 'tester' else 'metavlm search'
        print(
            f'{subject}, {args.model} CLIP ({args.threads} torch thread(s)), {args.frames} frame(s) '
            f'of {args.size}, population {args.population}, {args.evaluations} evaluations each; '
            f'{args.repeats} interleaved repeats, min / median / max'
        )
        for variant in VARIANTS:
            print(
                f'  {variant:20s} evaluations/s {fmt(sorted(rates[variant]), digits=1):22s} '
                f'CPU s {fmt(sorted(cpus[variant]), digits=2)}'
            )
        for variant in VARIANTS[1:]:
            # Paired by repetition: each repeat ran every variant back to back under the same load.
            slower = [1 - c / b for c, b in zip(rates[variant], rates['no server'], strict=True)]
            more = [c / b - 1 for c, b in zip(cpus[variant], cpus['no server'], strict=True)]
            print(
                f'  cost of {variant:20s} evaluations/s {fmt(sorted(slower), scale=100, digits=1)} %, '
                f'CPU {fmt(sorted(more), scale=100, digits=1)} % (per repeat)'
            )
        checks.check(
            len({json.dumps(r) for r in records.values()}) == 1, 'every variant wrote the same records'
        )
        print(f'  violations published per run (one client): {sorted(n for _, n in received)}')
        checks.check(
            all(c.get('/metavlm/violations') == n and n > 0 for c, n in received),
            'the client received every violation written',
        )
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
