"""Real servers for the served backend's tests: `transformers serve` on a tiny model, and a scripted one."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ['ScriptedServer', 'chat_body', 'free_port', 'logprobs_of', 'transformers_serve']

#: The `transformers` command of the environment the tests run in (the serving extra installed).
TRANSFORMERS = Path(sys.executable).parent / 'transformers'


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def transformers_serve(model_dir: Path, log: Path, *, start_s: float = 120.0) -> Iterator[tuple[str, str]]:
    """`transformers serve` of a local model directory on 127.0.0.1 and a port of its own.

    transformers serve names a local model by the path it was given: that path is the model id in
    requests and in /v1/models.

    Yields:
        (endpoint, model id): e.g. ('http://127.0.0.1:PORT/v1', '/tmp/.../llava').
    """
    port = free_port()
    env = {**os.environ, 'HF_HUB_OFFLINE': '1'}  # the model is on disk; nothing may be fetched
    command = [str(TRANSFORMERS), 'serve', str(model_dir), '--host', '127.0.0.1', '--port', str(port)]
    command += ['--device', 'cpu', '--log-level', 'warning']
    with open(log, 'wb') as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    endpoint = f'http://127.0.0.1:{port}/v1'
    try:
        deadline = time.monotonic() + start_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f'transformers serve ended with {process.returncode}: {log.read_text()[-2000:]}'
                )
            try:
                with urllib.request.urlopen(endpoint + '/models', timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f'transformers serve did not answer in {start_s:g} s: {log.read_text()[-2000:]}'
                )
            time.sleep(0.2)
        yield endpoint, str(model_dir)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # its own session: the server and nothing else
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def chat_body(
    content: str, *, model: str = 'recorded', logprobs: Any = None, fingerprint: str = 'fp_test'
) -> dict:
    """A non-streaming Chat Completions response as the published schema has it."""
    choice: dict[str, Any] = {
        'index': 0,
        'message': {'role': 'assistant', 'content': content},
        'finish_reason': 'stop',
        'logprobs': logprobs,
    }
    return {
        'id': 'chatcmpl-test',
        'object': 'chat.completion',
        'created': 1_700_000_000,
        'model': model,
        'system_fingerprint': fingerprint,
        'choices': [choice],
        'usage': {'prompt_tokens': 10, 'completion_tokens': 1, 'total_tokens': 11},
    }


# (status, JSON body or raw bytes, seconds to wait before answering)
Reply = tuple[int, Any, float]


def logprobs_of(pairs: list[tuple[str, float]]) -> dict:
    """choices[0].logprobs of a one-token answer: the chosen token first, then its top_logprobs."""
    top = [{'token': t, 'logprob': math.log(p), 'bytes': list(t.encode())} for t, p in pairs]
    return {'content': [{**top[0], 'top_logprobs': top}], 'refusal': None}


class ScriptedServer:
    """A real HTTP server on 127.0.0.1 whose chat answers come from a function of the request.

    GET /v1/models lists `models`; POST /v1/chat/completions answers `chat(request body)`. Every
    request body and Authorization header is kept (`requests`, `authorizations`). `stop()` closes the
    socket: a client then meets a refused connection, as when a server is killed.
    """

    def __init__(
        self,
        chat: Callable[[dict], Reply],
        *,
        models: tuple[str, ...] = ('recorded',),
        key: str | None = None,
    ) -> None:
        self.chat = chat
        self.models = models
        self.key = key
        self.requests: list[dict] = []
        self.authorizations: list[str] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: pytest shows failures, not traffic
                pass

            def _send(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):  # a client that timed out has gone
                    self.wfile.write(data)

            def _refused(self) -> bool:
                if owner.key is None or self.headers.get('Authorization') == f'Bearer {owner.key}':
                    return False
                self._send(
                    401, {'error': {'message': 'Incorrect API key provided', 'code': 'invalid_api_key'}}
                )
                return True

            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                if self._refused():
                    return
                if self.path.rstrip('/') == '/v1/models':
                    entries = [
                        {'id': m, 'object': 'model', 'created': 0, 'owned_by': 'test'} for m in owner.models
                    ]
                    self._send(200, {'object': 'list', 'data': entries})
                else:
                    self._send(404, {'error': {'message': f'no route {self.path}'}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get('Content-Length', 0))) or b'{}')
                with owner.lock:
                    owner.requests.append(body)
                    owner.authorizations.append(self.headers.get('Authorization', ''))
                if self._refused():
                    return
                status, reply, delay = owner.chat(body)
                if delay:
                    time.sleep(delay)
                if status == 0:  # hang up without an answer, as a dying server does
                    self.close_connection = True
                    return
                self._send(status, reply)

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f'http://127.0.0.1:{self.port}/v1'
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket (connections are then refused)."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(OSError):
            self.stop()
