"""The record format (common/record_format.py): torn last lines repaired, damaged middle lines refused."""

import json

import pytest

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.record_format import EVALUATIONS, PARETO, VIOLATIONS, iter_jsonl, read_jsonl
from metavlm_ros.common.results import ResultsStore
from test.common.searches import search_frames


def test_torn_last_line_is_removed_and_reported_before_anything_is_appended(tmp_path):
    record = json.dumps({'image': 'a', 'index': 0})
    for tail in ('{', '{"image": "a", "ind', record[:-1]):
        directory = tmp_path / f'd{len(tail)}'
        directory.mkdir()
        (directory / EVALUATIONS).write_text(record + '\n' + tail)
        messages = []
        with ResultsStore(directory, log=messages.append) as store:
            assert (directory / EVALUATIONS).read_text() == record + '\n'
            store.append_evaluation({'image': 'a', 'index': 1})
        assert len(messages) == 1 and 'torn last line' in messages[0] and EVALUATIONS in messages[0]
        assert [r['index'] for r in read_jsonl(directory / EVALUATIONS)] == [0, 1]
    # A whole record that only lost its newline is kept, and completed.
    directory = tmp_path / 'whole'
    directory.mkdir()
    (directory / PARETO).write_text(record)
    messages = []
    ResultsStore(directory, log=messages.append).close()
    assert (directory / PARETO).read_text() == record + '\n' and 'newline' in messages[0]
    # The tester's violations.jsonl too (the tester reopens its directory).
    directory = tmp_path / 'violations'
    directory.mkdir()
    (directory / VIOLATIONS).write_text(record + '\n{"ima')
    messages = []
    ResultsStore(directory, log=messages.append).close()
    assert (directory / VIOLATIONS).read_text() == record + '\n' and 'torn last line' in messages[0]


def test_a_damaged_line_before_the_last_one_refuses_resume(tmp_path):
    directory = tmp_path / 'd'
    search_frames(directory, frames=('a',))
    lines = (directory / EVALUATIONS).read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:20] + b'\x00garbage\n'
    (directory / EVALUATIONS).write_bytes(b''.join(lines))
    before = (directory / EVALUATIONS).read_bytes()
    with pytest.raises(ResultsError, match='line 4 is damaged'):
        ResultsStore(directory, resume=True)
    assert (directory / EVALUATIONS).read_bytes() == before
    # Readers that are not strict skip it; strict readers refuse.
    assert len(read_jsonl(directory / EVALUATIONS)) == 19
    with pytest.raises(ResultsError):
        list(iter_jsonl(directory / EVALUATIONS, strict=True))
