"""Loading a VLM behind the VLMBackend interface: `create_backend` and model identity, from the registry."""

from __future__ import annotations

from typing import Any

from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.models.identity import answered_model_identity, identity_record, model_identity
from metavlm_ros.models.model_files import resolve_model, weights_hash
from metavlm_ros.models.options import DEFAULT_BATCH_SIZE, DTYPES, MAX_BATCH_SIZE
from metavlm_ros.models.pixel_path import PREPROCESS, PixelPath
from metavlm_ros.models.questions import (
    DEFAULT_CLASS_PROMPTS,
    PAPER_CLASS_PROMPTS,
    PROMPT_PRESETS,
    TABLE1_PROMPT,
)
from metavlm_ros.models.registry import BACKENDS, backend_class, resolve_options

__all__ = [
    'BACKENDS',
    'DEFAULT_BATCH_SIZE',
    'DEFAULT_CLASS_PROMPTS',
    'DTYPES',
    'MAX_BATCH_SIZE',
    'PAPER_CLASS_PROMPTS',
    'PREPROCESS',
    'PROMPT_PRESETS',
    'PixelPath',
    'TABLE1_PROMPT',
    'answered_model_identity',
    'create_backend',
    'identity_record',
    'model_identity',
    'resolve_model',
    'weights_hash',
]


def create_backend(backend: str, model: str, **options: Any) -> VLMBackend:
    """Load a VLM behind the VLMBackend interface.

    Args:
        backend: a registered name (models/registry.py BACKENDS: 'clip', 'siglip', 'blip',
            'instructblip', 'vlm', ...).
        model: a local directory, a Hugging Face id in the local cache, or 'demo' (for a served backend,
            the server's model id).
        **options: the backend's options (its declaration: `backend_class(backend).all_options()`);
            None means 'not given' (the declared default).

    Returns:
        The loaded backend.

    Raises:
        ModelError: unknown backend, model not on disk, or not loadable.
        ParameterError: an option the backend does not take, or a value it refuses.
    """
    resolved = resolve_options(backend, options)
    return backend_class(backend)(model, **resolved)
