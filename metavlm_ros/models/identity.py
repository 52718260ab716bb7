"""The identity record of a results directory (search.json): one shape for every command that searches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from metavlm_ros.common.record_format import SEARCH_SOURCE
from metavlm_ros.models.model_files import resolve_model, weights_hash
from metavlm_ros.models.registry import backend_class, resolve_options

if TYPE_CHECKING:
    from metavlm_ros.method.prediction import VLMBackend
    from metavlm_ros.method.search import SearchConfig

__all__ = [
    'SEARCH_SOURCE',
    'answered_model_identity',
    'handed_model_identity',
    'identity_record',
    'model_identity',
]


def model_identity(backend: str, model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies a model under test, read without loading it: backend, model, its resolved
    options, the sha256 of its weights and what the backend adds (architecture, chat template, ...).

    Raises:
        ModelError, ParameterError: as create_backend, before anything loads.
    """
    cls = backend_class(backend)
    resolved = resolve_options(backend, dict(options))
    directory = resolve_model(backend, model) if cls.local_model else None
    return {
        'backend': backend,
        'model': model,
        'weights_sha256': (weights_hash(directory, length=64) or None) if directory else None,
        'options': {o.name: resolved[o.name] for o in cls.all_options() if o.identity},
        **cls.describe(directory, resolved),
    }


def answered_model_identity(
    model_id: str | None,
    classes: Sequence[str],
    *,
    backend: str | None = None,
    weights: str | None = None,
) -> dict[str, Any]:
    """The model part for a model known only by what it says of itself: the perception node behind the
    tester's `ros` endpoint (it names its model in its answers, not its weights or options) or a model
    handed to the tester ready-made. The keys of `model_identity`; None where not known.

    Args:
        model_id: the model's name (None: not answered yet).
        classes: the classes it is asked about.
        backend: its backend's name, when it says.
        weights: the sha256 of its weights, when it says.
    """
    return {
        'backend': backend,
        'model': model_id,
        'weights_sha256': weights,
        'options': {'classes': list(classes)},
    }


def handed_model_identity(backend: VLMBackend) -> dict[str, Any]:
    """The model part for a model handed to a node ready-made (one model shared by nodes in one process,
    tests): what it says of itself, `answered_model_identity`'s keys."""
    return answered_model_identity(
        backend.model_id, backend.classes, backend=backend.name, weights=backend.weights_hash() or None
    )


def identity_record(
    config: SearchConfig, model: Mapping[str, Any], source: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What identifies the searches of a results directory (search.json, docs/results.md): one shape
    for `metavlm search`, the demo, the tester node and `metavlm run`.

    Args:
        config: the search settings; the `settings` part is `config.identity()`.
        model: the `model` part: `model_identity` (read before the model loads) or
            `answered_model_identity` (a model known by its answers).
        source: how the searched frames reach the model, where it differs from `SEARCH_SOURCE` (frames
            read and judged in process, as they are): the tester's endpoint, transport size, camera
            transport and report threshold.

    Raises:
        ValueError: a source field the record does not have.
    """
    given = dict(source or {})
    unknown = sorted(set(given) - set(SEARCH_SOURCE))
    if unknown:
        raise ValueError(f'unknown source fields {unknown} (the record has {sorted(SEARCH_SOURCE)})')
    return {
        'settings': config.identity(),
        'model': dict(model),
        'source': {**SEARCH_SOURCE, **given},
    }
