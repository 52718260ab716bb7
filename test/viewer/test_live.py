"""A live `metavlm search` watched over Foxglove's WebSocket protocol by a real client, and a busy port."""

import asyncio
import base64
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import cv2
import websockets
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl
from test.conftest import make_frame

ROOT = Path(__file__).resolve().parents[2]
SUBPROTOCOL = 'foxglove.sdk.v1'  # what foxglove-sdk 0.30 serves (it refuses foxglove.websocket.v1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def protobuf_class(channel):
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(channel['schema']))
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(channel['schemaName']))


async def watch(port: int, process: subprocess.Popen) -> dict[str, list]:
    """Connect as Foxglove does, subscribe to every channel, collect messages until the summary."""
    for _ in range(600):
        try:
            ws = await websockets.connect(f'ws://127.0.0.1:{port}', subprotocols=[SUBPROTOCOL])
            break
        except OSError:
            assert process.poll() is None, 'the search ended before its server answered'
            await asyncio.sleep(0.05)
    received: dict[str, list] = {}
    channels: dict[int, dict] = {}
    subscriptions: dict[int, dict] = {}
    async with ws:
        assert ws.subprotocol == SUBPROTOCOL
        while True:
            message = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(message, str):
                parsed = json.loads(message)
                if parsed['op'] == 'advertise':
                    fresh = [c for c in parsed['channels'] if c['id'] not in channels]
                    for channel in fresh:
                        channels[channel['id']] = channel
                        subscriptions[len(subscriptions) + 1] = channel
                    subscribe = [
                        {'id': sid, 'channelId': c['id']} for sid, c in subscriptions.items() if c in fresh
                    ]
                    await ws.send(json.dumps({'op': 'subscribe', 'subscriptions': subscribe}))
                continue
            opcode, subscription, log_time = struct.unpack_from('<BIQ', message)
            assert opcode == 1  # message data
            channel = subscriptions[subscription]
            payload = message[13:]
            if channel['encoding'] == 'json':
                decoded = json.loads(payload)
            else:
                decoded = protobuf_class(channel).FromString(payload)
            received.setdefault(channel['topic'], []).append((log_time, decoded))
            if channel['topic'] == '/metavlm/summary':
                return received


def test_a_live_search_is_watched_over_the_foxglove_websocket(tmp_path, tiny_clip_dir):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(96, 64)[..., ::-1])
    out, port = tmp_path / 'res', free_port()
    command = [
        sys.executable, '-m', 'metavlm_ros.cli', 'search', str(image), '--backend', 'clip',
        '--model', str(tiny_clip_dir), '--quiet', '--population', '6', '--evaluations', '18',
        '--out', str(out), '--foxglove-port', str(port),
    ]  # fmt: skip
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        received = asyncio.run(watch(port, process))
    finally:
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f'ws://127.0.0.1:{port}' in stderr

    # What went out live is what was written: every violation, and each kept follow-up annotated.
    evaluations = read_jsonl(out / 'evaluations.jsonl')
    violations = [r for r in evaluations if r['order'] and any(r['violation'].values())]
    assert violations
    assert [m['index'] for _, m in received['/metavlm/violations']] == [r['index'] for r in violations]
    framed = [r for r in read_jsonl(out / 'pareto.jsonl') if r['frame'] and any(r['violation'].values())]
    annotations = received['/metavlm/followup/annotations']
    assert len(annotations) == len(framed) > 0
    for (time, note), record in zip(annotations, framed, strict=True):
        assert time == 10**9  # the first search of image files: one second, as in the export
        text = '\n'.join(t.text for t in note.texts)
        assert record['composition'] in text and f'f_pred {record["f_pred"]:.4f}' in text
    images = received['/metavlm/followup/image']
    assert [m.data for _, m in images] == [(out / r['frame']).read_bytes() for r in framed]
    (source,) = received['/metavlm/source/image']
    # The search's stored source frame as it is on disk: what the export shows without a bag.
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert source[1].format == 'png' and source[1].data == (out / summary['source_frame']).read_bytes()


def test_a_port_in_use_is_one_line_exit_2_before_anything_is_written(tmp_path, tiny_clip_dir, capsys):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(64, 48)[..., ::-1])
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ['search', str(image), '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet']
        code = main(
            [*args, '--evaluations', '6', '--out', str(tmp_path / 'res'), '--foxglove-port', str(port)]
        )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: cannot serve Foxglove on 127.0.0.1:') and err.count('\n') == 1, err
    assert 'in use' in err
    assert not (tmp_path / 'res').exists()
