"""Benchmark: the live Foxglove server's cost on `metavlm search`'s evaluations/s, with one client and none.

Usage: python bench/foxglove_live.py [--model tiny|base] [--frames 2] [--size 640x480]
       [--population 20] [--evaluations 300] [--repeats 5]
Each repetition runs `metavlm search` (a subprocess, as users run it) on the same frames and seeds in
three variants, in an order rotated by one each time: without `--foxglove-port`; serving with no
client; serving with one client that speaks Foxglove's WebSocket protocol (subprotocol
`foxglove.sdk.v1`), subscribes to every channel and decodes nothing (it drains, as a viewer's socket
does). Evaluations/s are the searches' own (summary.jsonl: evaluations / seconds, model load
excluded). The tiny model is the worst case: the less the model costs, the larger the server's share.
Checks: every variant writes the same records; the client received every violation the search wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import cv2
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, rotations  # noqa: E402

from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.models.tiny import build_base_model, build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
SUBPROTOCOL = 'foxglove.sdk.v1'
VARIANTS = ('no server', 'server, no client', 'server, one client')


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


class Client(threading.Thread):
    """A Foxglove WebSocket client in its own thread: subscribes to every channel, counts messages."""

    def __init__(self, port: int, process: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.port, self.process = port, process
        self.counts: dict[str, int] = {}
        self.connected = threading.Event()

    def run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        while True:
            try:
                ws = await websockets.connect(f'ws://127.0.0.1:{self.port}', subprotocols=[SUBPROTOCOL])
                break
            except OSError:
                if self.process.poll() is not None:
                    return
                await asyncio.sleep(0.02)
        self.connected.set()
        topics: dict[int, str] = {}
        try:
            async for message in ws:
                if isinstance(message, str):
                    parsed = json.loads(message)
                    if parsed['op'] == 'advertise':
                        fresh = [c for c in parsed['channels'] if c['id'] not in topics.values()]
                        subscribe = []
                        for channel in fresh:
                            topics[len(topics) + 1] = channel['topic']
                            subscribe.append({'id': len(topics), 'channelId': channel['id']})
                        await ws.send(json.dumps({'op': 'subscribe', 'subscriptions': subscribe}))
                    continue
                _opcode, subscription, _time = struct.unpack_from('<BIQ', message)
                topic = topics[subscription]
                self.counts[topic] = self.counts.get(topic, 0) + 1
        except websockets.ConnectionClosed:
            pass  # the search ended and its server stopped


def search(variant: str, args, model: Path, frames: Path, out: Path) -> tuple[float, dict]:
    """One `metavlm search`; returns (evaluations/s, messages per topic the client received)."""
    command = [
        sys.executable, '-m', 'metavlm_ros.cli', 'search', str(frames), '--backend', 'clip',
        '--model', str(model), '--quiet', '--population', str(args.population),
        '--evaluations', str(args.evaluations), '--seed', '1', '--out', str(out), '--overwrite',
    ]  # fmt: skip
    port = free_port()
    if variant != 'no server':
        command += ['--foxglove-port', str(port)]
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = None
    if variant == 'server, one client':
        client = Client(port, process)
        client.start()
    _, stderr = process.communicate(timeout=1800)
    if process.returncode != 0:
        raise SystemExit(f'{variant}: metavlm search failed: {stderr.strip()}')
    if client is not None:
        client.join(timeout=30)
        if not client.connected.is_set():
            raise SystemExit(f'{variant}: the client never connected')
    summaries = read_jsonl(out / 'summary.jsonl')
    rate = sum(s['evaluations'] for s in summaries) / sum(s['seconds'] for s in summaries)
    return rate, dict(client.counts) if client else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', choices=('tiny', 'base'), default='tiny')
    parser.add_argument('--frames', type=int, default=2)
    parser.add_argument('--size', default='640x480')
    parser.add_argument('--population', type=int, default=20)
    parser.add_argument('--evaluations', type=int, default=300)
    parser.add_argument('--repeats', type=int, default=5)
    args = parser.parse_args()
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
        records: dict[str, list] = {}
        received: list[tuple[dict, int]] = []
        for order in rotations(VARIANTS, args.repeats):
            for variant in order:
                out = root / 'out' / variant.replace(' ', '_').replace(',', '')
                rate, counts = search(variant, args, model, frames, out)
                rates[variant].append(rate)
                evaluations = read_jsonl(out / 'evaluations.jsonl')
                records.setdefault(variant, [(r['index'], r['f_trans'], r['f_pred']) for r in evaluations])
                if counts:
                    violating = sum(1 for r in evaluations if r['order'] and any(r['violation'].values()))
                    received.append((counts, violating))
        print(
            f'metavlm search, {args.model} CLIP, {args.frames} frame(s) of {args.size}, population '
            f'{args.population}, {args.evaluations} evaluations each; {args.repeats} interleaved repeats'
        )
        base = sorted(rates['no server'])
        for variant in VARIANTS:
            values = sorted(rates[variant])
            print(f'  {variant:20s} evaluations/s {fmt(values, digits=1)} (min / median / max)')
        for variant in VARIANTS[1:]:
            # Paired by repetition: each repeat ran all variants back to back under the same load.
            costs = sorted(1 - c / b for c, b in zip(rates[variant], rates['no server'], strict=True))
            print(
                f'  cost of {variant:20s} {fmt(costs, scale=100, digits=1)} % per repeat (min / median / max)'
            )
        median = sorted(rates['server, one client'])[len(base) // 2] / base[len(base) // 2]
        print(f'  median evaluations/s with one client / without a server: {median:.3f}')
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
