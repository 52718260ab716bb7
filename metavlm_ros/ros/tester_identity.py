"""The tester's identity record (search.json, docs/results.md) and its check against results_dir."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.results import (
    holds_results,
    identity_differences,
)
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.models.identity import (
    answered_model_identity,
    handed_model_identity,
    identity_record,
    model_identity,
)
from metavlm_ros.ros.tester_settings import TesterSettings

__all__ = [
    'check_identity',
    'tester_identity',
    'tester_model_identity',
    'tester_source',
]


def tester_source(settings: TesterSettings) -> dict[str, Any]:
    """The source part of the tester's identity: how its frames reach the model and what is published."""
    return {
        'endpoint': settings.endpoint,
        'transport_size': settings.transport_size,
        'image_transport': settings.image_transport,
        'report_threshold': settings.report_threshold,
    }


def tester_model_identity(settings: TesterSettings, backend: VLMBackend | None = None) -> dict[str, Any]:
    """The model part of the tester's identity, as far as it is known.

    Args:
        settings: the tester's settings.
        backend: for the `ros` endpoint, the probe backend (the model the perception node names once it
            has answered; None: not started); for `inprocess`, a model handed to the node ready-made
            (None: the model its parameters name, read before it loads, as `metavlm search` reads it).

    Raises:
        ModelError, ParameterError: the inprocess model its parameters name cannot be read.
    """
    model = settings.model
    if settings.endpoint == 'ros':
        # The whole record the perception node answers with (`PerceptionNode.identity`: what an
        # in-process run of its parameters records); an earlier node's answers name its model only.
        answered = getattr(backend, 'identity', None)
        if answered is not None:
            return dict(answered)
        named = (backend.model_id or None) if backend is not None else None
        return answered_model_identity(named, model['resolved']['classes'])
    if backend is not None:
        return handed_model_identity(backend)
    return model_identity(model['backend'], model['model'], model['options'])


def tester_identity(settings: TesterSettings, model: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies the tester's searches in its results directory (search.json, docs/results.md):
    the record of `metavlm search` (models/identity.py identity_record) with the tester's source part.

    Args:
        settings: the tester's settings.
        model: the model part (`tester_model_identity`).
    """
    return identity_record(settings.search, model, tester_source(settings))


def check_identity(settings: TesterSettings, model: Mapping[str, Any]) -> dict[str, Any]:
    """Check that the results directory holds no searches of another identity; returns the identity.

    A directory with results but no identity record (search.json) is refused too: its searches
    cannot be told apart from these. The model part is not compared while it is not known (its name
    None: the perception node has not answered yet); once it has, every part of it is, options included.

    Raises:
        ResultsError: one line naming `results_dir` and every difference.
    """
    identity = tester_identity(settings, model)
    unknown = ('model',) if model.get('model') is None else ()
    directory = Path(settings.results_dir)
    try:
        differences = identity_differences(directory, identity, ignore=unknown)
    except ResultsError as exc:  # a damaged record, or one of an earlier tester that says too little
        raise ResultsError(f'parameter results_dir: {exc}') from None
    if differences is None and holds_results(directory):
        raise ResultsError(
            f'parameter results_dir: {directory} holds results without an identity record (search.json), '
            'so they cannot be told apart from these searches; set results_dir to another directory'
        )
    if differences:
        raise ResultsError(
            f'parameter results_dir: {directory} holds searches of another identity '
            f'({"; ".join(differences)}); set results_dir to another directory, or those parameters back'
        )
    return identity
