"""A search's evaluations and result, their stored forms (docs/results.md), Pareto PNGs, console summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.answers import key_label
from metavlm_ros.method.relations import DEFAULT_RELATIONS

if TYPE_CHECKING:
    from metavlm_ros.method.encoding import Composition
    from metavlm_ros.method.prediction import Prediction

__all__ = [
    'Evaluation',
    'SearchResult',
    'detections_record',
    'evaluation_record',
    'followup_name',
    'pareto_png_members',
    'parse_pareto_pngs',
    'summarise_orders',
    'summary_record',
]


@dataclass
class Evaluation:
    """One judged genotype: its composition, objectives, follow-up prediction and violation flags."""

    index: int
    generation: int
    genotype: np.ndarray
    composition: Composition
    f_trans: float
    f_pred: float
    followup: Prediction | None
    violation: dict[str, bool]
    strength: dict[str, float | None]
    cached: bool = False
    failed: bool = False
    #: The follow-up pixels the model judged (the search's own warp), on the evaluation that paid for
    #: them, while `on_evaluation` and `on_generation` run; released after them, so a search holds
    #: no more than a batch.
    #: A caller that publishes or saves a follow-up takes it here instead of rendering it again.
    followup_frame: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: Detections: the follow-up's boxes matched to the source's moved by the warp (method/answers.py),
    #: in the searched frame's pixels; None for the other kinds of answer.
    boxes: dict | None = None
    #: The object insertion pasted (class and box, in the searched frame's pixels); None without one.
    inserted: dict | None = None


@dataclass
class SearchResult:
    """Everything one search produced; `pareto` indexes `evaluations`."""

    image: str
    algorithm: str
    seed: int
    source: Prediction
    evaluations: list[Evaluation]
    pareto: list[int]
    hypervolume: float
    seconds: float
    model_calls: int
    frames_judged: int
    stopped: bool = False
    warp: str = 'fused'
    working_size: int = 0
    source_size: tuple[int, int] = (0, 0)
    #: Width of the frame as searched (at the working size), in pixels; 0 when not known.
    working_width: int = 0
    relations: tuple[str, ...] = ()
    #: Why the source frame's answer could not be read (then nothing was searched); '' otherwise.
    source_error: str = ''
    #: (path relative to the results directory, sha256 of its pixels) of the stored source frame.
    source_frame: tuple[str, str] | None = None
    #: The range map the search used, as stored (relative path, sha256); None: none used or stored.
    source_ranges: tuple[str, str] | None = None
    pareto_pngs: int | None = None

    @property
    def violations_by_order(self) -> dict[str, dict[int, tuple[int, int]]]:
        """Per violation criterion: order -> (violations, evaluations), failed evaluations left out."""
        table: dict[str, dict[int, tuple[int, int]]] = {}
        for ev in self.evaluations:
            if ev.failed or ev.composition.order == 0:
                continue
            for key, flag in ev.violation.items():
                hits, total = table.setdefault(key, {}).get(ev.composition.order, (0, 0))
                table[key][ev.composition.order] = (hits + int(flag), total + 1)
        return table


def parse_pareto_pngs(value: object) -> int | None:
    """A Pareto PNG budget from any front end: a count >= 0, or 'all' (also None, -1) for every member.

    Raises:
        ParameterError: anything else, named.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == 'all'):
        return None
    try:
        count = int(value) if not isinstance(value, (bool, float)) else None
    except (TypeError, ValueError):
        count = None
    if count is None or count < -1:
        raise ParameterError(f"pareto PNGs must be a count (0: none) or 'all', got {value!r}")
    return None if count == -1 else count


def pareto_png_members(result: SearchResult, budget: int | None) -> list[int]:
    """Which of `result.pareto` (positions in it) get a follow-up PNG under a budget of `budget` PNGs.

    Members that repeat a composition share one PNG, so the budget counts distinct compositions.
    The smallest-f_trans violation (by any of the search's criteria; the smallest f_trans when no
    member violates) comes first, then the largest f_pred, then members spread evenly along the
    front (by rank, which follows f_trans). None: every member.
    """
    firsts: dict[tuple, int] = {}
    for position, i in enumerate(result.pareto):
        firsts.setdefault(result.evaluations[i].composition.key, position)
    distinct = sorted(firsts.values())
    if budget is None or budget >= len(distinct):
        return distinct
    if budget <= 0:
        return []
    evaluations = [result.evaluations[result.pareto[p]] for p in distinct]
    violating = [p for p, ev in zip(distinct, evaluations, strict=True) if any(ev.violation.values())]
    smallest = violating[0] if violating else distinct[0]
    largest = distinct[max(range(len(distinct)), key=lambda k: (evaluations[k].f_pred, -k))]
    chosen = list(dict.fromkeys([smallest, largest]))[:budget]
    rest = [p for p in distinct if p not in chosen]
    # Evenly spaced ranks over what is left: the front's shape, not one end of it.
    need = budget - len(chosen)
    if need > 0:
        picks = np.linspace(0, len(rest) - 1, need) if need > 1 else np.array([(len(rest) - 1) / 2])
        chosen += [rest[int(round(k))] for k in picks]
    return sorted(set(chosen))


def _safe(name: str) -> str:
    return ''.join(c if c.isalnum() or c in '-_.' else '_' for c in name)


def followup_name(image: str, algorithm: str, seed: int, index: int) -> str:
    """The file stem of an evaluation's follow-up PNG, as the search and `metavlm render` write it."""
    return f'{_safe(image)}_{algorithm}_s{seed}_e{index:05d}'


def evaluation_record(ev: Evaluation, result: SearchResult, extra: dict | None = None) -> dict:
    """The stored form of one evaluation (docs/results.md), with `extra` fields first."""
    return {
        **(extra or {}),
        'image': result.image,
        'algorithm': result.algorithm,
        'seed': result.seed,
        'working_size': result.working_size,
        'index': ev.index,
        'generation': ev.generation,
        'genotype': [round(float(v), 9) for v in ev.genotype],
        'composition': ev.composition.label,
        'order': ev.composition.order,
        'parameters': ev.composition.parameters,
        'f_trans': ev.f_trans,
        'f_pred': ev.f_pred,
        'kind': result.source.kind,
        'source': result.source.values,
        'followup': None if ev.followup is None or ev.followup.error else ev.followup.values,
        'source_text': result.source.text,
        'followup_text': None if ev.followup is None else ev.followup.text,
        'violation': ev.violation,
        'strength': ev.strength,
        'cached': ev.cached,
        'failed': ev.failed,
        # Only a parse failure has it: records of searches without one stay as they were.
        **({'parse_error': ev.followup.error} if ev.followup is not None and ev.followup.error else {}),
        **({'request': ev.followup.evidence} if ev.followup is not None and ev.followup.evidence else {}),
        **_detection_fields(ev, result),
        **_inserted_field(ev, result),
    }


def _to_source_pixels(result: SearchResult) -> float:
    """How many source-frame pixels one pixel of the searched (working size) frame is."""
    width = result.source_size[0]
    return width / result.working_width if width and result.working_width else 1.0


def _scaled(box: Sequence[float], scale: float) -> list[float]:
    return [round(float(v) * scale, 3) for v in box]


def detections_record(prediction: Prediction | None, scale: float = 1.0) -> list[dict] | None:
    """A prediction's detections as records (class, score, box in source-frame pixels at `scale`)."""
    if prediction is None or prediction.error:
        return None
    return [{**d.as_record(), 'box': _scaled(d.box, scale)} for d in prediction.detections]


def _detection_fields(ev: Evaluation, result: SearchResult) -> dict:
    """Detections only (docs/results.md): the follow-up's objects, and how they matched the source's
    moved by the warp (`boxes`: expected boxes, and lost, new, reclassed, displaced and matched objects
    by their indices in the source's and the follow-up's lists); boxes in source-frame pixels."""
    if result.source.kind != 'detection':
        return {}
    scale = _to_source_pixels(result)
    boxes = None
    if ev.boxes is not None:
        expected = [
            {**e, 'box': _scaled(e['box'], scale), 'inner': _scaled(e['inner'], scale)}
            for e in ev.boxes['expected']
        ]
        boxes = {**ev.boxes, 'expected': expected}
    return {'followup_detections': detections_record(ev.followup, scale), 'boxes': boxes}


def _inserted_field(ev: Evaluation, result: SearchResult) -> dict:
    """`inserted` (class and box in source-frame pixels) where object insertion pasted one (§13): absent
    otherwise, so records of searches without insertion stay as they were."""
    if ev.inserted is None:
        return {}
    box = ev.inserted['box']
    scaled = None if box is None else _scaled(box, _to_source_pixels(result))
    return {'inserted': {**ev.inserted, 'box': scaled}}


def _relations_field(result: SearchResult) -> dict:
    """`relations` when the search used other than the paper's six: a paper search's summary stays
    byte for byte what it was before there were other relations (readers take absence as the six)."""
    relations = list(result.relations)
    return {} if relations == list(DEFAULT_RELATIONS) else {'relations': relations}


def _parse_failures_field(result: SearchResult) -> dict:
    """`parse_failures` (failed evaluations whose answer did not parse) when there were any; absent is 0."""
    count = sum(ev.followup is not None and bool(ev.followup.error) for ev in result.evaluations)
    return {'parse_failures': count} if count else {}


def summary_record(result: SearchResult, backend: Any = None, extra: dict | None = None) -> dict:
    """The one-line summary of a search, as stored in summary.jsonl."""
    return {
        **(extra or {}),
        'image': result.image,
        'algorithm': result.algorithm,
        'seed': result.seed,
        'model': getattr(backend, 'model_id', None),
        'backend': getattr(backend, 'name', None),
        'working_size': result.working_size,
        'source_size': list(result.source_size),
        'kind': result.source.kind,
        'source': result.source.values,
        'source_text': result.source.text,
        **(
            {'source_detections': detections_record(result.source, _to_source_pixels(result))}
            if result.source.kind == 'detection'
            else {}
        ),
        'warp': result.warp,
        **_relations_field(result),
        'evaluations': len(result.evaluations),
        'failed': sum(ev.failed for ev in result.evaluations),
        **_parse_failures_field(result),
        **({'source_error': result.source_error} if result.source_error else {}),
        'model_calls': result.model_calls,
        'frames_judged': result.frames_judged,
        'hypervolume': result.hypervolume,
        'pareto': [result.evaluations[i].index for i in result.pareto],
        'violations_by_order': {
            key: {str(order): list(counts) for order, counts in sorted(table.items())}
            for key, table in result.violations_by_order.items()
        },
        'seconds': result.seconds,
        'stopped': result.stopped,
        **_source_fields(result),
    }


def _source_fields(result: SearchResult) -> dict:
    """`source_frame` and `source_sha256` when the source frame was stored (no store: no field), and
    `source_ranges` and `source_ranges_sha256` when the search used a range map and stored it."""
    fields = {}
    if result.source_frame is not None:
        path, digest = result.source_frame
        fields.update(source_frame=path, source_sha256=digest)
    if result.source_ranges is not None:
        path, digest = result.source_ranges
        fields.update(source_ranges=path, source_ranges_sha256=digest)
    return fields


def summarise_orders(result: SearchResult, keys: Sequence[str] | None = None) -> list[str]:
    """Human-readable lines: violations by order for each criterion."""
    lines = []
    for key, table in result.violations_by_order.items():
        if keys is not None and key not in keys:
            continue
        label = key_label(key)
        cells = ', '.join(f'{o}: {h}/{t}' for o, (h, t) in sorted(table.items()))
        lines.append(f'  violations by order ({label}): {cells or "none evaluated"}')
    return lines
