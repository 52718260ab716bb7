"""The served backend against real servers: `transformers serve` of a tiny LLaVA, and scripted HTTP ones."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import pytest

from metavlm_ros.common.codec import encode_png
from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.models.backends.served import ServerLost
from metavlm_ros.models.vlm import create_backend, model_identity
from test.conftest import make_frame
from test.models.served_server import ScriptedServer, chat_body, free_port, logprobs_of, transformers_serve

FRAMES = [make_frame(64, 48, seed) for seed in range(6)]
METAVLM = Path(sys.executable).parent / 'metavlm'
KEY_VAR = 'METAVLM_TEST_SERVED_KEY'


@pytest.fixture(scope='module')
def tiny_llava(tmp_path_factory) -> Path:
    from metavlm_ros.models.tiny_families import build_tiny_vlm

    directory = tmp_path_factory.mktemp('served') / 'llava'
    build_tiny_vlm('llava', directory)
    return directory


@pytest.fixture(scope='module')
def served(tiny_llava, tmp_path_factory):
    """(endpoint, model id) of `transformers serve` serving the tiny LLaVA, once for the module."""
    with transformers_serve(tiny_llava, tmp_path_factory.mktemp('serve-log') / 'serve.log') as where:
        yield where


def _run(args: list[str], env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    environment = {**os.environ, 'PYTHONPATH': str(Path(__file__).parents[2]), **(env or {})}
    return subprocess.run(
        [str(METAVLM), *args], capture_output=True, text=True, env=environment, timeout=timeout, check=False
    )


def _parts(endpoint: str) -> dict:
    port = int(endpoint.removesuffix('/v1').rsplit(':', 1)[1])
    return {'scheme': 'http', 'host': '127.0.0.1', 'port': port, 'path': '/v1'}


def _frame_file(directory: Path) -> Path:
    path = directory / 'frame.png'
    cv2.imwrite(str(path), cv2.cvtColor(make_frame(96, 72, 3), cv2.COLOR_RGB2BGR))
    return path


# -- against transformers serve ------------------------------------------------------------------------


@pytest.mark.parametrize('answer_format', ['text', 'json'])
def test_served_and_in_process_give_the_same_count_answers(served, tiny_llava, answer_format):
    endpoint, model = served
    remote = create_backend('openai', model, endpoint=endpoint, answer_format=answer_format, max_in_flight=3)
    local = create_backend('vlm', str(tiny_llava), device='cpu', answer_format=answer_format)
    try:
        over_http, in_process = remote.predict(FRAMES), local.predict(FRAMES)
    finally:
        remote.close()
    assert [p.text for p in over_http] == [p.text for p in in_process]
    assert over_http == in_process  # values, and for JSON the same parse failures
    assert len({p.text for p in over_http}) > 1  # the answers depend on the frame: a real comparison
    if answer_format == 'json':
        # The random tiny model writes no JSON: each answer is a recorded parse failure, never zeros.
        assert all(p.error.startswith('unparseable answer') and p.values == {} for p in over_http)
    assert remote.stats.last.retries == [0] * len(FRAMES) and len(remote.stats.last.latency_s) == len(FRAMES)
    identity = remote.identity()
    assert identity['models_entry']['id'] == model
    assert identity['endpoint'] == _parts(endpoint)


def test_a_repeated_request_is_answered_from_the_cache(served):
    endpoint, model = served
    backend = create_backend('openai', model, endpoint=endpoint)
    try:
        first = backend.predict(FRAMES[:3])
        sent = backend.stats.requests
        again = backend.predict(FRAMES[:3])
    finally:
        backend.close()
    assert again == first
    assert backend.stats.requests == sent and backend.stats.last.cache_hits == 3


def test_confidence_against_a_server_without_logprobs_is_refused_at_start_up(served):
    endpoint, model = served
    with pytest.raises(ModelError) as refused:
        create_backend('openai', model, endpoint=endpoint, kind='confidence')
    message = str(refused.value)
    assert 'returns no logprobs' in message and 'vLLM' in message and '\n' not in message


def test_an_unknown_model_is_named_with_the_served_ids(served):
    endpoint, model = served
    with pytest.raises(ModelError, match=f"does not serve model 'nope'; it serves: {model}"):
        create_backend('openai', 'nope', endpoint=endpoint)


def test_search_through_the_server_records_endpoint_and_model_never_the_key(served, tmp_path):
    endpoint, model = served
    secret = 'sk-test-4f1d9c0e7b'
    out = tmp_path / 'results'
    frame = str(_frame_file(tmp_path))
    args = ['search', frame, '--backend', 'openai', '--endpoint', endpoint, '--model', model, '--quiet']
    args += f'--api-key-env {KEY_VAR} --population 4 --evaluations 8 --out {out}'.split()
    done = _run(args, env={KEY_VAR: secret})
    assert done.returncode == 0, done.stderr
    identity = json.loads((out / 'search.json').read_text())['identity']['model']
    assert identity['backend'] == 'openai' and identity['model'] == model
    assert identity['endpoint'] == _parts(endpoint)
    evaluations = read_jsonl(out / 'evaluations.jsonl')
    assert len(evaluations) == 8
    # Every evaluation records what its answer cost (a cached follow-up: 0 s, no retries).
    assert all(r['request']['latency_s'] >= 0 and r['request']['retries'] == 0 for r in evaluations)
    assert any(r['request']['latency_s'] > 0 for r in evaluations)
    for path in [p for p in out.rglob('*') if p.is_file()]:
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in done.stdout + done.stderr
    # Resume refuses another endpoint: the results belong to the model served there.
    moved = [a if a != endpoint else endpoint.replace('127.0.0.1', 'localhost') for a in args]
    refused = _run([*moved, '--resume'], env={KEY_VAR: secret})
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_campaign_judges_through_the_server(served, tmp_path):
    from metavlm_ros.campaign.config import parse_config
    from metavlm_ros.campaign.runner import run_campaign

    endpoint, model = served
    (tmp_path / 'frames').mkdir()
    _frame_file(tmp_path / 'frames')
    entry = {'backend': 'openai', 'model': model, 'name': 'served', 'endpoint': endpoint, 'max_in_flight': 4}
    data = {'frames': {'sources': [str(tmp_path / 'frames')]}, 'models': [entry], 'runs': 1}
    data.update(population=4, evaluations=8, seed=5, algorithms=['nsga2'])
    run = run_campaign(parse_config(data, base_dir=tmp_path), tmp_path / 'out', progress=False, threads=1)
    assert (run.total, run.completed) == (1, 1)
    (recorded,) = json.loads((tmp_path / 'out' / 'campaign.json').read_text())['models']
    assert recorded['endpoint'] == _parts(endpoint) and recorded['weights_sha256'] is None
    (cell,) = (tmp_path / 'out' / 'cells').iterdir()
    assert len(read_jsonl(cell / 'evaluations.jsonl')) == 8


# -- faults against real sockets -------------------------------------------------------------------------


def test_nothing_listening_is_one_line_and_exit_2(tmp_path):
    endpoint = f'http://127.0.0.1:{free_port()}/v1'
    frame = str(_frame_file(tmp_path))
    args = ['search', frame, '--backend', 'openai', '--endpoint', endpoint, '--model', 'm']
    done = _run([*args, '--retries', '0', '--out', str(tmp_path / 'out'), '--quiet'])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and 'nothing is listening (connection refused)' in lines[0], done.stderr


@pytest.mark.parametrize(
    ('endpoint', 'reason'),
    [
        ('ftp://127.0.0.1:1/v1', 'http:// or https://'),
        ('http://user:hunter2@127.0.0.1:8000/v1', 'credentials in the URL are refused'),
        ('http://127.0.0.1:99999/v1', 'not a URL'),
        ('http:///v1', 'no host'),
    ],
)
def test_a_bad_endpoint_is_refused_before_any_request(endpoint, reason):
    with pytest.raises(ParameterError, match=reason) as refused:
        create_backend('openai', 'm', endpoint=endpoint)
    assert 'hunter2' not in str(refused.value)


def test_a_key_given_where_its_variable_name_belongs_is_refused_without_echoing_it():
    with pytest.raises(ParameterError) as refused:
        create_backend('openai', 'm', endpoint='http://127.0.0.1:1/v1', api_key_env='sk-live-123')
    assert 'sk-live-123' not in str(refused.value) and 'NAME of an environment variable' in str(refused.value)


def _answer(text: str = 'Animals: 1 fish') -> ScriptedServer:
    return ScriptedServer(lambda body: (200, chat_body(text), 0.0))


def test_a_wrong_key_names_its_variable_and_a_right_one_is_sent(monkeypatch):
    with ScriptedServer(lambda body: (200, chat_body('None'), 0.0), key='right-key') as server:
        monkeypatch.setenv(KEY_VAR, 'wrong-key')
        with pytest.raises(ModelError) as refused:
            create_backend('openai', 'recorded', endpoint=server.endpoint, api_key_env=KEY_VAR)
        assert f'HTTP 401, the server refused the key in ${KEY_VAR}' in str(refused.value)
        assert 'wrong-key' not in str(refused.value)
        monkeypatch.setenv(KEY_VAR, 'right-key')
        backend = create_backend('openai', 'recorded', endpoint=server.endpoint, api_key_env=KEY_VAR)
        backend.close()
        assert server.authorizations[-1] == 'Bearer right-key'


def test_a_slow_answer_past_the_timeout_is_retried_then_refused():
    with ScriptedServer(lambda body: (200, chat_body('None'), 3.0)) as server:
        started = time.monotonic()
        with pytest.raises(ModelError, match=r'no answer within timeout_s=0.3 s \(after 1 retries\)'):
            create_backend('openai', 'recorded', endpoint=server.endpoint, timeout_s=0.3, retries=1)
        assert time.monotonic() - started < 2.5  # bounded: never waits for the slow server
        assert len(server.requests) == 2


@pytest.mark.parametrize(
    ('reply', 'reason'),
    [
        ({'object': 'chat.completion', 'result': 'Animals: 1 fish'}, 'not a Chat Completions body'),
        (b'<html>proxy error</html>', 'the response is not JSON'),
        ({'choices': [{'message': {'content': 7}}]}, 'not a Chat Completions body'),
    ],
)
def test_a_body_outside_the_schema_is_one_clear_error(reply, reason):
    with ScriptedServer(lambda body: (200, reply, 0.0)) as server:
        with pytest.raises(ModelError, match=reason) as refused:
            create_backend('openai', 'recorded', endpoint=server.endpoint)
        assert '\n' not in str(refused.value)


def test_a_404_from_chat_lists_the_served_models():
    with ScriptedServer(lambda body: (404, {'error': {'message': 'model not found'}}, 0.0)) as server:
        with pytest.raises(ModelError, match='HTTP 404, unknown model or path; the server serves: recorded'):
            create_backend('openai', 'recorded', endpoint=server.endpoint)


def test_server_errors_are_retried_and_counted():
    replies = iter(
        [(503, {'error': {'message': 'loading'}}, 0.0), (429, {'error': {'message': 'slow down'}}, 0.0)]
    )
    with ScriptedServer(lambda body: next(replies, (200, chat_body('Animals: 2 fish'), 0.0))) as server:
        backend = create_backend('openai', 'recorded', endpoint=server.endpoint, retries=2, input_side=384)
        try:
            assert backend.stats.retries == 2
            assert backend.input_size == 384  # what --working-size auto reads: 2 x 384 px frames are sent
            (prediction,) = backend.predict(FRAMES[:1])
        finally:
            backend.close()
    assert prediction.values['animal'] == 2.0 and backend.stats.last.retries == [0]


def test_requests_go_out_together_within_the_bound():
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def chat(body: dict):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.15)
        with lock:
            in_flight[0] -= 1
        return 200, chat_body('None'), 0.0

    with ScriptedServer(chat) as server:
        backend = create_backend(
            'openai', 'recorded', endpoint=server.endpoint, max_in_flight=3, cache_size=0
        )
        try:
            most[0] = 0
            started = time.monotonic()
            backend.predict(FRAMES)
            seconds = time.monotonic() - started
        finally:
            backend.close()
    assert most[0] == 3
    assert seconds < 0.15 * len(FRAMES) * 0.75  # 6 requests, 3 at a time: about 2 round trips, not 6


def test_the_server_killed_mid_search_stops_it_with_what_finished_kept(tmp_path):
    count = [0]
    lock = threading.Lock()
    holder: list[ScriptedServer] = []

    def chat(body: dict):
        with lock:
            count[0] += 1
            n = count[0]
        # The probe, the source and the first generation of 4 are answered; then the server dies.
        if n == 6:
            threading.Thread(target=holder[0].stop, daemon=True).start()
        if n > 6:
            return 0, None, 0.0
        return 200, chat_body(f'Animals: {n % 3} fish'), 0.0

    with ScriptedServer(chat) as server:
        holder.append(server)
        out = tmp_path / 'out'
        args = ['search', str(_frame_file(tmp_path)), '--backend', 'openai', '--endpoint', server.endpoint]
        args += ['--model', 'recorded', '--retries', '2', '--population', '4', '--evaluations', '12']
        done = _run([*args, '--out', str(out), '--quiet'])
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert 'search stopped' in last and 'after 2 retries' in last, done.stderr
    evaluations = read_jsonl(out / 'evaluations.jsonl')
    assert len(evaluations) == 4  # the first generation, once each
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert summary['stopped'] is True and summary['evaluations'] == 4


# -- the confidence path against recorded responses of the published schema ------------------------------


def test_confidence_from_recorded_top_logprobs():
    # P(yes) per class, told apart by the class named in the question.
    table = {'an animal': 0.9, 'a vegetation': 0.25, 'an object': 0.5}
    table_classes = ('animal', 'vegetation', 'object')

    def chat(body: dict):
        question = body['messages'][0]['content'][1]['text']
        for name, p in table.items():
            if f'Is there {name} ' in question:
                return 200, chat_body('Yes', logprobs=logprobs_of([('Yes', p), ('No', 1 - p)])), 0.0
        return 200, chat_body('The', logprobs=logprobs_of([('The', 0.7), ('A', 0.2)])), 0.0

    frame = FRAMES[0]
    with ScriptedServer(chat) as server:
        four = create_backend('openai', 'recorded', endpoint=server.endpoint, kind='confidence')
        three = create_backend(
            'openai', 'recorded', endpoint=server.endpoint, kind='confidence', classes=list(table_classes)
        )
        try:
            (failed,) = four.predict([frame])
            (prediction,) = three.predict([frame])
        finally:
            four.close()
            three.close()
        request = server.requests[-1]
    assert 'trash: neither yes nor no' in failed.error and failed.values == {}
    assert prediction.kind == 'confidence' and not prediction.error
    assert prediction.values == pytest.approx({'animal': 0.9, 'vegetation': 0.25, 'object': 0.5})
    assert (request['max_tokens'], request['logprobs'], request['top_logprobs']) == (1, True, 20)
    assert (request['temperature'], request['seed']) == (0, 0)
    url = request['messages'][0]['content'][0]['image_url']['url']
    assert url == 'data:image/png;base64,' + base64.b64encode(encode_png(frame)).decode()
    assert three.identity()['system_fingerprint'] == ['fp_test']


def test_identity_records_the_endpoint_without_credentials_or_key():
    identity = model_identity(
        'openai', 'served-id', {'endpoint': 'https://vlm.lab:8443/v1/', 'api_key_env': KEY_VAR}
    )
    assert identity['endpoint'] == {'scheme': 'https', 'host': 'vlm.lab', 'port': 8443, 'path': '/v1'}
    assert identity['model'] == 'served-id' and identity['weights_sha256'] is None
    assert 'api_key_env' not in identity['options']  # which variable holds the key does not change answers
    with pytest.raises(ParameterError, match='endpoint is required'):
        model_identity('openai', 'served-id', {})


def test_server_lost_ends_a_search_as_an_interruption():
    from metavlm_ros.common.errors import SearchInterrupted

    with _answer() as server:
        backend = create_backend('openai', 'recorded', endpoint=server.endpoint, retries=0)
        server.stop()
        try:
            with pytest.raises(SearchInterrupted, match='connection refused'):
                backend.predict(FRAMES[:1])
        finally:
            backend.close()
    assert isinstance(ServerLost('x'), SearchInterrupted) and 'connection refused' in backend.failure


def test_served_grounding_asks_what_the_model_is_asked_in_process_and_fails_what_does_not_parse(
    served, tiny_llava
):
    # A grounding question through the real server: the tiny LLaVA's greedy answer to it is the one it
    # gives in process to the same question; its random words hold no boxes, so every frame is a
    # failed evaluation with the answer kept, never a frame with no objects (docs/models.md).
    endpoint, model = served
    same = {'max_new_tokens': 48}  # detection answers get a longer default than count answers
    remote = create_backend(
        'openai', model, endpoint=endpoint, kind='detection', box_format='qwen2.5', **same
    )
    try:
        over_http = remote.predict(FRAMES[:3])
    finally:
        remote.close()
    (question,) = remote.asked.questions
    local = create_backend('vlm', str(tiny_llava), device='cpu', prompt=question, **same)
    assert local.asked.questions == [question]
    in_process = local.predict(FRAMES[:3])
    assert [p.text for p in over_http] == [p.text for p in in_process]
    assert len({p.text for p in over_http}) > 1  # the answers depend on the frame
    for prediction in over_http:
        assert prediction.kind == 'detection' and prediction.error.startswith('unparseable answer')
        assert not prediction.detections
