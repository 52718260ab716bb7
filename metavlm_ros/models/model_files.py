"""Finding a model on this machine without the network, its weights' hash, transformers imported offline."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError

__all__ = ['offline_transformers', 'resolve_model', 'weights_hash']

_DEMO_ROOT = Path(__file__).resolve().parent.parent / 'models'
_HF_ID = re.compile(r'^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$')


def offline_transformers() -> Any:
    """transformers, imported lazily and offline: importing its callers stays cheap and never goes online."""
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import transformers

    return transformers


def resolve_model(backend: str, model: str) -> str:
    """Find a model on this machine without touching the network.

    Args:
        backend: 'clip', 'blip' or 'instructblip'.
        model: a local directory, a Hugging Face id already in the local cache, or 'demo' for the demo
            model shipped inside the package.

    Returns:
        The model's local directory.

    Raises:
        ModelError: unknown backend, or a model that is not on disk (the message says how to fetch it).
    """
    from metavlm_ros.models.registry import backend_class  # the registry imports this module's users

    backend_class(backend)
    model = str(model).strip()
    if not model:
        raise ModelError('no model given; pass a local model directory, a Hugging Face id or demo')
    if model == 'demo':
        path = _DEMO_ROOT / f'demo-{backend}'
        if not (path / 'config.json').is_file():
            raise ModelError(f'demo model for {backend} is not built; run metavlm train-demo-models')
        return _checked_weights(str(path))
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f'model {model!r} is a file; pass the model directory (with config.json)')
        if not (path / 'config.json').is_file():
            raise ModelError(f'model directory {model!r} has no config.json; it is not a saved model')
        return _checked_weights(str(path.resolve()))
    if not _HF_ID.match(model):
        raise ModelError(f'model directory {model!r} does not exist')
    from huggingface_hub import constants, snapshot_download

    try:
        # local_files_only: a model that is not cached fails at once instead of waiting on the network.
        directory = snapshot_download(model, local_files_only=True)
    except Exception:  # noqa: BLE001 -- the hub raises several types for 'not cached'; all mean the same
        raise ModelError(
            f'model {model!r} is neither a local directory nor in the local Hugging Face cache '
            f'({constants.HF_HUB_CACHE}); on a connected machine run `hf download {model}` and copy '
            f'that cache here, or pass a local directory'
        ) from None
    return _checked_weights(directory)


def _checked_weights(model_dir: str) -> str:
    """`model_dir`, once the headers of its safetensors files read (a truncated or random file fails)."""
    from safetensors import safe_open

    for path in sorted(Path(model_dir).glob('*.safetensors')):
        try:
            with safe_open(str(path), framework='np'):
                pass
        except Exception as exc:  # noqa: BLE001 -- SafetensorError, OSError: all mean a damaged file
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f'{path}: damaged weights ({first})') from None
    return model_dir


def weights_hash(model_dir: str | Path, length: int = 12) -> str:
    """Short sha256 of a model's safetensors files (names and contents), to record model identity.

    Args:
        model_dir: the model directory.
        length: number of hex digits kept.

    Returns:
        The hex digest prefix; '' when the directory holds no safetensors file.
    """
    files = sorted(Path(model_dir).glob('*.safetensors'))
    if not files:
        return ''
    # A process reads one model's identity more than once (`metavlm run` checks the results directory
    # before its tester node configures; the node checks it again): files whose path, inode, size,
    # modification and change times are unchanged are not read again (as git's index tells changed
    # files, by their stat).
    key = tuple((str(p.resolve()), *_stat_key(p.stat())) for p in files)
    if key not in _WEIGHTS_SHA256:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode())
            with path.open('rb') as handle:
                for block in iter(lambda h=handle: h.read(1 << 22), b''):
                    digest.update(block)
        _WEIGHTS_SHA256[key] = digest.hexdigest()
    return _WEIGHTS_SHA256[key][:length]


#: weights_hash's digests by their files' path and _stat_key.
_WEIGHTS_SHA256: dict[tuple[tuple[Any, ...], ...], str] = {}


def _stat_key(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns
