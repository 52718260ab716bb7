"""SHA256SUMS manifests: `sha256sum -c` verifies what write_manifest writes; a changed, missing or added
file is named."""

import shutil
import subprocess

import pytest

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.manifest import MANIFEST, check_manifest, write_manifest


@pytest.fixture
def directory(tmp_path):
    root = tmp_path / 'results'
    (root / 'frames').mkdir(parents=True)
    (root / 'evaluations.jsonl.gz').write_bytes(b'\x1f\x8b records')
    (root / 'frames' / 'a b.png').write_bytes(b'png')  # a space in a name
    (root / 'frames' / 'odd\\name.png').write_bytes(b'escaped')  # sha256sum escapes a backslash
    (root / '.scratch.partial-1-0123abcd').write_bytes(b'a killed writer')  # hidden: not evidence
    return root


def _sha256sum_check(directory):
    return subprocess.run(
        ['sha256sum', '--check', '--strict', MANIFEST], cwd=directory, capture_output=True, text=True
    )


def test_sha256sum_verifies_the_manifest_as_written(directory):
    write_manifest(directory)
    lines = (directory / MANIFEST).read_text().splitlines()
    assert len(lines) == 3 and not any('.scratch' in line for line in lines)
    assert shutil.which('sha256sum'), 'coreutils sha256sum, the manifest consumer, is part of the base system'
    done = _sha256sum_check(directory)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(': OK') == 3
    assert check_manifest(directory) is True


@pytest.mark.parametrize(
    'damage, words',
    [
        (
            lambda d: (d / 'frames' / 'a b.png').write_bytes(b'PNG'),
            'frames/a b.png does not match SHA256SUMS',
        ),
        (
            lambda d: (d / 'evaluations.jsonl.gz').unlink(),
            'evaluations.jsonl.gz is listed in SHA256SUMS but missing',
        ),
        (lambda d: (d / 'frames' / 'new.png').write_bytes(b''), 'frames/new.png was added after SHA256SUMS'),
    ],
    ids=['changed', 'missing', 'added'],
)
def test_a_changed_missing_or_added_file_is_named_and_sha256sum_agrees_where_it_checks(
    directory, damage, words
):
    write_manifest(directory)
    damage(directory)
    with pytest.raises(ResultsError) as caught:
        check_manifest(directory)
    assert words in str(caught.value)
    if 'added' not in words:  # sha256sum -c checks the listed files only
        assert _sha256sum_check(directory).returncode != 0


def test_a_directory_without_a_manifest_is_reported_as_unchecked(directory):
    assert check_manifest(directory) is False
