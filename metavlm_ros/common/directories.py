"""Results directories: checks before writing, the identity record, atomic files, directories built aside."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from metavlm_ros import __version__
from metavlm_ros.common.errors import InputError, ParameterError, ResultsError, StorageError
from metavlm_ros.common.record_format import (
    FRAMES,
    IDENTITY,
    IDENTITY_FORMAT,
    RECORD_FILES,
    RESULT_NAMES,
    SEARCH_SOURCE,
    records_file,
    to_jsonable,
)
from metavlm_ros.common.scratch import is_stale, remove_stale, scratch_path

__all__ = [
    'build_aside',
    'check_output_dir',
    'check_results_dir',
    'holds_results',
    'identity_differences',
    'read_identity',
    'replace_directory',
    'sha256_file',
    'storage_error',
    'write_file_atomic',
    'write_identity',
]

T = TypeVar('T')


def storage_error(
    path: str | Path, exc: OSError, what: str = 'results', kept: str = 'everything written before is intact'
) -> StorageError:
    """The one-line error for an OSError (disk full, read-only, removed directory) while writing."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return StorageError(f'{path}: cannot write {what} ({reason}); {kept}')


def check_output_dir(directory: str | Path, *, need_bytes: int = 0, what: str = 'results') -> Path:
    """Check, before any work, that `directory` can be created or written: it changes nothing there.

    The directory (or its nearest existing parent) must be a writable directory of a file system
    with at least `need_bytes` free.

    Raises:
        StorageError: A path component is a file, the file system is read-only or full, or
            permission is denied.
    """
    path = Path(directory)
    nearest = path
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise StorageError(f'{directory}: {nearest} is a file, not a directory')
    try:
        handle, probe = tempfile.mkstemp(prefix='.metavlm-probe-', dir=nearest)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise StorageError(f'{directory}: cannot write {what} there ({exc.strerror or exc})') from None
    free = shutil.disk_usage(nearest).free
    if need_bytes and free < need_bytes:
        raise StorageError(
            f'{directory}: only {free / 2**20:.1f} MiB free on its disk, {need_bytes / 2**20:.1f} MiB needed'
        )
    return nearest


def holds_results(directory: str | Path) -> bool:
    """Whether a directory holds records or follow-up frames."""
    directory = Path(directory)
    if not directory.is_dir():
        return False
    for name in RECORD_FILES:
        path = records_file(directory / name)
        if path.is_file() and path.stat().st_size > 0:
            return True
    frames = directory / FRAMES
    return frames.is_dir() and any(frames.iterdir())


def check_results_dir(
    directory: str | Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    identity: dict | None = None,
    refuse_existing: bool = False,
    need_bytes: int = 0,
) -> None:
    """Everything that can be checked about a results directory without changing it.

    Args:
        directory: The results directory.
        overwrite: It will be replaced: it must hold results only (nothing else is ever deleted).
        resume: Its searches will be continued: its identity record must equal `identity`.
        identity: What identifies the searches (settings, model, weights); None: not checked.
        refuse_existing: Existing results are an error unless `overwrite` or `resume`.
        need_bytes: Free space needed on its file system.

    Raises:
        StorageError: The location cannot be written (see `check_output_dir`).
        ParameterError: Both overwrite and resume; existing results refused; foreign files to replace.
        ResultsError: `resume` into results of another search, or results without an identity.
    """
    if overwrite and resume:
        raise ParameterError('resume and overwrite exclude each other')
    directory = Path(directory)
    check_output_dir(directory, need_bytes=need_bytes)
    if not directory.exists():
        return
    if refuse_existing and not (overwrite or resume) and holds_results(directory):
        raise ParameterError(
            f'{directory} already holds results: pass --resume to continue or --overwrite to replace'
        )
    if overwrite:
        # Scratch files a killed writer left are not foreign; a running writer's are.
        foreign = sorted(
            p.name for p in directory.iterdir() if p.name not in RESULT_NAMES and not is_stale(p)
        )
        if foreign:
            shown = ', '.join(foreign[:5]) + (', ...' if len(foreign) > 5 else '')
            raise ParameterError(
                f'{directory}: holds files that are not results ({shown}); refusing to replace it'
            )
    if resume and identity is not None and holds_results(directory):
        differences = identity_differences(directory, identity)
        if differences is None:
            raise ResultsError(
                f'{directory}: its results carry no identity record ({IDENTITY}), so --resume cannot '
                'check that they are of the same search; use another --out'
            )
        if differences:
            raise ResultsError(
                f'{directory} holds another search ({"; ".join(differences)}); --resume continues only '
                'the same search: use another --out, or --overwrite to replace it'
            )


def read_identity(directory: str | Path) -> dict | None:
    """The identity record of a results directory (None when it has none).

    Raises:
        ResultsError: The record is damaged.
    """
    path = Path(directory) / IDENTITY
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f'{path}: damaged identity record ({exc})') from None
    if not isinstance(data, dict) or not isinstance(data.get('identity'), dict):
        raise ResultsError(f'{path}: damaged identity record (no identity mapping)')
    return data['identity']


def identity_differences(
    directory: str | Path, identity: dict, *, ignore: tuple[str, ...] = ()
) -> list[str] | None:
    """How `identity` differs from the identity record of a results directory.

    Args:
        directory: The results directory.
        identity: What identifies the searches about to be written there.
        ignore: Flattened keys (`model.model`) or parts (`model`: every key under it) not compared, for
            parts not known yet.

    Returns:
        None when the directory has no identity record; else one `key: A there, B here` per
        difference (empty: the same searches).

    Raises:
        ResultsError: The record is damaged.
    """
    stored = read_identity(directory)
    if stored is None:
        return None
    stored = _as_current(stored, Path(directory) / IDENTITY)
    return [
        line
        for line in _differences(stored, _normalised(identity))
        if not any(line.split(':', 1)[0] == part or line.startswith(part + '.') for part in ignore)
    ]


#: The fields the tester's identity record held in its settings before the one shape (issue 28),
#: now the record's `source` part with the endpoint.
_TESTER_SOURCE_FIELDS = ('transport_size', 'image_transport', 'report_threshold')


def _as_current(stored: dict, path: Path) -> dict:
    """An identity record written before the one shape (format 1) as today's, where it says as much.

    `metavlm search` and the demo's Rand searches recorded the settings and model parts as today, and
    their frames came as today's `SEARCH_SOURCE` says. The tester recorded its endpoint in the model
    part and its source fields in the settings: for the `ros` endpoint that is all today's record
    says (the model the perception node names, the classes); for `inprocess` it lacks what identifies
    a model today (the whole sha256 of its weights, what its backend adds), so it is refused rather
    than compared in part.

    Raises:
        ResultsError: an earlier tester's record of an inprocess model.
    """
    if 'source' in stored:
        return stored
    settings = dict(stored.get('settings') or {})
    model = dict(stored.get('model') or {})
    if 'endpoint' not in model:
        return {'settings': settings, 'model': model, 'source': dict(SEARCH_SOURCE)}
    source = {
        'endpoint': model['endpoint'],
        **{key: settings.pop(key, None) for key in _TESTER_SOURCE_FIELDS},
    }
    if model['endpoint'] != 'ros':
        raise ResultsError(
            f'{path}: written by an earlier tester for an inprocess model, it lacks what identifies a '
            'model today (the whole sha256 of its weights, what its backend adds), so its searches cannot '
            'be told apart from these; write them to another directory'
        )
    # models/identity.py answered_model_identity: the model the perception node names, its classes.
    answered = {'backend': None, 'model': model.get('model'), 'weights_sha256': None}
    return {
        'settings': settings,
        'model': {**answered, 'options': {'classes': model.get('classes')}},
        'source': source,
    }


def write_identity(directory: str | Path, identity: dict) -> None:
    """Write the identity record of a results directory (search.json), whole or not at all."""
    write_file_atomic(Path(directory) / IDENTITY, _identity_bytes(identity))


def _normalised(identity: dict) -> dict:
    # The stored form: what a JSON round trip gives (tuples become lists, numpy values plain).
    return json.loads(json.dumps(to_jsonable(identity), sort_keys=True))


def _flatten(value: Any, prefix: str = '') -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(_flatten(value[key], f'{prefix}.{key}' if prefix else str(key)))
        return out
    return {prefix: value}


def _differences(stored: dict, new: dict) -> list[str]:
    old, now = _flatten(stored), _flatten(new)

    def shown(value: Any) -> str:
        text = json.dumps(value) if value is not None else 'none'
        return text if len(text) <= 40 else text[:37] + '...'

    return [
        f'{key}: {shown(old.get(key))} there, {shown(now.get(key))} here'
        for key in sorted(set(old) | set(now))
        if old.get(key) != now.get(key)
    ]


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, hex, read in blocks."""
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def write_file_atomic(path: str | Path, data: bytes) -> None:
    """Write a whole file under a temporary name, sync it and rename it in: readers see all or nothing.

    Raises:
        OSError: The write failed; nothing is left under either name.
    """
    path = Path(path)
    tmp = scratch_path(path)
    try:
        with open(tmp, 'wb') as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _identity_bytes(identity: dict) -> bytes:
    record = {
        'format': IDENTITY_FORMAT,
        'package': 'metavlm_ros',
        'version': __version__,
        'identity': _normalised(identity),
    }
    return (json.dumps(record, indent=1, sort_keys=True) + '\n').encode()


def _staged_directory(directory: Path) -> Path:
    # A sibling (same file system: renames are atomic), made like any directory (umask applies);
    # those that killed runs left are removed first.
    remove_stale(directory.parent, directory.name)
    staged = scratch_path(directory)
    staged.mkdir()
    return staged


def build_aside(new: str | Path, fill: Callable[[Path], T], *, outside: str | Path | None = None) -> T:
    """Build the directory `new` under a scratch name with `fill`, then rename it in: it appears whole or
    not at all (a killed build leaves a scratch sibling, which the next build removes).

    Args:
        new: The directory to create (it must not exist; its parents are made).
        fill: Called with the new directory, still under its scratch name, to put files in it; what it
            returns is returned.
        outside: A directory `new` must not lie in (the one it is built from).

    Raises:
        InputError: `new` exists, or lies inside `outside`.
        StorageError: `new` could not be written (full disk, no permission).
    """
    new = Path(new)
    if new.exists():
        raise InputError(f'{new}: exists; name a new directory')
    if outside is not None and new.resolve().is_relative_to(Path(outside).resolve()):
        raise InputError(f'{new}: inside {outside}; name a directory outside it')
    try:
        new.parent.mkdir(parents=True, exist_ok=True)
        staged = _staged_directory(new)
    except OSError as exc:
        raise storage_error(new, exc) from None
    try:
        done = fill(staged)
        os.rename(staged, new)
    except OSError as exc:
        shutil.rmtree(staged, ignore_errors=True)
        raise storage_error(new, exc) from None
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return done


def replace_directory(
    directory: str | Path,
    *,
    fill: Callable[[Path], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Replace a directory whole by a new one, built aside and renamed in; only then delete the old one.

    Args:
        directory: The directory to replace (it must exist).
        fill: Called with the new directory, still under its temporary name, to put files in it.
        log: Told when the replaced directory could not all be removed.

    Raises:
        OSError: Building or renaming failed: the old directory is in place, whole, and the new one gone.
    """
    directory = Path(directory)
    staged = _staged_directory(directory)
    # Not a scratch name: if this process dies between the two renames, the replaced directory stays
    # there, whole, and nothing removes it.
    old = directory.parent / f'.{directory.name}.replaced-{os.getpid()}-{time.time_ns()}'
    try:
        if fill is not None:
            fill(staged)
        os.rename(directory, old)
        try:
            os.rename(staged, directory)
        except OSError:
            os.rename(old, directory)
            raise
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    # The new directory is in place: the replaced one goes, as asked.
    shutil.rmtree(old, ignore_errors=True)
    if old.exists() and log is not None:
        log(f'{old}: the replaced results could not all be removed')
