"""SHA256SUMS manifests of results directories and campaigns, in the format `sha256sum -c` verifies."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.common.directories import sha256_file, write_file_atomic
from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.record_format import MANIFEST

__all__ = ['MANIFEST', 'check_manifest', 'manifest_files', 'write_manifest']


def manifest_files(directory: str | Path) -> list[str]:
    """The files a manifest of `directory` lists: every file below it, by relative path, sorted; not the
    manifest itself, nor hidden names (scratch of writers, cells set aside)."""
    directory = Path(directory)
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob('*')
        if p.is_file()
        and p.name != MANIFEST
        and not any(part.startswith('.') for part in p.relative_to(directory).parts)
    )


def _line(digest: str, name: str) -> str:
    # GNU sha256sum's escaping: a name with a backslash or newline gets a leading backslash.
    if '\\' in name or '\n' in name:
        return '\\' + digest + '  ' + name.replace('\\', '\\\\').replace('\n', '\\n')
    return f'{digest}  {name}'


def write_manifest(directory: str | Path) -> Path:
    """Write `directory`/SHA256SUMS over its files now (replacing one written before), atomically."""
    directory = Path(directory)
    lines = [_line(sha256_file(directory / name), name) for name in manifest_files(directory)]
    path = directory / MANIFEST
    write_file_atomic(path, ''.join(line + '\n' for line in lines).encode())
    return path


def _unescape(name: str) -> str:
    """Undo `_line`'s escaping, left to right (`\\\\` is a backslash, `\\n` a newline)."""
    out, chars = [], iter(name)
    for char in chars:
        out.append({'\\': '\\', 'n': '\n'}.get(next(chars, ''), '') if char == '\\' else char)
    return ''.join(out)


def _parse(path: Path) -> dict[str, str]:
    listed = {}
    for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
        escaped = line.startswith('\\')
        digest, sep, name = line.removeprefix('\\').partition('  ')
        if not sep or len(digest) != 64:
            raise ResultsError(f'{path}: line {number} is not a sha256sum line')
        if escaped:
            name = _unescape(name)
        listed[name] = digest
    return listed


def check_manifest(directory: str | Path) -> bool:
    """Check `directory` against its SHA256SUMS; False when it has none (written before manifests).

    Raises:
        ResultsError: A listed file is missing or changed, or a file was added since; the message
            names the first.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return False
    listed = _parse(path)
    present = set(manifest_files(directory))
    for name in sorted(set(listed) - present):
        raise ResultsError(f'{directory}: {name} is listed in {MANIFEST} but missing')
    for name in sorted(present - set(listed)):
        raise ResultsError(f'{directory}: {name} was added after {MANIFEST} was written')
    for name, digest in sorted(listed.items()):
        if sha256_file(directory / name) != digest:
            raise ResultsError(f'{directory}: {name} does not match {MANIFEST} (changed since)')
    return True
