"""A Foxglove WebSocket client, as the app is one: connect, subscribe to every channel, decode."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from collections.abc import Callable

import websockets
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ['SUBPROTOCOL', 'free_port', 'protobuf_class', 'watch']

SUBPROTOCOL = 'foxglove.sdk.v1'  # what foxglove-sdk 0.30 serves (it refuses foxglove.websocket.v1)

Received = dict[str, list]  # topic -> [(log_time ns, decoded message)]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def protobuf_class(channel: dict):
    """The message class of a protobuf channel, from the schema the server advertised."""
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(channel['schema']))
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(channel['schemaName']))


async def watch(
    port: int,
    done: Callable[[Received], bool],
    *,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
) -> Received:
    """Connect as Foxglove does (retrying while the server starts), subscribe to every channel it
    advertises, and collect decoded messages until `done(received)`.

    Raises:
        AssertionError: `timeout_s` passed first (naming what arrived), or `alive()` turned false
            before the server answered.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ws = await websockets.connect(f'ws://127.0.0.1:{port}', subprotocols=[SUBPROTOCOL])
            break
        except OSError:
            assert alive(), 'the server process ended before it served'
            assert time.monotonic() < deadline, f'no Foxglove server on port {port} within {timeout_s:g} s'
            await asyncio.sleep(0.05)
    received: Received = {}
    channels: dict[int, dict] = {}
    subscriptions: dict[int, dict] = {}
    async with ws:
        assert ws.subprotocol == SUBPROTOCOL
        while not done(received):
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(ws.recv(), max(left, 0.001))
            except TimeoutError:
                counts = {topic: len(messages) for topic, messages in received.items()}
                raise AssertionError(f'timed out after {timeout_s:g} s; received {counts}') from None
            if isinstance(message, str):
                parsed = json.loads(message)
                if parsed['op'] == 'advertise':
                    fresh = [c for c in parsed['channels'] if c['id'] not in channels]
                    subscribe = []
                    for channel in fresh:
                        channels[channel['id']] = channel
                        subscriptions[len(subscriptions) + 1] = channel
                        subscribe.append({'id': len(subscriptions), 'channelId': channel['id']})
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
    return received
