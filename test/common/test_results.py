"""The results store as evidence: interrupted at any moment, full disks, torn and damaged lines."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metavlm_ros.common.errors import ParameterError, ResultsError, StorageError
from metavlm_ros.common.results import (
    EVALUATIONS,
    PARETO,
    SUMMARY,
    VIOLATIONS,
    ResultsStore,
    check_output_dir,
    iter_jsonl,
    read_jsonl,
)
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import can_mount_tmpfs, make_frame
from test.fakes import ImageStatsBackend

ROOT = Path(__file__).resolve().parents[2]
FILES = (EVALUATIONS, PARETO, SUMMARY)


def _search(directory, algorithm='nsga2', resume=False, frames=('a', 'b'), **store_options):
    """Two frames searched into one directory, as `metavlm search` does."""
    config = SearchConfig(algorithm=algorithm, population=6, evaluations=20, seed=5)
    with ResultsStore(directory, resume=resume, **store_options) as store:
        done = store.completed_searches()
        for i, name in enumerate(frames):
            if (name, algorithm, 5, 'fake-image-stats', None) in done:
                continue
            run_search(make_frame(64, 48, seed=i), ImageStatsBackend(), config, image_id=name, store=store,
                       extra_fields={'model': 'fake-image-stats'})  # fmt: skip


def _lines(directory) -> dict[str, list[dict]]:
    """Every record of a directory, the wall time left out (it differs between runs)."""
    out = {}
    for name in FILES:
        # Whole records, as the one reader returns them (header lines put back): a resumed store
        # writes its search's header again, so the lines differ where the records do not.
        out[name] = [
            {k: v for k, v in r.items() if k != 'seconds'} for r in read_jsonl(Path(directory) / name)
        ]
    return out


def _write_order(directory) -> list[tuple[str, bytes]]:
    """The lines of a finished directory in the order the store wrote them (per search: its
    evaluations, then its non-dominated set, then its summary)."""
    files = {name: (Path(directory) / name).read_bytes().splitlines(keepends=True) for name in FILES}
    order = []
    for summary in files[SUMMARY]:
        image = json.loads(summary)['image']
        for name in (EVALUATIONS, PARETO):
            order += [(name, line) for line, line_image in _images(files[name]) if line_image == image]
        order.append((SUMMARY, summary))
    return order


def _images(lines: list[bytes]) -> list[tuple[bytes, str]]:
    """Each raw line with the image it belongs to: a header line's own, or that of the header before."""
    out, image = [], None
    for line in lines:
        record = json.loads(line)
        image = record['header']['image'] if 'header' in record else record.get('image', image)
        out.append((line, image))
    return out


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_resume_after_an_interruption_at_any_moment_gives_the_uninterrupted_records(tmp_path, algorithm):
    # A kill (any signal) leaves a prefix of the writes, possibly with a torn last line; resuming
    # from every such moment must give exactly the records of the uninterrupted run, once each.
    full = tmp_path / 'full'
    _search(full, algorithm)
    expected = _lines(full)
    order = _write_order(full)
    moments = sorted(
        {*range(0, len(order) + 1, 3), *(i for i, (n, _) in enumerate(order) if n != EVALUATIONS)}
    )
    for moment in moments:
        for torn in (False, True):
            if torn and moment == len(order):
                continue
            cut = tmp_path / f'cut-{moment}-{torn}'
            cut.mkdir()
            (cut / 'frames').mkdir()
            parts = {name: b'' for name in FILES}
            for name, line in order[:moment]:
                parts[name] += line
            if torn:  # the next line cut in its middle
                name, line = order[moment]
                parts[name] += line[: len(line) // 2]
            for name, data in parts.items():
                (cut / name).write_bytes(data)
            _search(cut, algorithm, resume=True)
            assert _lines(cut) == expected, (moment, torn)


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
    _search(directory, frames=('a',))
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


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_resumed_search_that_does_not_reproduce_its_records_is_stopped(tmp_path, algorithm):
    # Another frame under the same name, judged with the same seed: a resume must not append its
    # records to those of the first frame (as another device or thread count could do too).
    directory = tmp_path / 'd'
    _search(directory, algorithm, frames=('a',))
    (directory / SUMMARY).write_text('')
    before = (directory / EVALUATIONS).read_bytes()
    config = SearchConfig(algorithm=algorithm, population=6, evaluations=20, seed=5)
    with (
        ResultsStore(directory, resume=True) as store,
        pytest.raises(ResultsError, match='does not reproduce'),
    ):
        run_search(make_frame(64, 48, seed=9), ImageStatsBackend(), config, image_id='a', store=store,
                   extra_fields={'model': 'fake-image-stats'})  # fmt: skip
    assert (directory / EVALUATIONS).read_bytes() == before


_FILL_SCRIPT = """
import resource, sys
from metavlm_ros.common.errors import StorageError
from metavlm_ros.common.results import ResultsStore
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

limit, directory = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
config = SearchConfig(algorithm='nsga2', population=6, evaluations=20, seed=5)
try:
    with ResultsStore(directory) as store:
        for i, name in enumerate(('a', 'b')):
            run_search(make_frame(64, 48, seed=i), ImageStatsBackend(), config, image_id=name, store=store,
                       extra_fields={'model': 'fake-image-stats'})
except StorageError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_file_size_limit_at_any_moment_leaves_whole_records_that_resume(tmp_path):
    # RLIMIT_FSIZE makes writes past the limit fail with EFBIG, as a full disk fails with ENOSPC:
    # the failing record is taken back whole, the error is one line, and a resume completes the run.
    full = tmp_path / 'full'
    _search(full)
    expected = _lines(full)
    size = (full / EVALUATIONS).stat().st_size
    for limit in (size // 5, size // 2 + 7, size - 1):
        directory = tmp_path / f'limit-{limit}'
        done = subprocess.run(
            [sys.executable, '-c', _FILL_SCRIPT, str(limit), str(directory)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        message = done.stdout.strip()
        assert '\n' not in message and 'File too large' in message and 'intact' in message
        for name in FILES:
            data = (directory / name).read_bytes() if (directory / name).exists() else b''
            assert not data or data.endswith(b'\n'), name
            assert len(data) <= limit
        _search(directory, resume=True)
        assert _lines(directory) == expected


def test_check_output_dir_refuses_a_file_in_the_path_and_changes_nothing(tmp_path):
    (tmp_path / 'afile').write_text('x')
    for bad in ('afile', 'afile/sub', 'afile/sub/deeper'):
        with pytest.raises(StorageError, match='is a file, not a directory'):
            check_output_dir(tmp_path / bad)
    assert check_output_dir(tmp_path / 'new' / 'dir') == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ['afile']
    with pytest.raises(StorageError, match='MiB needed'):
        check_output_dir(tmp_path / 'new', need_bytes=2**62)


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    with pytest.raises(ParameterError):
        ResultsStore(tmp_path / 'x', resume=True, overwrite=True)
    assert not (tmp_path / 'x').exists()


def test_a_directory_removed_while_written_stops_the_store(tmp_path):
    import shutil

    directory = tmp_path / 'd'
    with ResultsStore(directory) as store:
        store.append_evaluation({'image': 'a', 'index': 0})
        shutil.rmtree(directory)
        with pytest.raises(StorageError, match='removed while results were written'):
            store.append_evaluation({'image': 'a', 'index': 1})
        with pytest.raises(StorageError, match='cannot write'):
            store.append_summary({'image': 'a'})
        with pytest.raises(StorageError, match='cannot write'):
            store.save_frame('x', make_frame(32, 24))


@pytest.mark.skipif(not can_mount_tmpfs(), reason='needs unshare and tmpfs mounts (user namespaces)')
def test_a_full_tmpfs_gives_one_line_and_a_resumable_directory(tmp_path):
    mount = tmp_path / 'mnt'
    mount.mkdir()
    script = (
        f'mount -t tmpfs -o size=48k tmpfs {mount} && '
        f'{sys.executable} -c "$FILL" 100000000000 {mount}/r; code=$?; '
        f'cp -r {mount}/r {tmp_path}/copy; exit $code'
    )
    env = dict(os.environ, FILL=_FILL_SCRIPT)
    done = subprocess.run(['unshare', '-rm', 'sh', '-c', script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert 'No space left on device' in done.stdout and '\n' not in done.stdout.strip()
    copy = tmp_path / 'copy'
    for name in FILES:
        data = (copy / name).read_bytes() if (copy / name).exists() else b''
        assert not data or data.endswith(b'\n')
    full = tmp_path / 'full'
    _search(full)
    _search(copy, resume=True)
    assert _lines(copy) == _lines(full)


def test_overwrite_replaces_results_with_a_killed_writers_scratch_but_not_a_running_ones(tmp_path):
    directory = tmp_path / 'd'
    _search(directory, frames=('a',))
    dead = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True
    )
    stale = directory / f'.search.json.partial-{int(dead.stdout)}-0123abcd'
    stale.write_text('{')
    ResultsStore(directory, overwrite=True).close()
    assert sorted(p.name for p in directory.iterdir()) == []
    _search(directory, frames=('a',))
    running = directory / f'.search.json.partial-{os.getpid()}-4567cdef'
    running.write_text('{')
    with pytest.raises(ParameterError, match='not results'):
        ResultsStore(directory, overwrite=True)
    assert running.exists() and (directory / EVALUATIONS).exists()
