"""Upgrade a campaign's results directory to results format 3, cell by cell, leaving the old one as it is."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from metavlm_ros.campaign.cells import (
    CELL_FILE,
    CELLS_DIR,
    UNVERIFIED,
    read_campaign,
    verify_cell,
)
from metavlm_ros.campaign.config import sha256_text
from metavlm_ros.common.directories import build_aside, sha256_file
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.upgrade import Upgrade, legacy_files, write_upgraded

__all__ = ['upgrade_campaign']


def _check_cells(cells: Path) -> list[Path]:
    """The committed cells, each whole by its checksums (or written before cells had them)."""
    committed = sorted(p for p in cells.iterdir() if p.is_dir() and not p.name.startswith('.'))
    for cell in committed:
        problem = verify_cell(cell)
        if problem and problem != UNVERIFIED:
            raise InputError(
                f'{cell}: {problem}; a damaged cell is not upgraded (run the campaign again first)'
            )
    return committed


def _restamp(cell: Path) -> None:
    """Write the checksums of the upgraded cell's files into its cell.json, keeping the old ones."""
    info = json.loads((cell / CELL_FILE).read_text(encoding='utf-8'))
    if info.get('files') is None:
        return  # a cell written before checksums: it stays unverified, as it was
    info['upgraded_from'] = {'files': info['files'], 'checksum': info.pop('checksum', None)}
    info['files'] = {
        str(p.relative_to(cell)): sha256_file(p)
        for p in sorted(cell.rglob('*'))
        if p.is_file() and p.name != CELL_FILE
    }
    info['checksum'] = sha256_text(json.dumps(info, sort_keys=True))
    (cell / CELL_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + '\n', encoding='utf-8')


def upgrade_campaign(
    old: str | Path, new: str | Path, *, log: Callable[[str], None] | None = None
) -> Upgrade:
    """Write the campaign results directory `old` as `new`, every cell in results format 3.

    Cells already in format 3 (a campaign an earlier version began and this one finished) and every
    other file (campaign.json, reports, cells set aside as damaged) are copied as they are. Each
    upgraded cell's cell.json gets the checksums of its new files, and keeps the old ones under
    `upgraded_from`. `new` appears whole or not at all; `old` is only read.

    Raises:
        InputError: `old` is not a campaign directory, has a damaged cell or nothing to upgrade; `new`
            exists.
        ResultsError, StorageError: as `upgrade_results`.
    """
    old, new = Path(old), Path(new)
    read_campaign(old)
    cells = _check_cells(old / CELLS_DIR) if (old / CELLS_DIR).is_dir() else []
    if not any(legacy_files(cell) for cell in cells):
        raise InputError(f'{old}: every cell is already results format 3: nothing to upgrade')
    log = log or (lambda message: None)

    def fill(staged: Path) -> Upgrade:
        total = Upgrade()
        for entry in sorted(old.iterdir()):
            if entry.name == CELLS_DIR or entry.name.startswith('.'):
                continue
            copy = shutil.copytree if entry.is_dir() else shutil.copy2
            copy(entry, staged / entry.name)
        (staged / CELLS_DIR).mkdir()
        for entry in sorted((old / CELLS_DIR).iterdir()):
            target = staged / CELLS_DIR / entry.name
            if entry.name.startswith('.tmp-') or not entry.is_dir():
                continue  # a killed cell's scratch: never evidence
            if entry.name.startswith('.') or not legacy_files(entry):
                shutil.copytree(entry, target)  # set aside as damaged, or already format 3: as it is
                continue
            target.mkdir()
            done = write_upgraded(entry, target, log=log)
            _restamp(target)
            for name, count in done.records.items():
                total.records[name] = total.records.get(name, 0) + count
            total.pngs += done.pngs
            total.notes += done.notes
        return total

    return build_aside(new, fill, outside=old)
