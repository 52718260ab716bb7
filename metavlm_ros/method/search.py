"""The search (docs/method.md §7): one ask/tell loop that judges compositions of a frame."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
from pymoo.core.evaluator import Evaluator
from pymoo.core.population import Population
from pymoo.core.problem import Problem
from pymoo.problems.static import StaticProblem

from metavlm_ros.common.errors import InputError, ModelError, ParameterError, SearchInterrupted
from metavlm_ros.common.images import check_frame, parse_working_size, resize_longer_side, working_size_for
from metavlm_ros.common.range_maps import quantise_ranges
from metavlm_ros.method import defaults
from metavlm_ros.method.answers import Thresholds, answer_for
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.encoding import Composition, SearchSpace, decode
from metavlm_ros.method.insertion_oracle import check_insertable, inserted_in, inserted_record
from metavlm_ros.method.metrics import (
    DEFAULT_THRESHOLDS,
    hypervolume,
    non_dominated,
)
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.relations import WARPS, apply_composition
from metavlm_ros.method.water_ranges import WATER_RANGES, check_ranges

if TYPE_CHECKING:
    from metavlm_ros.common.results import ResultsStore
    from metavlm_ros.method.prediction import Prediction, VLMBackend
from metavlm_ros.method.algorithms import (
    ALGORITHM_FACTORIES,
    ALGORITHMS,
    ENVELOPE,
    RandSampling,
    rand_genotypes,
)
from metavlm_ros.method.envelope import EnvelopeSearch
from metavlm_ros.method.records import (
    Evaluation,
    SearchResult,
    evaluation_record,
    followup_name,
    pareto_png_members,
    parse_pareto_pngs,
    summarise_orders,
    summary_record,
)

# The optimisers and the stored forms live beside the loop; `metavlm_ros.method.search` stays the one
# import of the search's public names for callers (commands, nodes, campaigns, bench/, the tests).
__all__ = [
    'ALGORITHMS',
    'Evaluation',
    'PreparedFrame',
    'SearchConfig',
    'RandSampling',
    'SearchResult',
    'evaluation_record',
    'followup_name',
    'parse_pareto_pngs',
    'pareto_png_members',
    'prepare_frame',
    'rand_genotypes',
    'run_search',
    'searched_frame',
    'summarise_orders',
    'summary_record',
]


@dataclass
class SearchConfig:
    """What one search does; `validate()` raises ParameterError naming the first bad value."""

    algorithm: str = defaults.ALGORITHM
    population: int = defaults.POPULATION
    evaluations: int = defaults.EVALUATIONS
    seed: int = defaults.SEED
    space: SearchSpace = field(default_factory=SearchSpace.default)
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    warp: str = 'fused'
    #: Longer side the relations act at: 'auto' (2x the model's input side), pixels, or None (full).
    working_size: int | str | None = None
    #: Follow-up PNGs written for the non-dominated set: K members spread along the front, None: all.
    #: Not part of the identity: it changes which PNGs exist, never a record.
    pareto_pngs: int | None = defaults.PARETO_PNGS
    #: Detections: a matched box below this IoU is displaced, a violation (docs/method.md §13).
    iou_threshold: float = DEFAULT_IOU_THRESHOLD
    #: Detections with object insertion: the pasted object must be found too (§13's strict option).
    find_inserted: bool = False
    #: Where MR12 `water` takes each pixel's range to the scene: 'prior' (its extras: constant or a
    #: seabed plane) or 'truth' (the frame's range map, which the footage must carry; docs/underwater.md).
    water_ranges: str = 'prior'

    @property
    def criteria(self) -> Thresholds:
        """What a follow-up is judged by (method/answers.py)."""
        return Thresholds(tuple(self.thresholds), float(self.iou_threshold), bool(self.find_inserted))

    def validate(self) -> SearchConfig:
        if self.algorithm not in ALGORITHMS:
            raise ParameterError(
                f'unknown algorithm {self.algorithm!r} (choose from {", ".join(ALGORITHMS)})'
            )
        if int(self.population) < 2:
            raise ParameterError(f'population must be at least 2, got {self.population}')
        if int(self.evaluations) < 1:
            raise ParameterError(f'evaluations must be a positive budget, got {self.evaluations}')
        if not self.thresholds or any(not 0 < t < 1 for t in self.thresholds):
            raise ParameterError(f'thresholds must lie in (0, 1), got {list(self.thresholds)}')
        if not 0 < self.iou_threshold <= 1:
            raise ParameterError(f'the IoU threshold must lie in (0, 1], got {self.iou_threshold}')
        if not isinstance(self.find_inserted, bool):
            raise ParameterError(f'find_inserted must be true or false, got {self.find_inserted!r}')
        if self.water_ranges not in WATER_RANGES:
            raise ParameterError(
                f'unknown water ranges {self.water_ranges!r} (choose from {", ".join(WATER_RANGES)})'
            )
        if self.water_ranges == 'truth' and 'water' not in self.space.enabled_ids:
            raise ParameterError("water ranges 'truth' are for the relation water; the search leaves it out")
        if self.warp not in WARPS:
            raise ParameterError(f'unknown warp {self.warp!r} (choose from {", ".join(WARPS)})')
        self.working_size = parse_working_size(self.working_size)
        self.pareto_pngs = parse_pareto_pngs(self.pareto_pngs)
        return self

    def identity(self) -> dict:
        """The settings part of a results directory's identity record (search.json, docs/results.md)."""
        space = self.space
        return {
            'algorithm': self.algorithm,
            'population': self.population,
            'evaluations': self.evaluations,
            'seed': self.seed,
            'relations': space.as_record(),
            'thresholds': list(self.thresholds),
            'working_size': self.working_size,
            # Only where it is not the default: the identity of every other search stays as it was.
            **({'iou_threshold': self.iou_threshold} if self.iou_threshold != DEFAULT_IOU_THRESHOLD else {}),
            **({'find_inserted': True} if self.find_inserted else {}),
            **({'water_ranges': self.water_ranges} if self.water_ranges != 'prior' else {}),
        }


@dataclass(frozen=True)
class PreparedFrame:
    """A frame checked once and brought to the search's working size once: what `run_search` searches."""

    rgb: np.ndarray
    #: (width, height) of the frame as it entered, before the working size.
    source_size: tuple[int, int]
    #: The frame's range to the scene per pixel at the working size, metres, where the search uses it.
    ranges: np.ndarray | None = None


def _needed_ranges(ranges: np.ndarray | None) -> np.ndarray:
    if ranges is None:
        raise InputError("the frame has no range map, which water ranges 'truth' need (docs/underwater.md)")
    return ranges


def prepare_frame(
    frame: Any, config: SearchConfig, input_side: int = 0, ranges: np.ndarray | None = None
) -> PreparedFrame:
    """Check `frame` and shrink it to the working size for a model that sees `input_side` pixels;
    `ranges`, the frame's range map, goes along (nearest neighbour) where the config uses it.

    Raises:
        InputError: not RGB uint8 (H, W, 3), or under 2 pixels a side (relations interpolate); a
            search of water ranges 'truth' without a range map, or one of another size than the frame.
    """
    frame = check_frame(frame, min_side=2, what='the frame')
    height, width = frame.shape[:2]
    size = working_size_for(config.working_size, width, height, input_side)
    rgb = np.ascontiguousarray(resize_longer_side(frame, size)) if size else frame
    if config.water_ranges != 'truth':
        return PreparedFrame(rgb, (int(width), int(height)))
    ranges = _needed_ranges(ranges)
    ranges = quantise_ranges(check_ranges(ranges, frame))  # as stored with the results: renders again
    if rgb.shape != frame.shape:
        ranges = cv2.resize(ranges, (rgb.shape[1], rgb.shape[0]), interpolation=cv2.INTER_NEAREST)
    return PreparedFrame(rgb, (int(width), int(height)), ranges)


def searched_frame(frame: Any, config: SearchConfig, backend: VLMBackend) -> np.ndarray:
    """The frame as the search sees it: validated and shrunk to the working size for `backend`."""
    return prepare_frame(frame, config, getattr(backend, 'input_size', 0)).rgb


class _Judge:
    """Judges batches of genotypes on one frame against its source prediction, with a cache."""

    def __init__(
        self,
        frame: np.ndarray,
        backend: VLMBackend,
        source: Prediction,
        config: SearchConfig,
        ranges: np.ndarray | None = None,
    ):
        self.frame = frame
        self.ranges = ranges
        self.backend = backend
        self.source = source
        self.config = config
        self.answer = answer_for(source.kind)
        self.criteria = config.criteria
        self.size = (int(frame.shape[1]), int(frame.shape[0]))
        if not source.error:
            check_insertable(config.space, source.values)
        self.cache: dict[tuple, Prediction] = {}
        self.model_calls = 0
        self.frames_judged = 0

    def judge(self, genotypes: np.ndarray, generation: int, first_index: int) -> list[Evaluation]:
        compositions = [decode(x, self.config.space) for x in genotypes]
        # One model call per generation, for the compositions this frame has not seen yet.
        pending: dict[tuple, Composition] = {}
        for comp in compositions:
            if comp.order > 0 and comp.key not in self.cache:
                pending.setdefault(comp.key, comp)
        fresh: dict[tuple, Prediction | None] = {}
        rendered: dict[tuple, np.ndarray] = {}
        if pending:
            rendered = {key: self.followup_frame(comp) for key, comp in pending.items()}
            followups = list(rendered.values())
            predictions = self.backend.predict(followups)
            self.model_calls += 1
            self.frames_judged += len(followups)
            fresh = dict(zip(pending, predictions, strict=True))
            # A failed prediction (None) is not cached: a later generation may ask again.
            self.cache.update({k: p for k, p in fresh.items() if p is not None})

        evaluations = []
        for offset, (x, comp) in enumerate(zip(genotypes, compositions, strict=True)):
            # Only the first evaluation of a composition sent in this call paid for it.
            cached = comp.key not in fresh or comp.key not in pending
            pending.pop(comp.key, None)
            followup = self.source if comp.order == 0 else fresh.get(comp.key, self.cache.get(comp.key))
            # A parse failure (an answer that does not read as counts) is a failed evaluation, never zero.
            failed = followup is None or bool(followup.error)
            if failed or comp.order == 0:
                # Order 0 is the identity and never a violation (docs/method.md §2).
                judged = self.answer.unchanged(self.criteria)
            else:
                judged = self.answer.judge(self.source, followup, self.criteria, comp, self.size)
            evaluations.append(
                Evaluation(
                    index=first_index + offset,
                    generation=generation,
                    genotype=np.asarray(x, dtype=float),
                    composition=comp,
                    f_trans=f_trans(comp),
                    f_pred=judged.f_pred,
                    followup=followup,
                    violation=judged.violation,
                    strength=judged.strength,
                    cached=cached and comp.order > 0 and not failed,
                    failed=failed,
                    followup_frame=None if cached else rendered.get(comp.key),
                    boxes=judged.boxes,
                    inserted=inserted_record(inserted_in(comp, *self.size)),
                )
            )
        return evaluations

    def followup_frame(self, composition: Composition) -> np.ndarray:
        """The follow-up frame of a composition, warped as the search's configuration says."""
        fuse = self.config.warp == 'fused'
        return apply_composition(self.frame, composition, fuse=fuse, ranges=self.ranges)


class _CompositionProblem(Problem):
    """The two-objective problem over the genotype of a search space; pymoo minimises (f_trans, -f_pred)."""

    def __init__(self, xl: np.ndarray, xu: np.ndarray):
        super().__init__(n_var=len(xl), n_obj=2, xl=xl, xu=xu)


def _bounds(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    xl, xu = space.bounds()
    xl, xu = np.asarray(xl, float), np.asarray(xu, float)
    # pymoo's operators divide by (xu - xl): keep every interval open, decode() clips anyway.
    return xl, np.maximum(xu, xl + 1e-9)


def run_search(
    frame: np.ndarray | PreparedFrame,
    backend: VLMBackend,
    config: SearchConfig,
    *,
    image_id: str = 'frame',
    store: ResultsStore | None = None,
    progress: Callable[[int], None] | None = None,
    on_evaluation: Callable[[Evaluation, SearchResult], None] | None = None,
    on_generation: Callable[[list[Evaluation], SearchResult], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    extra_fields: dict | None = None,
    source: Prediction | None = None,
    summary_fields: dict | None = None,
) -> SearchResult:
    """Search one frame for the smallest compositions that change the model's answer.

    Args:
        frame: the source frame, RGB uint8, or a `PreparedFrame` (checked and at its working size
            already: searched as it is).
        backend: the VLM; `predict` is called once for the source and once per generation; it may raise
            SearchInterrupted to end the search (the generation in progress is dropped, the rest finished).
        config: algorithm, budget, seed, search space, thresholds, working size.
        image_id: the name recorded with every evaluation.
        store: where evaluations, the non-dominated set and the summary are appended (flushed).
        progress: called with the number of evaluations finished since the last call.
        on_evaluation: called for every evaluation after it is stored; the evaluation that paid for a
            follow-up carries its judged pixels (`followup_frame`) during the call only.
        on_generation: called with each generation's evaluations once their records are on disk
            (flushed), their judged pixels still attached: what a caller publishes of them is
            evidence already.
        should_stop: polled between generations; True ends the search early (result.stopped).
        extra_fields: added to every stored record (e.g. model, run, source stamp).
        summary_fields: added to the search's summary record only (e.g. the source's accuracy).
        source: the source prediction when the caller already has it (never recomputed here); it must
            be the prediction of the frame as searched: `prepare_frame(frame, config, ...).rgb`.

    Returns:
        The evaluations, the non-dominated set and its hypervolume.
    """
    config.validate()
    if not isinstance(frame, PreparedFrame):
        frame = prepare_frame(frame, config, getattr(backend, 'input_size', 0))
    source_size, frame, ranges = frame.source_size, frame.rgb, frame.ranges
    if config.water_ranges == 'truth':
        _needed_ranges(ranges)
    started = time.perf_counter()
    if source is None:
        source = backend.predict([frame])[0]
        if source is None:
            raise ModelError('the model gave no prediction for the source frame')
    judge = _Judge(frame, backend, source, config, ranges if config.water_ranges == 'truth' else None)
    # Stored first, once per distinct frame: every follow-up can be rendered again from it.
    stored_source = store.save_source(frame) if store is not None else None
    stored_ranges = store.save_source_ranges(judge.ranges) if store and judge.ranges is not None else None
    result = SearchResult(
        image=image_id,
        algorithm=config.algorithm,
        seed=config.seed,
        source=source,
        evaluations=[],
        pareto=[],
        hypervolume=0.0,
        seconds=0.0,
        model_calls=1,
        frames_judged=1,
        warp=config.warp,
        working_size=max(frame.shape[:2]),
        source_size=source_size,
        working_width=int(frame.shape[1]),
        relations=config.space.enabled_ids,
        source_frame=stored_source,
        source_ranges=stored_ranges,
        pareto_pngs=config.pareto_pngs,
    )
    extra = dict(extra_fields or {})

    def record(batch: list[Evaluation]) -> None:
        for ev in batch:
            result.evaluations.append(ev)
            if store is not None:
                store.append_evaluation(evaluation_record(ev, result, extra))
            if on_evaluation is not None:
                on_evaluation(ev, result)
        if store is not None:
            store.flush()  # one member a generation: a killed search keeps every generation it finished
        if on_generation is not None:
            on_generation(batch, result)
        for ev in batch:
            ev.followup_frame = None  # judged and handed over: a search holds no frame beyond its batch
        if progress is not None:
            progress(len(batch))

    xl, xu = _bounds(config.space)
    try:
        if source.error:
            # Without the source's answer there is nothing to compare follow-ups with: the frame is
            # done, its summary says why (source_error), and no evaluation is spent on it.
            result.source_error = source.error
        elif config.algorithm == ENVELOPE:
            _drive_envelope(judge, config, record, should_stop, result)
        else:
            _drive(judge, config, xl, xu, record, should_stop, result)
    except SearchInterrupted:
        # The caller cut the generation in progress short: it is not recorded, the rest is finished.
        result.stopped = True

    _finish(result, judge, backend, store, extra, started, summary_fields or {})
    return result


def _drive(judge, config, xl, xu, record, should_stop, result) -> None:
    """Run any pymoo algorithm by ask/tell on the composition problem, with an exact budget."""
    problem = _CompositionProblem(xl, xu)
    algorithm = ALGORITHM_FACTORIES[config.algorithm](config)
    algorithm.setup(problem, termination=('n_eval', config.evaluations), seed=config.seed, verbose=False)
    done, generation = 0, 0
    while done < config.evaluations:
        if should_stop is not None and should_stop():
            result.stopped = True
            return
        offspring = algorithm.ask()
        if offspring is None or len(offspring) == 0:
            break
        last = len(offspring) >= config.evaluations - done
        if len(offspring) > config.evaluations - done:
            # The budget is exact: the last generation is cut to what is left.
            offspring = Population.create(*offspring[: config.evaluations - done])
        batch = judge.judge(offspring.get('X'), generation, done)
        objectives = np.array([[ev.f_trans, -ev.f_pred] for ev in batch], dtype=float)
        # pymoo's ask/tell pattern: the objectives are already known, a StaticProblem hands them over.
        Evaluator().eval(StaticProblem(problem, F=objectives), offspring)
        # A failed evaluation reaches the algorithm as f_pred 0; a surrogate (mobo) reads this to
        # keep it out of what it learns from (no change and no answer are not the same).
        offspring.set('failed', np.array([ev.failed for ev in batch], dtype=bool))
        if not last:
            # Nothing asks after the last generation; MOEA/D could not take a cut one anyway.
            algorithm.tell(infills=offspring)
        record(batch)
        done += len(batch)
        generation += 1


def _drive_envelope(judge, config, record, should_stop, result) -> None:
    """Run the boundary search of method/envelope.py with an exact budget: each round's magnitudes
    judged in generations of `population` (one model call each, as every search), the round told
    once all are judged, the last cut to what is left."""
    search = EnvelopeSearch(config.space)
    # Refined on the most demanding criterion: a count change, the smallest threshold, the IoU's.
    key = judge.answer.refining_key(judge.criteria)
    done, generation = 0, 0
    while done < config.evaluations and not search.done:
        genotypes = search.ask(config.evaluations - done)
        if len(genotypes) == 0:
            break  # every open bracket is as narrow as floats go
        told = []
        for start in range(0, len(genotypes), config.population):
            if should_stop is not None and should_stop():
                result.stopped = True
                return
            batch = judge.judge(genotypes[start : start + config.population], generation, done)
            told += [None if ev.failed else ev.violation.get(key) for ev in batch]
            record(batch)
            done += len(batch)
            generation += 1
        search.tell(told)


def _finish(
    result: SearchResult, judge: _Judge, backend, store, extra: dict, started: float, summary_fields: dict
) -> None:
    usable = [i for i, ev in enumerate(result.evaluations) if not ev.failed]
    scale = judge.answer.f_pred_scale(len(result.source.values))
    if usable:
        ft = np.array([result.evaluations[i].f_trans for i in usable])
        fp = np.array([result.evaluations[i].f_pred for i in usable])
        front = [usable[i] for i in non_dominated(ft, fp)]
        # Solutions that change nothing (f_pred 0) add no hypervolume and are not failures to report.
        result.pareto = sorted(
            (i for i in front if result.evaluations[i].f_pred > 0),
            key=lambda i: result.evaluations[i].f_trans,
        )
        result.hypervolume = float(hypervolume(ft, fp, scale, len(result.relations)))
    result.model_calls += judge.model_calls
    result.frames_judged += judge.frames_judged
    result.seconds = time.perf_counter() - started
    if store is None:
        return
    saved: dict[tuple, Any] = {}
    for position in pareto_png_members(result, result.pareto_pngs):
        ev = result.evaluations[result.pareto[position]]
        name = followup_name(result.image, result.algorithm, result.seed, ev.index)
        # A composition judged again (from the cache) ties with itself: one PNG serves every copy.
        saved[ev.composition.key] = store.save_frame(name, judge.followup_frame(ev.composition))
    for rank, i in enumerate(result.pareto):
        ev = result.evaluations[i]
        path = saved.get(ev.composition.key)
        record = evaluation_record(ev, result, extra)
        # frame is None when the PNG budget, the disk budget or the disk reserve left the PNG
        # unwritten: `metavlm render` makes it again from the source frame.
        record.update(rank=rank, frame=None if path is None else str(path.relative_to(store.directory)))
        store.append_pareto(record)
    store.append_summary(summary_record(result, backend, {**extra, **summary_fields}))
