"""A VLM served over the OpenAI-compatible Chat Completions API (vLLM, llama.cpp, Ollama, transformers)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from metavlm_ros.common.codec import encode_png
from metavlm_ros.common.errors import ModelError, ParameterError, SearchInterrupted
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.backends.chat import GenerativeQuestions
from metavlm_ros.models.chat_completions import (
    LOGPROB_SERVERS,
    REQUEST_SEED,
    TOP_LOGPROBS,
    AnswerCache,
    base_url,
    endpoint_parts,
    status_message,
    yes_probability,
)
from metavlm_ros.models.grounding import family_of_model_id
from metavlm_ros.models.options import Backend, Option
from metavlm_ros.models.questions import QUESTION_OPTIONS, answer_tokens
from metavlm_ros.models.registry import register

__all__ = [
    'SERVED_OPTIONS',
    'CallStats',
    'ServedBackend',
    'ServedStats',
    'ServerLost',
    'endpoint_parts',
    'yes_probability',
]

# First backoff after a failed attempt, doubled per retry up to the cap (seconds).
_BACKOFF_S = 0.2
_BACKOFF_CAP_S = 5.0
_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
# A gray square for the start-up probe request: any server that takes images takes it.
_PROBE_FRAME = np.full((32, 32, 3), 128, np.uint8)


class ServerLost(SearchInterrupted):
    """The server stopped answering mid-search (after the retries) or answered outside the API.

    A SearchInterrupted: `run_search` ends the search keeping what finished; raised outside a
    search (the source frame's request), it is a one-line error like any MetaVLMError.
    """


def _endpoint_reason(value: Any) -> str | None:
    try:
        endpoint_parts(str(value))
    except ParameterError as exc:
        return str(exc).removeprefix('endpoint: ')
    return None


def _env_name_reason(value: Any) -> str | None:
    if _ENV_NAME.fullmatch(str(value)):
        return None
    # Never echo the value: a user who passes the key itself here must not see it in a log.
    return 'expected the NAME of an environment variable holding the key (letters, digits, _), not the key'


#: The served backend's own options (with QUESTION_OPTIONS, what the in-process `vlm` backend asks).
SERVED_OPTIONS: tuple[Option, ...] = (
    Option('endpoint', str, None, "served models: the server's OpenAI-compatible base URL, e.g. "
           'http://127.0.0.1:8000/v1 (no credentials in it)', check=_endpoint_reason),
    Option('api_key_env', str, None, 'served models: the NAME of the environment variable that holds the API '
           'key (the key itself is never given, stored or logged)', check=_env_name_reason, identity=False),
    Option('timeout_s', float, 60.0, 'served models: seconds one request may take', low=0.05, high=3600.0,
           identity=False),
    Option('retries', int, 3, 'served models: retries of a request after HTTP 429/5xx, a timeout or a lost '
           'connection, with exponential backoff', low=0, high=20, identity=False),
    Option('max_in_flight', int, 4, 'served models: most requests in flight at once (one generation is one '
           'concurrent batch)', low=1, high=256, identity=False),
    Option('input_side', int, 0, "served models: the side in pixels of the square the served model sees (its "
           "processor's size, e.g. 384 for SmolVLM); sets --working-size auto; 0: not known here", low=0,
           high=8192),
    Option('cache_size', int, 4096, 'served models: answers kept by request (LRU); 0 turns the cache off',
           low=0, high=1_000_000, identity=False),
)  # fmt: skip


@dataclass
class CallStats:
    """One predict call: per frame, the seconds its answer took (the slowest of its requests; 0 for a
    cached one) and the retries its requests needed."""

    latency_s: list[float] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)
    cache_hits: int = 0


@dataclass
class ServedStats:
    """Counters of everything sent since the backend was made."""

    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    failures: int = 0
    request_s: float = 0.0  # summed round trips (HTTP, server), successful attempts
    encode_s: float = 0.0  # summed PNG encoding and request-body building (the client's own cost)
    last: CallStats = field(default_factory=CallStats)


@register
class ServedBackend(Backend):
    """Any chat VLM behind an OpenAI-compatible /v1/chat/completions endpoint, asked as `vlm` asks.

    kind 'count': the question as a user message with the frame (a PNG data URL), temperature 0 and a
    seed, the answer parsed by GenerativeQuestions (text or JSON; a failure to parse is recorded).
    kind 'confidence': per class, one request for one token with `top_logprobs`, P(yes) / (P(yes) +
    P(no)) of the first answer token (`yes_probability`). kind 'detection': a grounding question (or
    one per class) asked as a count is, the answers read in the box format (models/grounding.py; by
    default the family the model id names). A generation's requests go out together, at most
    `max_in_flight` at a time.
    """

    name = 'openai'
    kinds = ('count', 'confidence', 'detection')
    options = (*SERVED_OPTIONS, *QUESTION_OPTIONS)
    local_model = False

    @classmethod
    def kind_for(cls, options: Mapping[str, Any]) -> str:
        return str(options['kind'])

    @classmethod
    def describe(cls, model_dir: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
        """The endpoint's parts (never a key) and how requests are made; the model id is `model`."""
        if not options.get('endpoint'):
            raise ParameterError(
                'endpoint is required for backend openai (e.g. --endpoint http://127.0.0.1:8000/v1)'
            )
        return {
            'endpoint': endpoint_parts(options['endpoint']),
            'requests': {'temperature': 0, 'seed': REQUEST_SEED, 'image': 'png-data-url'},
        }

    def __init__(
        self,
        model: str,
        *,
        classes: Sequence[str],
        device: str,
        dtype: str,
        batch_size: int,
        endpoint: str | None,
        api_key_env: str | None,
        timeout_s: float,
        retries: int,
        max_in_flight: int,
        input_side: int,
        cache_size: int,
        max_new_tokens: int,
        **questions: Any,
    ) -> None:
        # device, dtype and batch_size are the server's business; max_in_flight bounds what is sent.
        # `questions`: kind, prompt, answer_format, confidence_question, vocabularies, box_format.
        self.asked = GenerativeQuestions(classes=classes, family=family_of_model_id(model), **questions)
        kind = self.asked.kind
        self.parts = self.describe(None, {'endpoint': endpoint})['endpoint']
        self.endpoint = base_url(self.parts)
        self.model_id = str(model)
        self.classes = tuple(classes)
        self.chosen_kind = kind
        self.max_new_tokens = answer_tokens(kind, max_new_tokens)
        # The server's processor is out of reach; what the user states sets the working size (auto).
        self.input_size = input_side
        self.retries = retries
        self.timeout_s = timeout_s
        self.api_key_env = api_key_env
        key = 'none'  # servers without keys ignore it; the client insists on one
        if api_key_env is not None:
            key = os.environ.get(api_key_env, '')
            if not key:
                raise ParameterError(
                    f'api_key_env: the environment variable {api_key_env} is not set or empty'
                )
        try:
            import openai
        except ImportError:
            raise ModelError('the openai backend needs the openai package: pip install openai') from None

        self._openai = openai
        # Retries are ours (counted, with our backoff); the client's own would be invisible.
        self.client = openai.OpenAI(base_url=self.endpoint, api_key=key, timeout=timeout_s, max_retries=0)
        self.stats = ServedStats()
        self._stats_lock = threading.Lock()
        self._cache = AnswerCache(cache_size)
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix='metavlm-served')
        self.served_ids: list[str] = []
        self.model_entry: dict[str, Any] = {}
        self.fingerprints: set[str] = set()
        #: Why the last predict call failed ('' when it did not).
        self.failure = ''
        try:
            self._probe()
        except ServerLost as exc:
            raise ModelError(str(exc)) from None
        except BaseException:
            self.close()
            raise

    # -- requests ------------------------------------------------------------------------------------
    def _where(self) -> str:
        return f'{self.endpoint} (model {self.model_id})'

    def _call(self, send: Any) -> tuple[dict, int]:
        """One request with bounded retries; the response body as JSON and the retries it took.

        Raises:
            ServerLost: the server is gone after the retries, or refused the request (one line naming why).
        """
        openai = self._openai
        retried = 0
        while True:
            try:
                raw = send()
                body = raw.http_response.json()
                return body, retried
            except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                    openai.InternalServerError) as exc:  # fmt: skip
                if retried >= self.retries:
                    with self._stats_lock:
                        self.stats.failures += 1
                    raise ServerLost(self._failure(exc, retried)) from None
                time.sleep(min(_BACKOFF_S * 2**retried, _BACKOFF_CAP_S))
                retried += 1
                with self._stats_lock:
                    self.stats.retries += 1
            except openai.APIStatusError as exc:
                with self._stats_lock:
                    self.stats.failures += 1
                raise ServerLost(self._failure(exc, retried)) from None
            except ValueError as exc:  # the body is not JSON
                raise ServerLost(
                    f'{self._where()}: the response is not JSON ({exc}); not an OpenAI-compatible server'
                ) from None

    def _failure(self, exc: Exception, retried: int) -> str:
        """The one line that says why a request failed."""
        openai = self._openai
        after = f' (after {retried} retries)' if retried else ''
        if isinstance(exc, openai.APITimeoutError):
            return f'{self._where()}: no answer within timeout_s={self.timeout_s:g} s{after}'
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            while cause is not None and not isinstance(cause, ConnectionRefusedError) and cause.__cause__:
                cause = cause.__cause__
            if isinstance(cause, ConnectionRefusedError) or 'refused' in repr(exc.__cause__).lower():
                return (
                    f'{self.endpoint}: nothing is listening (connection refused){after}: start the server or '
                    'fix --endpoint'
                )
            return f'{self.endpoint}: connection failed{after}: {exc.__cause__ or exc}'
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                if self.api_key_env:
                    return (
                        f'{self.endpoint}: HTTP {status}, the server refused the key in ${self.api_key_env}'
                    )
                return (
                    f'{self.endpoint}: HTTP {status}, the server wants a key (name its variable: api_key_env)'
                )
            if status == 404:
                served = ', '.join(self.served_ids) or 'none listed'
                return f'{self._where()}: HTTP 404, unknown model or path; the server serves: {served}'
            message = status_message(exc)
            return f'{self._where()}: HTTP {status}{after}: {message}'
        return f'{self._where()}: {exc}'

    def _request_body(self, frame: np.ndarray, question: str, *, confidence: bool) -> dict[str, Any]:
        url = 'data:image/png;base64,' + base64.b64encode(encode_png(frame)).decode('ascii')
        body: dict[str, Any] = {
            'model': self.model_id,
            'messages': [
                {
                    'role': 'user',
                    'content': [
                        {'type': 'image_url', 'image_url': {'url': url}},
                        {'type': 'text', 'text': question},
                    ],
                }
            ],
            'temperature': 0,
            'seed': REQUEST_SEED,
            'max_tokens': 1 if confidence else self.max_new_tokens,
        }
        if confidence:
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        return body

    def _encode_and_ask(
        self, frame: np.ndarray, question: str, confidence: bool
    ) -> tuple[Any, float, int, bool]:
        started = time.perf_counter()
        body = self._request_body(frame, question, confidence=confidence)
        with self._stats_lock:
            self.stats.encode_s += time.perf_counter() - started
        return self._ask(body, confidence)

    def _ask(self, body: dict[str, Any], confidence: bool) -> tuple[Any, float, int, bool]:
        """One answer: (text or P(yes) or a reason string in a tuple, seconds, retries, cached)."""
        data = json.dumps(body, sort_keys=True, separators=(',', ':')).encode()
        key = (self.endpoint, self.model_id, hashlib.sha256(data).hexdigest())
        cached = self._cache.get(key)
        if cached is not None:
            with self._stats_lock:
                self.stats.cache_hits += 1
            return cached, 0.0, 0, True
        extra = {k: v for k, v in body.items() if k not in ('model', 'messages')}
        started = time.perf_counter()
        response, retried = self._call(
            lambda: self.client.chat.completions.with_raw_response.create(
                model=body['model'], messages=body['messages'], **extra
            )
        )
        seconds = time.perf_counter() - started
        answer = self._read(response, confidence)
        with self._stats_lock:
            self.stats.requests += 1
            self.stats.request_s += seconds
        self._cache.put(key, answer)
        return answer, seconds, retried, False

    def _read(self, body: Any, confidence: bool) -> Any:
        """The answer in a Chat Completions body: the text, or P(yes) (a tuple with the reason when the
        first token is neither yes nor no).

        Raises:
            ServerLost: the body does not follow the Chat Completions schema.
        """
        try:
            choice = body['choices'][0]
            message = choice['message']
            text = message.get('content') or ''
            if not isinstance(text, str):
                raise TypeError('message.content is not a string')
            fingerprint = body.get('system_fingerprint')
            if isinstance(fingerprint, str) and fingerprint:
                self.fingerprints.add(fingerprint)
            if not confidence:
                return text
            logprobs = choice.get('logprobs')
            if logprobs is None:
                raise _NoLogprobs
            probability = yes_probability(logprobs)
        except _NoLogprobs:
            raise
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ServerLost(
                f'{self._where()}: not a Chat Completions body ({type(exc).__name__}: {exc}); '
                f'it began {json.dumps(body)[:120]}'
            ) from None
        if probability is None:
            return (
                f"neither yes nor no among the first answer token's top {TOP_LOGPROBS} (answer {text!r})",
            )
        return probability

    # -- start-up ------------------------------------------------------------------------------------
    def _probe(self) -> None:
        """GET /models (the model must be served), then one request as predict makes them."""
        body, _ = self._call(lambda: self.client.models.with_raw_response.list())
        try:
            entries = [e for e in body['data'] if isinstance(e, Mapping) and isinstance(e.get('id'), str)]
        except (KeyError, TypeError):
            raise ModelError(
                f'{self.endpoint}/models: not an OpenAI model list; is this an OpenAI-compatible server?'
            ) from None
        self.served_ids = [e['id'] for e in entries]
        matches = [e for e in entries if e['id'] == self.model_id]
        if not matches:
            raise ModelError(
                f'{self.endpoint} does not serve model {self.model_id!r}; it serves: '
                f'{", ".join(self.served_ids) or "none"} (--model takes one of these ids)'
            )
        self.model_entry = dict(matches[0])
        confidence = self.kind == 'confidence'
        question = self.asked.questions[0]
        try:
            self._ask(self._request_body(_PROBE_FRAME, question, confidence=confidence), confidence)
        except _NoLogprobs:
            raise ModelError(
                f'{self._where()} returns no logprobs, which kind confidence reads (top_logprobs of the '
                f'first answer token); servers that return them: {LOGPROB_SERVERS}. '
                'Use kind count with this server'
            ) from None

    # -- the interface -------------------------------------------------------------------------------
    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction]:
        """Judge frames: every request of the call goes out at once, `max_in_flight` at a time.

        Raises:
            ServerLost: the server stopped answering (after the retries) or broke the API; the search
                ends with what finished (SearchInterrupted).
        """
        frames = [check_frame(frame, what=f'frame {index}') for index, frame in enumerate(frames)]
        confidence = self.kind == 'confidence'
        questions = self.asked.questions
        # Each request is encoded in its own worker (OpenCV's PNG encoder releases the GIL), so one
        # frame's encoding overlaps the others' round trips instead of delaying the whole batch.
        futures = [
            self._pool.submit(self._encode_and_ask, f, q, confidence) for f in frames for q in questions
        ]
        try:
            results = [future.result() for future in futures]
        except _NoLogprobs:
            for future in futures:
                future.cancel()
            self.failure = f'{self._where()}: a response without logprobs mid-search'
            raise ServerLost(self.failure) from None
        except ServerLost as exc:
            for future in futures:
                future.cancel()
            # Kept for the caller that sees only a stopped search (commands/search.py, the tester node).
            self.failure = str(exc)
            raise
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        self.failure = ''
        per = len(questions)
        call = CallStats()
        predictions = []
        for index in range(len(frames)):
            rows = results[index * per : (index + 1) * per]
            call.latency_s.append(max(r[1] for r in rows))
            call.retries.append(sum(r[2] for r in rows))
            call.cache_hits += sum(r[3] for r in rows)
            answers = [r[0] for r in rows]
            if not confidence:
                prediction = self.asked.answer(answers, frames[index])
            else:
                failed = [
                    f'{cls}: {a[0]}'
                    for cls, a in zip(self.classes, answers, strict=True)
                    if isinstance(a, tuple)
                ]
                if failed:
                    prediction = Prediction('confidence', {}, '', error='; '.join(failed))
                else:
                    prediction = self.asked.confidence(answers)
            # Every evaluation records what its answer cost: the slowest request's seconds and the retries.
            evidence = {'latency_s': round(call.latency_s[-1], 6), 'retries': call.retries[-1]}
            predictions.append(replace(prediction, evidence=evidence))
        self.stats.last = call
        return predictions

    def identity(self) -> dict[str, Any]:
        """What the server reports about itself: its /models entry and the system_fingerprints seen."""
        return {
            'endpoint': self.parts,
            'model': self.model_id,
            'models_entry': self.model_entry,
            'system_fingerprint': sorted(self.fingerprints),
        }

    def close(self) -> None:
        """Stop the request threads and close the HTTP connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class _NoLogprobs(Exception):
    """A response without `logprobs` where confidence asked for them."""
