"""Benchmark: the live Foxglove server's cost on `metavlm search`'s evaluations/s, with one client and none.

Usage: python bench/foxglove_live.py [--model tiny|base] [--frames 2] [--size 640x480]
       [--population 20] [--evaluations 1000] [--repeats 7] [--threads 1]
Each repetition runs `metavlm search` (its CLI entry point, in this process) on the same frames and
seed in three variants, in an order rotated by one each time: without `--foxglove-port`; serving with
no client; serving with one client, a separate process that speaks Foxglove's WebSocket protocol
(subprotocol `foxglove.sdk.v1`), subscribes to every channel and drains what it receives, as a
viewer's socket does. Two figures per variant: evaluations/s as the search reports them
(summary.jsonl: evaluations / seconds, model load excluded), and the CPU seconds the process spent
(every thread: the search's and the server's), which other load on a shared machine barely moves.
The tiny model is the worst case: the less the model costs, the larger the server's share. Torch
runs --threads threads (1: OpenMP threads spinning against other processes make wall time noise).
Checks: every variant writes the same records; the client received every violation the search wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import resource
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import torch
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, rotations  # noqa: E402

from metavlm_ros.cli import main as cli_main
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.models.tiny import build_base_model, build_tiny_model
from metavlm_ros.viewer import live

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
                    print('subscribed', flush=True)
                continue
            _opcode, subscription, _time = struct.unpack_from('<BIQ', message)
            counts[topics[subscription]] = counts.get(topics[subscription], 0) + 1
    except websockets.ConnectionClosed:
        pass  # the search ended and its server stopped
    return counts


@contextlib.contextmanager
def _viewer_watching(client: subprocess.Popen | None):
    """With a client: the search starts once it has subscribed, as when a viewer is already open.

    The server is made in `metavlm search` itself; its constructor is wrapped to wait for the
    client's word (its CPU is counted either way: the wait sleeps on a pipe).
    """
    if client is None:
        yield
        return
    original = live.LiveServer.__init__

    def wait_for_client(self, *args, **kwargs):
        original(self, *args, **kwargs)
        line = client.stdout.readline()
        if line.strip() != 'subscribed':
            raise SystemExit(f'the client did not subscribe ({line!r})')

    live.LiveServer.__init__ = wait_for_client
    try:
        yield
    finally:
        live.LiveServer.__init__ = original


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
        # A process of its own: its CPU is the viewer's, not the search's. It connects while the
        # model loads; the check at the end fails should it ever miss a record.
        client = subprocess.Popen(
            [sys.executable, __file__, '--client', str(port)], stdout=subprocess.PIPE, text=True
        )
    before = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        with _viewer_watching(client):
            code = cli_main(command)
    after = resource.getrusage(resource.RUSAGE_SELF)
    if code != 0:
        raise SystemExit(f'{variant}: metavlm search exited {code}')
    counts = {}
    if client is not None:
        stdout, _ = client.communicate(timeout=60)
        counts = json.loads(stdout.splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summaries = read_jsonl(out / 'summary.jsonl')
    rate = sum(x['evaluations'] for x in summaries) / sum(x['seconds'] for x in summaries)
    return rate, cpu, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        for variant in VARIANTS:  # warm-up, not counted: the first search in a process pays for lazy imports
            search(variant, args, model, frames, root / 'warm-up')
        for order in rotations(VARIANTS, args.repeats):
            for variant in order:
                out = root / 'out' / variant.replace(' ', '_').replace(',', '')
                rate, cpu, counts = search(variant, args, model, frames, out)
                rates[variant].append(rate)
                cpus[variant].append(cpu)
                evaluations = read_jsonl(out / 'evaluations.jsonl')
                records.setdefault(variant, [(r['index'], r['f_trans'], r['f_pred']) for r in evaluations])
                if variant == 'server, one client':
                    violating = sum(1 for r in evaluations if r['order'] and any(r['violation'].values()))
                    received.append((counts, violating))
        print(
            f'metavlm search, {args.model} CLIP ({args.threads} torch thread(s)), {args.frames} frame(s) '
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
        checks.check(
            all(c.get('/metavlm/violations') == n and n > 0 for c, n in received),
            'the client received every violation the search wrote',
        )
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
