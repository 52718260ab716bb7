"""The Chat Completions API as the served backend speaks it (models/chat_completions.py)."""

import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.chat_completions import (
    AnswerCache,
    base_url,
    endpoint_parts,
    status_message,
    yes_probability,
)
from test.models.served_server import logprobs_of


def test_yes_probability_sums_spellings():
    recorded = logprobs_of([('Yes', 0.5), (' yes', 0.1), ('No', 0.2), ('▁no', 0.05), ('Maybe', 0.1)])
    assert yes_probability(recorded) == pytest.approx(0.6 / 0.85)
    assert yes_probability(logprobs_of([('Ġno', 0.9), ('The', 0.05)])) == 0.0
    assert yes_probability(logprobs_of([('The', 0.9), ('A', 0.05)])) is None
    with pytest.raises(ValueError, match='top_logprobs'):
        yes_probability({'content': [{'token': 'Yes', 'logprob': -0.1, 'top_logprobs': []}]})


def test_an_endpoint_is_recorded_by_its_parts_and_read_back_from_them():
    parts = endpoint_parts(' https://vlm.lab/v1/ ')
    assert parts == {'scheme': 'https', 'host': 'vlm.lab', 'port': 443, 'path': '/v1'}
    assert base_url(parts) == 'https://vlm.lab:443/v1'
    ipv6 = endpoint_parts('http://[::1]:8000')
    assert ipv6 == {'scheme': 'http', 'host': '::1', 'port': 8000, 'path': '/'}
    assert base_url(ipv6) == 'http://[::1]:8000'
    with pytest.raises(ParameterError, match='no query or fragment'):
        endpoint_parts('http://127.0.0.1:8000/v1?key=1')


def test_an_error_reads_as_the_first_line_of_its_message():
    class ApiError(Exception):
        def __init__(self, body):
            super().__init__('Error code: 400')
            self.body = body

    assert status_message(ApiError({'error': {'message': 'image too large\nsee docs'}})) == 'image too large'
    assert status_message(ApiError({'message': 'rate limited'})) == 'rate limited'
    assert status_message(ApiError(None)) == 'Error code: 400'
    assert len(status_message(ApiError({'message': 'x' * 500}))) == 200


def test_the_answer_cache_keeps_the_most_recent_answers():
    cache = AnswerCache(2)
    cache.put(('a',), 1)
    cache.put(('b',), 2)
    assert cache.get(('a',)) == 1  # used: now the most recent
    cache.put(('c',), 3)
    assert cache.get(('b',)) is None and cache.get(('a',)) == 1 and cache.get(('c',)) == 3
    off = AnswerCache(0)
    off.put(('a',), 1)
    assert off.get(('a',)) is None
