"""A search watched live in Foxglove: the export's channels served over Foxglove's WebSocket protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import foxglove
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.results import ResultsStore, record_key
from metavlm_ros.viewer.channels import ViolationChannels
from metavlm_ros.viewer.export import is_violation, time_of

__all__ = ['DEFAULT_HOST', 'LiveResults', 'LiveServer']

#: Loopback unless the user names another address: evidence is not served to the network by default.
DEFAULT_HOST = '127.0.0.1'


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
        try:
            self.server = foxglove.start_server(name='metavlm', host=host, port=port, context=self.context)
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
        return f'ws://{self.host}:{self.port}'

    def close(self) -> None:
        """Stop serving (clients see the channels go)."""
        self.channels.close()
        self.server.stop()

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiveResults:
    """A ResultsStore that also publishes what it writes, after writing it (evidence first).

    Violations go out as their records while the search runs; follow-up frames with their overlays
    when the non-dominated set is written (the PNGs exist only then); the summary last. Every other
    attribute is the store's own.
    """

    def __init__(self, store: ResultsStore, server: LiveServer) -> None:
        """Wrap `store`, publishing on `server`'s channels."""
        self._store = store
        self._channels = server.channels
        self._searches: list[tuple] = []
        self._violations: dict[tuple, int] = {}
        self._source: np.ndarray | None = None
        self._source_file: Path | None = None

    def next_source(self, rgb: np.ndarray) -> None:
        """The frame of the next search: published with its first record (its time is known then).

        Encoded only when the search stores no source frame of its own (see save_source).
        """
        self._source = rgb

    def save_source(self, rgb: np.ndarray) -> tuple[str, str] | None:
        """Store the search's source frame; the stored PNG is what goes out (no second encoding)."""
        stored = self._store.save_source(rgb)
        if stored is not None:
            self._source_file = Path(self._store.directory) / stored[0]
            self._source = None
        return stored

    def _time(self, record: dict) -> int:
        key = record_key(record)[:-1]
        if key not in self._searches:
            self._searches.append(key)
        return time_of(record, self._searches)

    def append_evaluation(self, record: dict) -> None:
        """Write an evaluation record; publish it when it is a violation."""
        self._store.append_evaluation(record)
        stamp = self._time(record)
        if self._channels.wants_sources():  # a PNG costs milliseconds: only for a viewer
            if self._source_file is not None:
                # The stored source (lossless, at the working size): what the export shows too.
                self._channels.log_source(stamp, self._source_file.read_bytes())
            elif self._source is not None:
                self._channels.log_source(stamp, encode_png(self._source))
        self._source, self._source_file = None, None
        if is_violation(record):
            key = record_key(record)[:-1]
            self._violations[key] = self._violations.get(key, 0) + 1
            self._channels.log_violation(record, stamp)

    def append_pareto(self, record: dict) -> None:
        """Write a non-dominated record; publish its follow-up and overlay when it violates."""
        self._store.append_pareto(record)
        frame = record.get('frame')
        if frame and is_violation(record) and self._channels.wants_followups():
            path = Path(self._store.directory) / frame
            if path.is_file():
                self._channels.log_followup(record, self._time(record), path.read_bytes())

    def append_summary(self, record: dict) -> None:
        """Write a search's summary; publish it with its violation count."""
        self._store.append_summary(record)
        count = self._violations.get(record_key(record)[:-1], 0)
        self._channels.log_summary(record, count, self._time(record))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def __enter__(self) -> LiveResults:
        self._store.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._store.__exit__(*exc)
