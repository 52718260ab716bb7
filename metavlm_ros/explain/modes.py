"""The catalogue of one or more results roots: evidence read, settings checked, modes learnt."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from metavlm_ros.assurance.evidence import Evidence, load_evidence
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.explain.catalogue import DEFAULT_THRESHOLD, Catalogue, CatalogueSettings, build_catalogue
from metavlm_ros.explain.features import feature_table

__all__ = ['catalogue_of', 'load_all', 'settings_for']


def load_all(roots: Sequence[str | Path]) -> list[Evidence]:
    """The evidence under each root, read strictly; one kind of answer across all of them.

    Raises:
        InputError: A root holds no results, or the roots hold answers of different kinds.
        ResultsError: A record file is damaged before its end.
    """
    evidence = [load_evidence(root) for root in roots]
    kinds = {e.root: e.kind for e in evidence}
    if len(set(kinds.values())) > 1:
        shown = ', '.join(f'{root} {kind}' for root, kind in kinds.items())
        raise InputError(f'results of different kinds of answer ({shown}): explain one model at a time')
    return evidence


def _largest_threshold(evidence: Sequence[Evidence]) -> float:
    keys = [float(k) for e in evidence for k in e.keys if k.replace('.', '', 1).isdigit()]
    return max(keys, default=0.0)


def settings_for(*, threshold: float | None = None, **chosen: float) -> CatalogueSettings:
    """CatalogueSettings from a command's options, each checked (threshold: the roots' largest by default).

    Raises:
        ParameterError: A setting outside its range, naming it.
    """
    limits = {'max_modes': 1, 'depth': 1, 'min_violations': 1, 'min_lift': 1}
    for name, low in limits.items():
        if name in chosen and not chosen[name] >= low:
            raise ParameterError(f'--{name.replace("_", "-")} must be at least {low}, got {chosen[name]}')
    if threshold is not None and not 0 < threshold <= 1:
        raise ParameterError(f'--threshold must lie in (0, 1], got {threshold}')
    return CatalogueSettings(threshold=threshold, **chosen)


def catalogue_of(roots: Sequence[str | Path], settings: CatalogueSettings | None = None) -> Catalogue:
    """Read every results directory under `roots` and learn their failure modes.

    With no threshold set, confidence changes are judged at the largest threshold the records were
    judged at (the strictest reading of a violation they hold).
    """
    evidence = load_all(roots)
    settings = settings or CatalogueSettings()
    if settings.threshold is None:
        settings = dataclasses.replace(settings, threshold=_largest_threshold(evidence) or DEFAULT_THRESHOLD)
    table = feature_table([run for e in evidence for run in e.runs])
    if not len(table.records):
        raise InputError(
            f'{", ".join(map(str, roots))}: no evaluation to learn from (all failed, or identities)'
        )
    return build_catalogue(table, settings)
