"""The results store as evidence: interrupted at any moment, full disks, torn and damaged lines."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metavlm_ros.common.errors import ResultsError, StorageError
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.results import (
    EVALUATIONS,
    PARETO,
    SUMMARY,
    ResultsStore,
    read_jsonl,
    records_file,
)
from metavlm_ros.method.search import SearchConfig, run_search
from test.common.searches import search_frames
from test.conftest import can_mount_tmpfs, make_frame
from test.fakes import ImageStatsBackend

ROOT = Path(__file__).resolve().parents[2]
FILES = (EVALUATIONS, PARETO, SUMMARY)


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
    """The gzip members of a finished directory in the order the store wrote them (per search: its
    evaluations, one member a generation, then its non-dominated set, then its summary)."""
    members = {
        name: [path.read_bytes()[m.start : m.end] for m in iter_members(path)]
        for name, path in ((name, records_file(Path(directory) / name)) for name in FILES)
    }
    order = []
    for summary in members[SUMMARY]:
        image = _image(summary)
        for name in (EVALUATIONS, PARETO):
            order += [(name, member) for member in members[name] if _image(member) == image]
        order.append((SUMMARY, summary))
    return order


def _image(member: bytes) -> str:
    """The image of the records of one member (a member holds one search's records)."""
    images = {json.loads(line)['image'] for line in gzip.decompress(member).splitlines()}
    assert len(images) == 1, images
    return images.pop()


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_resume_after_an_interruption_at_any_moment_gives_the_uninterrupted_records(tmp_path, algorithm):
    # A kill (any signal) leaves a prefix of the writes (members), possibly with a torn last one;
    # resuming from every such moment must give exactly the records of the uninterrupted run, once each.
    full = tmp_path / 'full'
    search_frames(full, algorithm)
    expected = _lines(full)
    order = _write_order(full)
    moments = range(len(order) + 1)
    for moment in moments:
        for torn in (False, True):
            if torn and moment == len(order):
                continue
            cut = tmp_path / f'cut-{moment}-{torn}'
            cut.mkdir()
            (cut / 'frames').mkdir()
            parts = {name: b'' for name in FILES}
            for name, member in order[:moment]:
                parts[name] += member
            if torn:  # the next member cut in its middle
                name, member = order[moment]
                parts[name] += member[: len(member) // 2]
            for name, data in parts.items():
                (cut / (name + '.gz')).write_bytes(data)
            search_frames(cut, algorithm, resume=True)
            assert _lines(cut) == expected, (moment, torn)


@pytest.mark.parametrize('algorithm', ['nsga2', 'random'])
def test_a_resumed_search_that_does_not_reproduce_its_records_is_stopped(tmp_path, algorithm):
    # Another frame under the same name, judged with the same seed: a resume must not append its
    # records to those of the first frame (as another device or thread count could do too).
    directory = tmp_path / 'd'
    search_frames(directory, algorithm, frames=('a',))
    records_file(directory / SUMMARY).write_bytes(b'')
    before = records_file(directory / EVALUATIONS).read_bytes()
    config = SearchConfig(algorithm=algorithm, population=6, evaluations=20, seed=5)
    with (
        ResultsStore(directory, resume=True) as store,
        pytest.raises(ResultsError, match='does not reproduce'),
    ):
        run_search(make_frame(64, 48, seed=9), ImageStatsBackend(), config, image_id='a', store=store,
                   extra_fields={'model': 'fake-image-stats'})  # fmt: skip
    assert records_file(directory / EVALUATIONS).read_bytes() == before


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
    # the failing member is taken back whole, the error is one line, and a resume completes the run.
    full = tmp_path / 'full'
    search_frames(full)
    expected = _lines(full)
    size = records_file(full / EVALUATIONS).stat().st_size
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
            path = records_file(directory / name)
            if path.exists():
                assert all(m.problem is None for m in iter_members(path)), name
                assert path.stat().st_size <= limit
        search_frames(directory, resume=True)
        assert _lines(directory) == expected


def test_a_directory_removed_while_written_stops_the_store(tmp_path):
    import shutil

    directory = tmp_path / 'd'
    with ResultsStore(directory) as store:
        store.append_evaluation({'image': 'a', 'index': 0})
        store.flush()
        shutil.rmtree(directory)
        store.append_evaluation({'image': 'a', 'index': 1})
        with pytest.raises(StorageError, match='removed while results were written'):
            store.flush()
        with pytest.raises(StorageError, match='cannot write'):
            store.append_summary({'image': 'a'})
        with pytest.raises(StorageError, match='cannot write'):
            store.save_frame('x', make_frame(32, 24))


@pytest.mark.skipif(not can_mount_tmpfs(), reason='needs unshare and tmpfs mounts (user namespaces)')
def test_a_full_tmpfs_gives_one_line_and_a_resumable_directory(tmp_path):
    mount = tmp_path / 'mnt'
    mount.mkdir()
    script = (
        f'mount -t tmpfs -o size=24k tmpfs {mount} && '  # compressed, the run needs 36k
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
        path = records_file(copy / name)
        assert not path.exists() or all(m.problem is None for m in iter_members(path)), name
    full = tmp_path / 'full'
    search_frames(full)
    search_frames(copy, resume=True)
    assert _lines(copy) == _lines(full)


def test_violations_handed_over_together_are_one_member_on_disk_when_the_call_returns(tmp_path):
    records = [{'image': 'a', 'algorithm': 'nsga2', 'seed': 0, 'index': i, 'frame': None} for i in range(5)]
    with ResultsStore(tmp_path / 'out') as store:
        store.append_evaluation({**records[0], 'generation': 0})  # waits for its generation's member
        store.append_violations(records[:3])
        store.append_violation(records[3])
        store.append_violations([])
        path = records_file(tmp_path / 'out' / 'violations.jsonl')
        assert [
            gzip.decompress(path.read_bytes()[m.start : m.end]).count(b'\n') for m in iter_members(path)
        ] == [
            3,
            1,
        ]
        assert read_jsonl(path) == records[:4]
        assert read_jsonl(tmp_path / 'out' / EVALUATIONS) == []
    # A directory of an earlier version takes them as lines of its own format, at once.
    legacy = tmp_path / 'legacy'
    legacy.mkdir()
    (legacy / EVALUATIONS).touch()
    with ResultsStore(legacy) as store:
        store.append_violations(records[:2])
        assert read_jsonl(legacy / 'violations.jsonl') == records[:2]
