"""The OpenAI-compatible Chat Completions API as the served backend speaks it: its endpoint, what every
request sends, how answers (top log-probabilities) and errors read, and answers kept by request."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.generative import ANSWER_WORDS

__all__ = [
    'AnswerCache',
    'LOGPROB_SERVERS',
    'REQUEST_SEED',
    'TOP_LOGPROBS',
    'base_url',
    'endpoint_parts',
    'status_message',
    'yes_probability',
]

#: The seed sent with every request: servers that take one (vLLM, llama.cpp, Ollama) then answer the
#: same request the same way even where sampling is not greedy.
REQUEST_SEED = 0
#: Top log-probabilities asked for the first answer token (20 is the OpenAI API's and vLLM's limit).
TOP_LOGPROBS = 20
#: The servers known to return `logprobs` / `top_logprobs` from /v1/chat/completions.
LOGPROB_SERVERS = "vLLM, SGLang, llama.cpp's llama-server and Ollama >= 0.12.11"


def endpoint_parts(endpoint: str) -> dict[str, Any]:
    """An endpoint URL, checked, as the parts results record: scheme, host, port, path.

    Raises:
        ParameterError: not http(s), no host, a bad port, credentials, a query or a fragment in it.
    """
    try:
        parts = urlsplit(endpoint.strip())
        port = parts.port
    except ValueError as exc:
        raise ParameterError(f'endpoint: not a URL ({exc})') from None
    if parts.scheme not in ('http', 'https'):
        raise ParameterError(f'endpoint: expected an http:// or https:// URL, got scheme {parts.scheme!r}')
    if parts.username is not None or parts.password is not None:
        # Deliberately not echoed: the URL holds a secret.
        raise ParameterError('endpoint: credentials in the URL are refused; name the key with api_key_env')
    if not parts.hostname:
        raise ParameterError(f'endpoint: no host in {endpoint!r}')
    if parts.query or parts.fragment:
        raise ParameterError(f'endpoint: no query or fragment expected in {endpoint!r}')
    return {
        'scheme': parts.scheme,
        'host': parts.hostname,
        'port': port or (443 if parts.scheme == 'https' else 80),
        'path': parts.path.rstrip('/') or '/',
    }


def base_url(parts: Mapping[str, Any]) -> str:
    """The endpoint's URL from its recorded parts (an IPv6 host in brackets)."""
    host = f'[{parts["host"]}]' if ':' in parts['host'] else parts['host']
    return f'{parts["scheme"]}://{host}:{parts["port"]}{parts["path"].rstrip("/")}'


def yes_probability(logprobs: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) from a Chat Completions `choices[0].logprobs` object.

    The first answer token's `top_logprobs` (and the token chosen) are summed per answer word over
    its spellings (ANSWER_WORDS: case and a leading space; SentencePiece's '▁' and byte-level BPE's
    'Ġ' read as a space), as the in-process backend sums its single-token spellings. A word outside
    the top list counts 0 (its probability is below the list's smallest).

    Returns:
        The probability, or None when neither word is among the first token's top log-probabilities.

    Raises:
        ValueError: `logprobs` does not hold a first token with top_logprobs (the schema).
    """
    content = logprobs.get('content') if isinstance(logprobs, Mapping) else None
    if not content or not isinstance(content, list) or not isinstance(content[0], Mapping):
        raise ValueError('no logprobs.content for the first answer token')
    first = content[0]
    candidates = list(first.get('top_logprobs') or [])
    if not candidates:
        raise ValueError('no top_logprobs for the first answer token')
    seen: dict[str, float] = {}
    for entry in [first, *candidates]:
        token, value = entry.get('token'), entry.get('logprob')
        if not isinstance(token, str) or not isinstance(value, (int, float)):
            raise ValueError(f'a top_logprobs entry without token and logprob: {entry!r}')
        seen.setdefault(token, float(value))  # the chosen token is listed again among the top ones
    mass = {}
    for word, spellings in ANSWER_WORDS.items():
        mass[word] = sum(
            math.exp(value)
            for token, value in seen.items()
            if token.replace('▁', ' ').replace('Ġ', ' ') in spellings
        )
    total = mass['yes'] + mass['no']
    return mass['yes'] / total if total > 0 else None


def status_message(exc: Any) -> str:
    """The first line of an API error's message (its JSON body's, else its own), at most 200 characters."""
    body = getattr(exc, 'body', None)
    if isinstance(body, Mapping):
        inner = body.get('error', body)
        message = inner.get('message') if isinstance(inner, Mapping) else inner
        if message:
            return str(message).splitlines()[0][:200]
    return str(getattr(exc, 'message', exc)).splitlines()[0][:200]


class AnswerCache:
    """A bounded LRU of answers by (endpoint, model, sha256 of the request body), thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: tuple, value: Any) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
