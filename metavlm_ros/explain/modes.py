"""The catalogue of one or more results roots: evidence read, settings checked, modes learnt, mapped."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from metavlm_ros.assurance.evidence import Evidence, load_evidence
from metavlm_ros.common.errors import InputError, ParameterError, ResultsError
from metavlm_ros.common.range_maps import read_source_ranges
from metavlm_ros.common.results import read_source_frame
from metavlm_ros.explain.attribution import (
    INTEGRATED_GRADIENTS,
    METHODS,
    MIN_CELLS,
    OCCLUSION,
    ExampleMaps,
    Maps,
    MapSettings,
    class_index,
    gradient_map,
    occlusion_map,
    pixel_scorer,
)
from metavlm_ros.explain.catalogue import DEFAULT_THRESHOLD, Catalogue, CatalogueSettings, build_catalogue
from metavlm_ros.explain.features import FeatureTable, feature_table
from metavlm_ros.method.prediction import VLMBackend
from metavlm_ros.method.render import find_search, render_followup, search_evaluations

__all__ = [
    'attribute_modes',
    'catalogue_of',
    'example_frames',
    'learn',
    'load_all',
    'map_settings_for',
    'settings_for',
]


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


def learn(
    evidence: Sequence[Evidence], settings: CatalogueSettings | None = None
) -> tuple[Catalogue, FeatureTable] | None:
    """The failure modes of `evidence` and the table they were learnt from; None when no evaluation can
    be learnt from (all failed, identities, or records without parameters).

    With no threshold set, confidence changes are judged at the largest threshold the records were
    judged at (the strictest reading of a violation they hold).
    """
    settings = settings or CatalogueSettings()
    if settings.threshold is None:
        settings = dataclasses.replace(settings, threshold=_largest_threshold(evidence) or DEFAULT_THRESHOLD)
    table = feature_table([run for e in evidence for run in e.runs])
    if not len(table.records):
        return None
    return build_catalogue(table, settings), table


def catalogue_of(roots: Sequence[str | Path], settings: CatalogueSettings | None = None) -> Catalogue:
    """Read every results directory under `roots` and learn their failure modes (`learn`).

    Raises:
        InputError: A root holds no results, the roots hold answers of different kinds, or no
            evaluation can be learnt from.
        ResultsError: A record file is damaged before its end.
    """
    learnt = learn(load_all(roots), settings)
    if learnt is None:
        raise InputError(
            f'{", ".join(map(str, roots))}: no evaluation to learn from (all failed, or identities)'
        )
    return learnt[0]


def map_settings_for(*, method: str, steps: int, budget: int) -> MapSettings:
    """MapSettings from a command's options, each checked.

    Raises:
        ParameterError: A method not in METHODS, or fewer than 1 step or frame of budget, naming it.
    """
    if method not in METHODS:
        raise ParameterError(f'--map-method must be one of {", ".join(METHODS)}, got {method!r}')
    for name, value in (('steps', steps), ('budget', budget)):
        if not value >= 1:
            raise ParameterError(f'--map-{name} must be at least 1, got {value}')
    return MapSettings(method=method, steps=steps, budget=budget)


def example_frames(example: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    """A mode's example as its search saw it: the search's summary, the source frame, the follow-up.

    The follow-up is made again from the stored source frame, as `metavlm render` makes it.

    Raises:
        ResultsError: The search, its stored source frame or the evaluation is not there.
        ParameterError: The evaluation's parameters cannot be rendered.
    """
    directory, index = example['directory'], example['index']
    summary = find_search(
        directory, image=example['image'], algorithm=example['algorithm'], seed=example['seed']
    )
    source = read_source_frame(directory, summary)
    ranges = read_source_ranges(directory, summary)
    record = search_evaluations(directory, summary, [index])[index]
    return summary, source, render_followup(source, record, summary.get('warp', 'fused'), ranges)


def _method(backend: VLMBackend, asked: str) -> str:
    gradients = pixel_scorer(backend) is not None
    if asked == 'gradients' and not gradients:
        raise ParameterError(
            f'--map-method gradients: backend {backend.name} gives no gradients here (a served model, or '
            'an image processor without a differentiable path); use occlusion'
        )
    return INTEGRATED_GRADIENTS if asked != 'occlusion' and gradients else OCCLUSION


def attribute_modes(catalogue: Catalogue, backend: VLMBackend, settings: MapSettings) -> Maps:
    """The attribution maps of each mode's smallest example, for the class whose answer changed.

    Every mode with an example gets a map on its source frame and one on its follow-up (made again
    from the stored source), by integrated gradients where the backend has gradients here and
    occlusion elsewhere (`settings.method`). Occlusion shares `settings.budget` evenly between the
    maps. A mode whose example cannot be made again (its source frame not stored) has no map; the
    notes say why.

    Raises:
        ParameterError: A method the backend cannot take, a mode's class the model does not judge,
            or a budget too small for a 2 x 2 grid a map.
    """
    method = _method(backend, settings.method)
    modes = [(rank, m) for rank, m in enumerate(catalogue.modes, start=1) if m.example is not None]
    for _, mode in modes:
        class_index(backend, mode.change.cls)
    per_map = settings.budget // max(2 * len(modes), 1)
    if method == OCCLUSION and modes and per_map < MIN_CELLS + 1:
        raise ParameterError(
            f'--map-budget {settings.budget}: {2 * len(modes)} occlusion maps need at least '
            f'{2 * len(modes) * (MIN_CELLS + 1)} frames judged ({MIN_CELLS + 1} a map: a 2 x 2 grid and '
            'the frame itself)'
        )
    maps = Maps(settings, method, backend.name, str(backend.model_id), {})
    for rank, mode in modes:
        try:
            summary, source, followup = example_frames(mode.example)
        except (InputError, ParameterError, ResultsError) as exc:
            maps.notes.append(f'mode {rank}: no attribution map: {exc}')
            continue
        if summary.get('backend') not in (None, backend.name):
            maps.notes.append(
                f'mode {rank}: the evidence is of backend {summary.get("backend")} '
                f'({summary.get("model")}), its maps of {backend.name} ({backend.model_id})'
            )
        cls = mode.change.cls
        if method == INTEGRATED_GRADIENTS:
            made = [gradient_map(backend, frame, cls, settings.steps) for frame in (source, followup)]
        else:
            made = [occlusion_map(backend, frame, cls, per_map) for frame in (source, followup)]
        maps.by_rank[rank] = ExampleMaps(mode.example, source, followup, *made)
    return maps
