"""Scratch paths: where outputs are written before they are moved into place, and their removal once stale."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

__all__ = ['LEGACY_FRAME_SCRATCH', 'is_stale', 'remove_stale', 'scratch_path']

# `.NAME.partial-PID-TOKEN[.EXT]`: hidden, named after the final path and the process writing it.
_SCRATCH = re.compile(r'^\.(?P<final>.+)\.partial-(?P<pid>\d+)-[0-9a-f]{8}(?:\.[A-Za-z0-9]+)?$')
# What ResultsStore named a follow-up PNG while writing it before scratch paths had a pid.
LEGACY_FRAME_SCRATCH = '*.tmp.png'


def scratch_path(final: str | Path, ext: str = '') -> Path:
    """A unique hidden sibling of `final` to write it at before moving it there.

    Args:
        final: The path the output will have.
        ext: A suffix for the scratch name ('.png': OpenCV picks its encoder by suffix).

    Returns:
        `.NAME.partial-PID-TOKEN[EXT]` next to `final`.
    """
    final = Path(final)
    return final.with_name(f'.{final.name}.partial-{os.getpid()}-{secrets.token_hex(4)}{ext}')


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or nothing we may judge: leave its files alone
    return True


def is_stale(path: str | Path) -> bool:
    """Whether `path` is a scratch path whose writer no longer runs (killed before it finished)."""
    match = _SCRATCH.match(Path(path).name)
    return bool(match) and not _running(int(match.group('pid')))


def remove_stale(
    directory: str | Path, final_name: str | None = None, legacy: str | None = None
) -> list[Path]:
    """Remove the scratch files and folders in `directory` left by writers that were killed.

    Only names this module makes are touched (and, with `legacy`, names matching that glob, which
    an earlier version used for its scratch files); a scratch path of a running process is kept.

    Args:
        directory: Where to look (not recursively); a missing directory holds nothing.
        final_name: Only scratch paths of this final name.
        legacy: A glob of older scratch names to remove as well (see LEGACY_FRAME_SCRATCH).

    Returns:
        The paths removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.iterdir()):
        match = _SCRATCH.match(path.name)
        if match:
            if (final_name is not None and match.group('final') != final_name) or not is_stale(path):
                continue
        elif legacy is None or not path.is_file() or not path.match(legacy):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
