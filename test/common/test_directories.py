"""Results directories (common/directories.py): checks before writing, replacement, the identity record."""

import json
import os
import subprocess
import sys

import pytest

from metavlm_ros.common.directories import (
    check_output_dir,
    identity_differences,
    read_identity,
    write_identity,
)
from metavlm_ros.common.errors import ParameterError, ResultsError, StorageError
from metavlm_ros.common.record_format import EVALUATIONS, SEARCH_SOURCE, records_file
from metavlm_ros.common.results import ResultsStore
from test.common.searches import search_frames


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


def test_overwrite_replaces_results_with_a_killed_writers_scratch_but_not_a_running_ones(tmp_path):
    directory = tmp_path / 'd'
    search_frames(directory, frames=('a',))
    dead = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True
    )
    stale = directory / f'.search.json.partial-{int(dead.stdout)}-0123abcd'
    stale.write_text('{')
    ResultsStore(directory, overwrite=True).close()
    assert sorted(p.name for p in directory.iterdir()) == []
    search_frames(directory, frames=('a',))
    running = directory / f'.search.json.partial-{os.getpid()}-4567cdef'
    running.write_text('{')
    with pytest.raises(ParameterError, match='not results'):
        ResultsStore(directory, overwrite=True)
    assert running.exists() and records_file(directory / EVALUATIONS).exists()


SETTINGS = {'algorithm': 'nsga2', 'population': 6, 'seed': 0}
MODEL = {'backend': 'clip', 'model': 'demo', 'weights_sha256': 'ab' * 32, 'options': {'classes': ['animal']}}


def test_identity_differences_name_every_difference_in_one_flat_key_each(tmp_path):
    identity = {'settings': SETTINGS, 'model': MODEL, 'source': dict(SEARCH_SOURCE)}
    assert identity_differences(tmp_path, identity) is None  # no record: nothing to compare
    write_identity(tmp_path, identity)
    assert read_identity(tmp_path) == identity and identity_differences(tmp_path, identity) == []
    other = {
        **identity,
        'settings': {**SETTINGS, 'population': 8},
        'source': {**SEARCH_SOURCE, 'endpoint': 'ros'},
    }
    assert identity_differences(tmp_path, other) == [
        'settings.population: 6 there, 8 here',
        'source.endpoint: "inprocess" there, "ros" here',
    ]
    assert identity_differences(tmp_path, other, ignore=('source.endpoint',)) == [
        'settings.population: 6 there, 8 here'
    ]
    (tmp_path / 'search.json').write_text('{"identity": [')
    with pytest.raises(ResultsError, match='damaged identity record'):
        identity_differences(tmp_path, identity)


def test_a_search_record_of_the_first_format_reads_with_the_search_source(tmp_path):
    # `metavlm search` and the demo wrote settings and model only (format 1): their frames came as
    # today's search source says, so they compare with today's record of the same search.
    (tmp_path / 'search.json').write_text(
        json.dumps({'format': 1, 'identity': {'settings': SETTINGS, 'model': MODEL}})
    )
    today = {'settings': SETTINGS, 'model': MODEL, 'source': dict(SEARCH_SOURCE)}
    assert identity_differences(tmp_path, today) == []
    tester = {**today, 'source': {**SEARCH_SOURCE, 'image_transport': 'raw'}}
    assert identity_differences(tmp_path, tester) == ['source.image_transport: none there, "raw" here']
