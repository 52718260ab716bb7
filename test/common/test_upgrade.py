"""`metavlm upgrade`: results of formats 1 and 2 written anew in format 3, record for record, the old
directory never changed; refusals leave nothing behind."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from metavlm_ros.campaign.cells import CELL_FILE, CELLS_DIR, verify_cell
from metavlm_ros.campaign.config import sha256_text
from metavlm_ros.campaign.loading import load_results
from metavlm_ros.campaign.upgrade import upgrade_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.results import EVALUATIONS, PARETO, SUMMARY, VIOLATIONS, read_jsonl, records_file
from metavlm_ros.common.upgrade import upgrade_results
from test.common.searches import search_frames, write_legacy
from test.common.test_record_lines import _legacy, _tester_like
from test.fakes import ImageStatsBackend
from test.tools_reading import same_as_ours

ROOT = Path(__file__).resolve().parents[2]
NAMES = (EVALUATIONS, PARETO, SUMMARY, VIOLATIONS)


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `directory`: its bytes and modification time."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob('*'))
        if p.is_file()
    }


def _records(directory: Path) -> dict[str, list[dict]]:
    return {name: read_jsonl(directory / name) for name in NAMES}


@pytest.fixture
def format2(tmp_path) -> Path:
    """A tester's directory in format 2 (header lines, defaults, Pareto and violation lines that refer to
    evaluations by byte), with violation PNGs and two searches' source frames."""
    old = _legacy(tmp_path / 'old')
    _tester_like(old, ImageStatsBackend())
    assert b'evaluations_at' in (old / VIOLATIONS).read_bytes()  # lines that are not whole records
    return old


def test_a_format_2_directory_is_written_whole_in_format_3_and_left_as_it_was(format2, tmp_path):
    before, records = _snapshot(format2), _records(format2)
    new = tmp_path / 'new'
    done = upgrade_results(format2, new)
    assert _snapshot(format2) == before
    assert _records(new) == records
    assert done.records == {name: len(records[name]) for name in NAMES}
    for name in NAMES:
        path = records_file(new / name)
        assert path.name == name + '.gz'
        assert all(member.problem is None for member in iter_members(path))
    assert not (new / EVALUATIONS).exists()
    # Everything else as it was, byte for byte: the identity, the follow-up and source PNGs.
    after = _snapshot(new)
    others = {name: data for name, (data, _) in before.items() if not name.endswith('.jsonl')}
    assert others and {name: after[name][0] for name in others} == others
    assert done.pngs == sum(name.endswith('.png') for name in others) > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]  # no scratch left
    same_as_ours(new, names=(EVALUATIONS, PARETO, SUMMARY, VIOLATIONS))


def test_a_format_1_directory_with_a_torn_last_line_is_upgraded_and_the_line_named(tmp_path):
    old = tmp_path / 'old'
    search_frames(old)
    write_legacy(old)
    whole = read_jsonl(old / EVALUATIONS)
    with open(old / EVALUATIONS, 'ab') as handle:
        handle.write(b'{"index": 99, "genoty')  # a killed writer's
    before = _snapshot(old)
    said: list[str] = []
    upgrade_results(old, tmp_path / 'new', log=said.append)
    assert _snapshot(old) == before  # the torn line is still there: OLD is only read
    assert read_jsonl(tmp_path / 'new' / EVALUATIONS) == whole
    (line,) = said
    assert line.startswith(f'{old / EVALUATIONS}: removed a torn last line (21 bytes), not carried over')
    assert str(tmp_path / 'new') not in line


def test_the_command_says_what_it_wrote_and_refuses_in_one_line(format2, tmp_path, capsys):
    new = tmp_path / 'new'
    assert main(['upgrade', str(format2), str(new)]) == 0
    out = capsys.readouterr().out
    count = len(read_jsonl(new / EVALUATIONS))
    assert f'{new}: the results of {format2} in results format 3 ({count} in {EVALUATIONS}.gz,' in out
    for args, words in (
        ([format2, new], 'exists; name a new directory'),
        ([new, tmp_path / 'again'], 'already results format 3'),
        ([tmp_path / 'none', tmp_path / 'n2'], 'no such results directory'),
        ([ROOT / 'docs', tmp_path / 'n3'], 'not a results directory'),
        ([format2, format2 / 'inside'], 'inside'),
    ):
        assert main(['upgrade', *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and words in err, err
    assert not (tmp_path / 'again').exists() and not (format2 / 'inside').exists()


def test_a_damaged_line_is_refused_and_nothing_is_written(format2, tmp_path, capsys):
    lines = (format2 / EVALUATIONS).read_bytes().split(b'\n')
    lines[3] = lines[3][:10]
    (format2 / EVALUATIONS).write_bytes(b'\n'.join(lines))
    with pytest.raises(ResultsError, match='line 4 is damaged'):
        upgrade_results(format2, tmp_path / 'new')
    assert main(['upgrade', str(format2), str(tmp_path / 'new')]) == 2
    assert 'line 4 is damaged' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['old']


def test_a_write_that_fails_leaves_no_new_directory(format2, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(shutil, 'copytree', full)
    with pytest.raises(Exception, match='No space left'):
        upgrade_results(format2, tmp_path / 'new')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['old']


def _commit_with_checksums(cell: Path) -> None:
    """Write a cell's checksums into its cell.json, as campaign versions since then commit a cell."""
    info = json.loads((cell / CELL_FILE).read_text())
    info['files'] = {
        str(p.relative_to(cell)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(cell.rglob('*'))
        if p.is_file() and p.name != CELL_FILE
    }
    info['checksum'] = sha256_text(json.dumps(info, sort_keys=True))
    (cell / CELL_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + '\n')


def _cells(directory: Path):
    loaded = load_results(directory)
    return [(c.info['id'], c.summary, c.solutions, c.front) for c in loaded.cells]


def test_a_campaign_is_upgraded_cell_by_cell_with_its_checksums(tmp_path):
    old = tmp_path / 'campaign'
    shutil.copytree(ROOT / 'test' / 'fixtures' / 'campaign_results', old)
    cells = sorted((old / CELLS_DIR).iterdir())
    _commit_with_checksums(cells[0])
    assert verify_cell(cells[0]) is None and verify_cell(cells[1]) == 'unverified'
    before, loaded = _snapshot(old), _cells(old)
    new = tmp_path / 'new'
    done = upgrade_campaign(old, new)
    assert _snapshot(old) == before
    assert _cells(new) == loaded
    assert done.records[EVALUATIONS] == sum(len(read_jsonl(c / EVALUATIONS)) for c in cells)
    upgraded = new / CELLS_DIR / cells[0].name
    assert verify_cell(upgraded) is None  # the new files' checksums, the old ones kept
    info = json.loads((upgraded / CELL_FILE).read_text())
    assert info['upgraded_from']['files'] == json.loads((cells[0] / CELL_FILE).read_text())['files']
    assert verify_cell(new / CELLS_DIR / cells[1].name) == 'unverified'  # as it was
    assert (new / 'campaign.json').read_bytes() == (old / 'campaign.json').read_bytes()
    same_as_ours(upgraded, names=(EVALUATIONS, SUMMARY))
    # A campaign report reads both alike (the command a user runs next).
    for directory in (old, new):
        assert main(['report', str(directory), '--out', str(tmp_path / f'report-{directory.name}')]) == 0
    reports = [(tmp_path / f'report-{d.name}' / 'report.md').read_text() for d in (old, new)]
    assert reports[0] == reports[1].replace(f'`{new}`', f'`{old}`')  # but for where the results are


def test_a_campaign_with_a_damaged_cell_is_refused(tmp_path, capsys):
    old = tmp_path / 'campaign'
    shutil.copytree(ROOT / 'test' / 'fixtures' / 'campaign_results', old)
    cell = sorted((old / CELLS_DIR).iterdir())[2]
    _commit_with_checksums(cell)
    with open(cell / EVALUATIONS, 'ab') as handle:
        handle.write(b'\n')
    assert main(['upgrade', str(old), str(tmp_path / 'new')]) == 2
    err = capsys.readouterr().err
    assert f'{cell}: evaluations.jsonl does not match its checksum; a damaged cell is not upgraded' in err
    assert not (tmp_path / 'new').exists()
    assert os.listdir(tmp_path) == ['campaign']
