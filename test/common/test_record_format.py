"""The record format (common/record_format.py): torn last lines and members repaired, damaged middle ones
refused."""

import json

import pytest

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.record_format import (
    EVALUATIONS,
    PARETO,
    VIOLATIONS,
    iter_jsonl,
    read_jsonl,
    records_file,
)
from metavlm_ros.common.results import ResultsStore
from test.common.searches import search_frames, write_legacy


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
    # A directory as earlier versions wrote it: JSON Lines (format 1, whole records).
    directory = tmp_path / 'd'
    search_frames(directory, frames=('a',))
    write_legacy(directory)
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


def test_a_damaged_member_before_the_last_one_refuses_resume(tmp_path):
    directory = tmp_path / 'd'
    search_frames(directory, frames=('a',))
    path = records_file(directory / EVALUATIONS)
    members = list(iter_members(path))
    assert len(members) >= 3  # one a generation
    data = bytearray(path.read_bytes())
    data[members[1].start + 15] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ResultsError, match=f'member at byte {members[1].start} is damaged'):
        ResultsStore(directory, resume=True)
    assert path.read_bytes() == bytes(data)
    # Readers that are not strict skip it (and read what follows); strict readers refuse.
    lost = members[1].data.count(b'\n')
    assert len(read_jsonl(directory / EVALUATIONS)) == 20 - lost
    with pytest.raises(ResultsError):
        list(iter_jsonl(directory / EVALUATIONS, strict=True))
