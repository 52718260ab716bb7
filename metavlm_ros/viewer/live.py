"""A search watched live in Foxglove: the export's channels served over Foxglove's WebSocket protocol."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import foxglove
import numpy as np

from metavlm_ros.common.codec import encode_compressed
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.results import ResultsStore, record_key
from metavlm_ros.viewer import DEFAULT_HOST
from metavlm_ros.viewer.channels import ViolationChannels, image_size
from metavlm_ros.viewer.export import is_violation, time_of

__all__ = ['DEFAULT_HOST', 'LiveResults', 'LiveServer']

# A viewer subscribes panel by panel: once one subscription came, the wait for a viewer lets this
# long pass without another before it counts the viewer as ready.
SETTLE_S = 0.25


def _free(host: str, port: int) -> bool:
    """Whether nothing listens on (host, port): a socket of our own binds there."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no listener
            probe.bind((host, port))
    except OSError:
        return False
    return True


class _Viewers:
    """The server's listener (foxglove.websocket.ServerListener): which client has which channels."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.subscriptions: dict[int, set[int]] = {}  # client id -> channel ids
        self.last_change = 0.0  # time.monotonic() of the last subscription

    def on_subscribe(self, client: Any, channel: Any) -> None:
        with self.changed:
            self.subscriptions.setdefault(client.id, set()).add(channel.id)
            self.last_change = time.monotonic()
            self.changed.notify_all()

    def on_unsubscribe(self, client: Any, channel: Any) -> None:
        # Also called for each of its channels when a client disconnects.
        with self.changed:
            channels = self.subscriptions.get(client.id, set())
            channels.discard(channel.id)
            if not channels:
                self.subscriptions.pop(client.id, None)
            self.changed.notify_all()


#: How long a closing server keeps serving a subscribed viewer the last messages (see LiveServer.close).
LINGER_S = 1.0


class LiveServer:
    """A Foxglove WebSocket server (subprotocol `foxglove.sdk.v1`) with the export's channels."""

    def __init__(self, port: int, host: str = DEFAULT_HOST, prefix: str = '/metavlm') -> None:
        """Bind and start serving.

        Args:
            port: TCP port; 0 picks a free one (see `port`).
            host: Address to bind.
            prefix: Topic prefix of the channels.

        Raises:
            ParameterError: The port is out of range, in use, or the address cannot be bound.
        """
        if not 0 <= port <= 65535:
            raise ParameterError(f'--foxglove-port must be 0..65535, got {port}')
        # A context of our own: only these channels are served, not those of an export in this process.
        self.context = foxglove.Context()
        self._viewers = _Viewers()
        try:
            self.server = foxglove.start_server(
                name='metavlm', host=host, port=port, context=self.context, server_listener=self._viewers
            )
        except RuntimeError as exc:
            reason = str(exc).removeprefix('FoxgloveError: ')
            raise ParameterError(f'cannot serve Foxglove on {host}:{port} ({reason})') from None
        self.host = host
        self.channels = ViolationChannels(self.context, prefix)

    @property
    def port(self) -> int:
        """The port served (the one picked when 0 was asked)."""
        return int(self.server.port)

    @property
    def url(self) -> str:
        """What to open in Foxglove (Open connection -> Foxglove WebSocket)."""
        host = f'[{self.host}]' if ':' in self.host else self.host  # an IPv6 address
        return f'ws://{host}:{self.port}'

    @property
    def viewers(self) -> int:
        """How many clients are subscribed to at least one channel now."""
        with self._viewers.changed:
            return len(self._viewers.subscriptions)

    def wait_for_viewer(self, timeout_s: float) -> bool:
        """Wait until a client has subscribed (and made its other subscriptions); False after `timeout_s`.

        A viewer subscribes to the channels its panels show, in one message or a few: once one
        subscription came, the wait goes on until none came for SETTLE_S, so that what the search
        publishes next reaches every panel.
        """
        deadline = time.monotonic() + timeout_s
        viewers = self._viewers
        with viewers.changed:
            while True:
                now = time.monotonic()
                if viewers.subscriptions and now - viewers.last_change >= SETTLE_S:
                    return True
                if now >= deadline:
                    return bool(viewers.subscriptions)
                wake = deadline if not viewers.subscriptions else viewers.last_change + SETTLE_S
                viewers.changed.wait(max(0.0, min(wake, deadline) - now))

    def close(self, wait_s: float = 2.0, linger_s: float = LINGER_S) -> None:
        """Stop serving (clients see the channels go), and wait up to `wait_s` for the port to be free.

        The SDK sends to each client in the background and has no flush: while a viewer is
        subscribed, the server stays up to `linger_s` (less once no viewer is left) so that what was
        published last, a search's summary, reaches it; stopped at once, a loaded machine lost it. The
        SDK stops its listener in the background too: a node's `configure` right after `cleanup`
        must find the port free again.
        """
        port = self.port
        deadline = time.monotonic() + linger_s
        with self._viewers.changed:
            while self._viewers.subscriptions and time.monotonic() < deadline:
                self._viewers.changed.wait(max(0.0, deadline - time.monotonic()))
        self.channels.close()
        self.server.stop()
        deadline = time.monotonic() + wait_s
        while not _free(self.host, port) and time.monotonic() < deadline:
            time.sleep(0.01)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiveResults:
    """A ResultsStore that also publishes what it writes, after writing it (evidence first).

    Which records are violations is the export's choice for the same directory: by default every
    evaluation that violates by any criterion, published as its record while the search runs, with
    its follow-up and overlay when the non-dominated set is written (the PNGs exist only then). With
    `published`, the caller's own violations (the tester node's, at its report threshold, as
    violations.jsonl holds them), each with its follow-up as it is appended. The source frame goes
    out with a search's first record, the summary last. Every other attribute is the store's own.
    """

    def __init__(self, store: ResultsStore, server: LiveServer, *, published: bool = False) -> None:
        """Wrap `store`, publishing on `server`'s channels.

        Args:
            store: The results store written first.
            server: The live server whose channels publish.
            published: Violations are those given to `append_violation` (the tester node's), not
                every evaluation that violates.
        """
        self._store = store
        self._channels = server.channels
        self._published = published
        self._searches: list[tuple] = []  # in the order written: the time of records without a stamp
        self._known: set[tuple] = set()
        self._violations: dict[tuple, int] = {}
        self._source: np.ndarray | None = None
        self._source_size: tuple[int, int] | None = None  # of the search's frame: where records' boxes are
        self._source_file: Path | None = None
        self._waiting: list[tuple[dict, int]] = []  # violations written, not flushed yet

    def next_source(self, rgb: np.ndarray, source_size: tuple[int, int] | None = None) -> None:
        """The frame of the next search: published with its first record (its time is known then).

        Encoded only when the search stores no source frame of its own (see save_source).

        Args:
            rgb: The frame.
            source_size: (width, height) of the camera frame the records' boxes are in, when `rgb` is
                smaller (the working size); default `rgb`'s own.
        """
        self._source = rgb
        self._source_size = source_size or (rgb.shape[1], rgb.shape[0])

    def _box_scale(self, record: dict, size: tuple[int, int] | None) -> tuple[float, float] | None:
        """A follow-up's pixels per source-frame pixel, for a detection record's boxes."""
        if record.get('kind') != 'detection' or size is None or self._source_size is None:
            return None
        return size[0] / self._source_size[0], size[1] / self._source_size[1]

    def save_source(self, rgb: np.ndarray) -> tuple[str, str] | None:
        """Store the search's source frame; the stored PNG is what goes out (no second encoding)."""
        stored = self._store.save_source(rgb)
        if stored is not None:
            self._source_file = Path(self._store.directory) / stored[0]
            self._source = None
        return stored

    def _time(self, record: dict) -> int:
        key = record_key(record)[:-1]
        if key not in self._known:  # a set: a tester's searches add up over a day
            self._known.add(key)
            self._searches.append(key)
        return time_of(record, self._searches)

    def _count(self, record: dict) -> None:
        key = record_key(record)[:-1]
        self._violations[key] = self._violations.get(key, 0) + 1

    def append_evaluation(self, record: dict) -> None:
        """Write an evaluation record; publish it when it is a violation (unless `published`)."""
        self._store.append_evaluation(record)
        stamp = self._time(record)
        if self._channels.wants_sources():  # a PNG costs milliseconds: only for a viewer
            if self._source_file is not None:
                # The stored source (lossless, at the working size): what the export shows too.
                self._channels.log_source(stamp, self._source_file.read_bytes())
            elif self._source is not None:
                self._channels.log_source(stamp, encode_png(self._source))
        self._source, self._source_file = None, None
        if not self._published and is_violation(record):
            self._count(record)
            self._waiting.append((record, stamp))  # published once on disk: at the next flush

    def flush(self) -> None:
        """Write the records that wait (a search calls this after each generation), then publish the
        violations among them: nothing is published before it is on disk."""
        self._store.flush()
        waiting, self._waiting = self._waiting, []
        for record, stamp in waiting:
            self._channels.log_violation(record, stamp)

    def append_violation(self, record: dict, followup: np.ndarray | None = None) -> None:
        """Write a published violation (violations.jsonl); publish it with its follow-up and overlay."""
        self.append_violations([record], [followup])

    def append_violations(self, records: list[dict], followups: list[np.ndarray | None]) -> None:
        """Write published violations (violations.jsonl, one member); then publish each with its
        follow-up and overlay.

        The follow-up is the record's kept PNG (`frame`), else its `followups` entry (RGB) as JPEG,
        encoded only while a viewer watches it: a PNG would cost the search several times more for
        every violation, a JPEG at quality JPEG_QUALITY looks the same in a viewer, and the export
        renders the lossless PNG from the stored source frame.
        """
        self._store.append_violations(records)
        for record, followup in zip(records, followups, strict=True):
            stamp = self._time(record)
            self._count(record)
            image, image_format, size = None, 'png', None
            if self._channels.wants_followups():
                path = Path(self._store.directory) / record['frame'] if record.get('frame') else None
                if path is not None and path.is_file():
                    image = path.read_bytes()
                    size = image_size(image)
                elif followup is not None:
                    image_format, image = 'jpeg', _encode_jpeg(followup)
                    size = (followup.shape[1], followup.shape[0])
            self._channels.log_violation(record, stamp, image, image_format, self._box_scale(record, size))

    def append_pareto(self, record: dict) -> None:
        """Write a non-dominated record; publish its follow-up and overlay when it violates.

        With `published`, its violations went out with their follow-ups already.
        """
        self._store.append_pareto(record)
        frame = record.get('frame')
        if self._published or not (frame and is_violation(record) and self._channels.wants_followups()):
            return
        path = Path(self._store.directory) / frame
        if path.is_file():
            image = path.read_bytes()
            scale = self._box_scale(record, image_size(image))
            self._channels.log_followup(record, self._time(record), image, box_scale=scale)

    def append_summary(self, record: dict) -> None:
        """Write a search's summary; publish it with its violation count."""
        self.flush()
        self._store.append_summary(record)
        count = self._violations.pop(record_key(record)[:-1], 0)
        self._channels.log_summary(record, count, self._time(record))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def __enter__(self) -> LiveResults:
        self._store.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._store.__exit__(*exc)


def _encode_jpeg(rgb: np.ndarray) -> bytes:
    """An RGB frame as JPEG bytes (the codec's JPEG_QUALITY), for a viewer."""
    return encode_compressed(rgb, 'jpeg')[1]
