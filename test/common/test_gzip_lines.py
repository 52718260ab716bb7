"""JSON Lines in gzip members (common/gzip_lines.py): written, read back, torn, repaired, and read by the
tools users open results with (pandas, DuckDB, jq)."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.gzip_lines import (
    encode_member,
    is_gzip,
    iter_gzip_records,
    iter_members,
    repair_torn_member,
)


def records(n: int, start: int = 0) -> list[dict]:
    """Records with the kinds of values results hold: ints, full-precision floats, text, nulls, nesting."""
    return [
        {
            'index': i,
            'f_pred': i / 3,
            'composition': '{1,2}',
            'followup': {'animal': -0.06673895567655563 * i, 'trash': 0.1},
            'strength': {'0.01': None, '0.03': i * 1e-9},
            'failed': i % 7 == 0,
        }
        for i in range(start, start + n)
    ]


def write_members(path, sizes: list[int]) -> list[dict]:
    """Members of the given numbers of records, appended one write each; returns every record."""
    written: list[dict] = []
    with open(path, 'ab') as handle:
        for size in sizes:
            batch = records(size, len(written))
            handle.write(encode_member(batch))
            written += batch
    return written


def test_members_read_back_whole_and_in_order(tmp_path):
    path = tmp_path / 'evaluations.jsonl.gz'
    written = write_members(path, [30, 1, 30, 7])
    assert is_gzip(path)
    assert list(iter_gzip_records(path, strict=True)) == written  # floats at full precision
    members = list(iter_members(path))
    assert [m.data.count(b'\n') for m in members] == [30, 1, 30, 7]
    assert members[0].start == 0 and members[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in zip(members[:-1], members[1:], strict=True))
    # One valid gzip file: Python's own reader gives the same lines.
    with gzip.open(path, 'rt') as handle:
        assert len(handle.read().splitlines()) == len(written)


def test_a_member_larger_than_a_read_block_is_read_whole(tmp_path):
    path = tmp_path / 'big.jsonl.gz'
    written = write_members(path, [5000, 3])  # incompressible enough to span several 64 KiB blocks
    assert path.stat().st_size > 1 << 16
    assert list(iter_gzip_records(path)) == written


@pytest.mark.parametrize('cut', [1, 9, 30, -12])
def test_a_torn_last_member_hides_no_earlier_record_and_is_cut_off(tmp_path, cut):
    path = tmp_path / 'evaluations.jsonl.gz'
    written = write_members(path, [30, 30])
    whole = list(iter_members(path))[0].end
    last = path.stat().st_size - whole
    keep = whole + (cut if cut > 0 else last + cut)  # inside the last member: its header, body or trailer
    with open(path, 'rb+') as handle:
        handle.truncate(keep)
    assert list(iter_gzip_records(path, strict=True)) == written[:30]
    repair = repair_torn_member(path)
    assert repair is not None and repair.member and repair.problem == 'torn'
    assert (repair.cut, repair.whole_members, repair.records) == (keep - whole, 1, 30)
    assert repair.message == (
        f'{path}: removed a torn last gzip member ({keep - whole} bytes after 1 whole members, 30 records) '
        'left by an interrupted write'
    )
    assert path.stat().st_size == whole
    assert repair_torn_member(path) is None
    assert list(iter_gzip_records(path, strict=True)) == written[:30]


def _damage(path, member) -> None:
    data = bytearray(path.read_bytes())
    data[member.start + 15] ^= 0xFF  # inside its deflate stream
    path.write_bytes(bytes(data))


def test_a_damaged_member_hides_nothing_after_it_and_is_refused_in_strict_mode(tmp_path):
    path = tmp_path / 'evaluations.jsonl.gz'
    written = write_members(path, [10, 10, 10])
    second = list(iter_members(path))[1]
    _damage(path, second)
    assert [(m.start, m.problem) for m in iter_members(path)][1] == (second.start, 'damaged')
    assert list(iter_gzip_records(path)) == written[:10] + written[20:]
    with pytest.raises(ResultsError, match=f'member at byte {second.start} is damaged'):
        list(iter_gzip_records(path, strict=True))
    before = path.read_bytes()
    assert repair_torn_member(path) is None  # whole members follow it: nothing is cut
    assert path.read_bytes() == before


def test_a_damaged_last_member_is_cut_off(tmp_path):
    path = tmp_path / 'evaluations.jsonl.gz'
    written = write_members(path, [10, 10])
    last = list(iter_members(path))[1]
    _damage(path, last)
    repair = repair_torn_member(path)
    assert (repair.problem, repair.cut, repair.whole_members, repair.records) == (
        'damaged',
        last.end - last.start,
        1,
        10,
    )
    assert 'removed a damaged last gzip member' in repair.message
    assert path.stat().st_size == last.start
    assert list(iter_gzip_records(path, strict=True)) == written[:10]


def test_a_line_that_is_not_a_record_is_skipped_or_raised_in_strict_mode(tmp_path):
    path = tmp_path / 'evaluations.jsonl.gz'
    path.write_bytes(encode_member(records(2)) + gzip.compress(b'[1, 2]\n{"index": 9}\n', mtime=0))
    assert [r['index'] for r in iter_gzip_records(path)] == [0, 1, 9]
    with pytest.raises(ResultsError, match='line 1 of the gzip member at byte'):
        list(iter_gzip_records(path, strict=True))


def test_pandas_duckdb_and_jq_read_the_members_as_written(tmp_path):
    """The tools an engineer opens results with, on the file as written: the same records as ours."""
    import duckdb
    import pandas

    path = tmp_path / 'evaluations.jsonl.gz'
    written = write_members(path, [30, 30, 4])
    # precise_float: pandas' default float parser is off in the last bits (0.33333333333333304 for 1/3).
    frame = pandas.read_json(path, lines=True, precise_float=True)
    assert frame['index'].tolist() == [r['index'] for r in written]
    assert frame['f_pred'].tolist() == [r['f_pred'] for r in written]  # full precision, bit for bit
    rows = duckdb.sql(
        f"SELECT index, f_pred, followup.animal FROM read_json('{path}') ORDER BY index"
    ).fetchall()
    assert rows == [(r['index'], r['f_pred'], r['followup']['animal']) for r in written]
    if shutil.which('jq') is None:
        pytest.skip('jq is not installed here: pandas and DuckDB were checked, jq was not')
    done = subprocess.run(
        f"zcat '{path}' | jq -c 'select(.failed) | .index'",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [int(x) for x in done.stdout.split()] == [r['index'] for r in written if r['failed']]
