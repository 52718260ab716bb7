"""The search (docs/method.md §7): NSGA-II (MetaVLM), the paper's Rand and other pymoo algorithms."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pymoo.algorithms.moo.moead import ParallelMOEAD
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.algorithms.moo.nsga3 import NSGA3
from pymoo.algorithms.moo.sms import SMSEMOA
from pymoo.algorithms.soo.nonconvex.random_search import RandomSearch
from pymoo.core.algorithm import Algorithm
from pymoo.core.evaluator import Evaluator
from pymoo.core.population import Population
from pymoo.core.problem import Problem
from pymoo.core.sampling import Sampling
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.sampling.rnd import FloatRandomSampling
from pymoo.problems.static import StaticProblem
from pymoo.util.display.multi import MultiObjectiveOutput
from pymoo.util.ref_dirs import get_reference_directions

from metavlm_ros.common.errors import ModelError, ParameterError, SearchInterrupted
from metavlm_ros.common.images import check_frame, parse_working_size, resize_longer_side, working_size_for
from metavlm_ros.method import defaults
from metavlm_ros.method.encoding import N_VAR, Composition, SearchSpace, decode
from metavlm_ros.method.metrics import (
    DEFAULT_THRESHOLDS,
    hypervolume,
    non_dominated,
    threshold_key,
    violation_flags,
    violation_strength_of,
)
from metavlm_ros.method.objectives import f_pred, f_trans
from metavlm_ros.method.relations import DEFAULT_RELATIONS, WARPS, apply_composition

if TYPE_CHECKING:
    from metavlm_ros.common.results import ResultsStore
    from metavlm_ros.method.prediction import Prediction, VLMBackend

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
    'summary_record',
]


# The authors' NSGA-II operator settings (docs/method.md §7): mutation touches one variable in
# n_var on average, 1/12 for the paper's six relations.
SBX_PROB, SBX_ETA = 0.9, 15
PM_PROB_VAR, PM_ETA = 1 / N_VAR, 10


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
        }


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
    #: them, while `on_evaluation` runs; released after it, so a search holds no more than a batch.
    #: A caller that publishes or saves a follow-up takes it here instead of rendering it again.
    followup_frame: np.ndarray | None = field(default=None, repr=False, compare=False)


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
    relations: tuple[str, ...] = ()
    #: Why the source frame's answer could not be read (then nothing was searched); '' otherwise.
    source_error: str = ''
    #: (path relative to the results directory, sha256 of its pixels) of the stored source frame.
    source_frame: tuple[str, str] | None = None
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


@dataclass(frozen=True)
class PreparedFrame:
    """A frame checked once and brought to the search's working size once: what `run_search` searches."""

    rgb: np.ndarray
    #: (width, height) of the frame as it entered, before the working size.
    source_size: tuple[int, int]


def prepare_frame(frame: Any, config: SearchConfig, input_side: int = 0) -> PreparedFrame:
    """Check `frame` and shrink it to the working size for a model that sees `input_side` pixels.

    Raises:
        InputError: not RGB uint8 (H, W, 3), or under 2 pixels a side (relations interpolate).
    """
    frame = check_frame(frame, min_side=2, what='the frame')
    height, width = frame.shape[:2]
    size = working_size_for(config.working_size, width, height, input_side)
    rgb = np.ascontiguousarray(resize_longer_side(frame, size)) if size else frame
    return PreparedFrame(rgb, (int(width), int(height)))


def searched_frame(frame: Any, config: SearchConfig, backend: VLMBackend) -> np.ndarray:
    """The frame as the search sees it: validated and shrunk to the working size for `backend`."""
    return prepare_frame(frame, config, getattr(backend, 'input_size', 0)).rgb


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


class _Judge:
    """Judges batches of genotypes on one frame against its source prediction, with a cache."""

    def __init__(self, frame: np.ndarray, backend: VLMBackend, source: Prediction, config: SearchConfig):
        self.frame = frame
        self.backend = backend
        self.source = source
        self.config = config
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
                flags = self._no_violation()
                strength: dict[str, float | None] = dict.fromkeys(flags)
                prediction_change = 0.0
            else:
                flags = violation_flags(self.source, followup, self.config.thresholds)
                strength = self._strengths(followup)
                prediction_change = f_pred(self.source, followup)
            evaluations.append(
                Evaluation(
                    index=first_index + offset,
                    generation=generation,
                    genotype=np.asarray(x, dtype=float),
                    composition=comp,
                    f_trans=f_trans(comp),
                    f_pred=prediction_change,
                    followup=followup,
                    violation=flags,
                    strength=strength,
                    cached=cached and comp.order > 0 and not failed,
                    failed=failed,
                    followup_frame=None if cached else rendered.get(comp.key),
                )
            )
        return evaluations

    def followup_frame(self, composition: Composition) -> np.ndarray:
        """The follow-up frame of a composition, warped as the search's configuration says."""
        return apply_composition(self.frame, composition, fuse=self.config.warp == 'fused')

    def _no_violation(self) -> dict[str, bool]:
        return dict.fromkeys(violation_flags(self.source, self.source, self.config.thresholds), False)

    def _strengths(self, followup: Prediction) -> dict[str, float | None]:
        if self.source.kind == 'count':
            return {'count': violation_strength_of(self.source, followup)}
        return {
            threshold_key(t): violation_strength_of(self.source, followup, t) for t in self.config.thresholds
        }


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
    should_stop: Callable[[], bool] | None = None,
    extra_fields: dict | None = None,
    source: Prediction | None = None,
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
        should_stop: polled between generations; True ends the search early (result.stopped).
        extra_fields: added to every stored record (e.g. model, run, source stamp).
        source: the source prediction when the caller already has it (never recomputed here); it must
            be the prediction of the frame as searched: `prepare_frame(frame, config, ...).rgb`.

    Returns:
        The evaluations, the non-dominated set and its hypervolume.
    """
    config.validate()
    if not isinstance(frame, PreparedFrame):
        frame = prepare_frame(frame, config, getattr(backend, 'input_size', 0))
    source_size, frame = frame.source_size, frame.rgb
    started = time.perf_counter()
    if source is None:
        source = backend.predict([frame])[0]
        if source is None:
            raise ModelError('the model gave no prediction for the source frame')
    judge = _Judge(frame, backend, source, config)
    # Stored first, once per distinct frame: every follow-up can be rendered again from it.
    stored_source = store.save_source(frame) if store is not None else None
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
        relations=config.space.enabled_ids,
        source_frame=stored_source,
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
            ev.followup_frame = None  # judged and handed over: a search holds no frame beyond its batch
        if progress is not None:
            progress(len(batch))

    xl, xu = _bounds(config.space)
    try:
        if source.error:
            # Without the source's answer there is nothing to compare follow-ups with: the frame is
            # done, its summary says why (source_error), and no evaluation is spent on it.
            result.source_error = source.error
        else:
            _drive(judge, config, xl, xu, record, should_stop, result)
    except SearchInterrupted:
        # The caller cut the generation in progress short: it is not recorded, the rest is finished.
        result.stopped = True

    _finish(result, judge, backend, store, extra, started)
    return result


class RandSampling(Sampling):
    """The paper's Rand: order k uniform in 1..n, a uniformly random k-subset, uniform parameters.

    n is the number of relations the search space enables (6 by default), so every order gets
    about 1/n of the budget and the identity is never drawn. Genotypes are ordinary genotypes of
    the space (flags 1.0 / 0.0, parameters and extras uniform in the space's ranges): `decode` turns
    them into compositions applied in the fixed relation order, exactly as for NSGA-II.
    """

    def __init__(self, space: SearchSpace):
        super().__init__()
        self.space = space

    def _do(self, problem, n_samples, *args, random_state=None, **kwargs) -> np.ndarray:
        return rand_genotypes(self.space, int(n_samples), random_state)


def rand_genotypes(space: SearchSpace, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` genotypes of the paper's Rand (docs/method.md §7) drawn with `rng`."""
    enabled = space.indices
    orders = rng.integers(1, enabled.size + 1, size=n)
    # A uniformly random k-subset: the k enabled relations with the smallest random keys.
    keys = rng.random((n, enabled.size))
    rank = np.argsort(np.argsort(keys, axis=1), axis=1)
    low, high = np.asarray(space.low, float)[enabled], np.asarray(space.high, float)[enabled]
    genotypes = np.empty((n, space.n_var))
    m = 2 * enabled.size
    genotypes[:, 0:m:2] = rank < orders[:, None]
    genotypes[:, 1:m:2] = low + (high - low) * rng.random((n, enabled.size))
    if m < space.n_var:
        # The extras (MR10's angle), uniform in their ranges; drawn last, so a space without them
        # draws exactly what it drew before there were any.
        extra_low, extra_high = space.extra_bounds()
        genotypes[:, m:] = extra_low + (extra_high - extra_low) * rng.random((n, space.n_var - m))
    return genotypes


def _nsga2(config: SearchConfig) -> Algorithm:
    return NSGA2(
        pop_size=config.population,
        sampling=FloatRandomSampling(),
        crossover=SBX(prob=SBX_PROB, eta=SBX_ETA),
        mutation=PM(prob=1.0, prob_var=1 / config.space.n_var, eta=PM_ETA),
        eliminate_duplicates=True,
    )


def _rand(config: SearchConfig) -> Algorithm:
    return RandomSearch(
        n_points_per_iteration=config.population,
        sampling=RandSampling(config.space),
        output=MultiObjectiveOutput(),
    )


def _operators(config: SearchConfig) -> dict:
    """The paper's variation operators (those of its NSGA-II), shared by the other genetic algorithms."""
    return {
        'sampling': FloatRandomSampling(),
        'crossover': SBX(prob=SBX_PROB, eta=SBX_ETA),
        'mutation': PM(prob=1.0, prob_var=1 / config.space.n_var, eta=PM_ETA),
    }


def _directions(config: SearchConfig) -> np.ndarray:
    """One reference direction per individual, evenly spread over the two objectives (Das-Dennis)."""
    return get_reference_directions('das-dennis', 2, n_partitions=config.population - 1)


def _nsga3(config: SearchConfig) -> Algorithm:
    return NSGA3(
        ref_dirs=_directions(config),
        pop_size=config.population,
        eliminate_duplicates=True,
        **_operators(config),
    )


def _smsemoa(config: SearchConfig) -> Algorithm:
    # pymoo's SMS-EMOA makes a population of offspring per generation (one model call each) and
    # drops the least hypervolume contributors one by one: the (mu + mu) form of the steady state.
    return SMSEMOA(pop_size=config.population, eliminate_duplicates=True, **_operators(config))


def _moead(config: SearchConfig) -> Algorithm:
    # The parallel form asks for one offspring per subproblem at once: one model call a generation.
    # Neighbourhoods of a fifth of the population (20 of pymoo's 100 by default), at least 2.
    return ParallelMOEAD(
        _directions(config), n_neighbors=max(2, config.population // 5), **_operators(config)
    )


# One registry of algorithms: every caller reads it, one loop (_drive) runs them all. The paper's
# two come first; the others are pymoo's, with the same budget, population, operators and seed.
_ALGORITHM_FACTORIES: dict[str, Callable[[SearchConfig], Algorithm]] = {
    'nsga2': _nsga2,
    'random': _rand,
    'nsga3': _nsga3,
    'smsemoa': _smsemoa,
    'moead': _moead,
}
ALGORITHMS = tuple(_ALGORITHM_FACTORIES)


def _drive(judge, config, xl, xu, record, should_stop, result) -> None:
    """Run any pymoo algorithm by ask/tell on the composition problem, with an exact budget."""
    problem = _CompositionProblem(xl, xu)
    algorithm = _ALGORITHM_FACTORIES[config.algorithm](config)
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
        if not last:
            # Nothing asks after the last generation; MOEA/D could not take a cut one anyway.
            algorithm.tell(infills=offspring)
        record(batch)
        done += len(batch)
        generation += 1


def _finish(result: SearchResult, judge: _Judge, backend, store, extra: dict, started: float) -> None:
    usable = [i for i, ev in enumerate(result.evaluations) if not ev.failed]
    n_classes = len(result.source.values)
    if usable:
        ft = np.array([result.evaluations[i].f_trans for i in usable])
        fp = np.array([result.evaluations[i].f_pred for i in usable])
        front = [usable[i] for i in non_dominated(ft, fp)]
        # Solutions that change nothing (f_pred 0) add no hypervolume and are not failures to report.
        result.pareto = sorted(
            (i for i in front if result.evaluations[i].f_pred > 0),
            key=lambda i: result.evaluations[i].f_trans,
        )
        result.hypervolume = float(hypervolume(ft, fp, n_classes, len(result.relations)))
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
    store.append_summary(summary_record(result, backend, extra))


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
    }


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
    """`source_frame` and `source_sha256` when the source frame was stored (no store: no field)."""
    if result.source_frame is None:
        return {}
    path, digest = result.source_frame
    return {'source_frame': path, 'source_sha256': digest}


def summarise_orders(result: SearchResult, keys: Sequence[str] | None = None) -> list[str]:
    """Human-readable lines: violations by order for each criterion."""
    lines = []
    for key, table in result.violations_by_order.items():
        if keys is not None and key not in keys:
            continue
        label = 'count change' if key == 'count' else f'Th={key}'
        cells = ', '.join(f'{o}: {h}/{t}' for o, (h, t) in sorted(table.items()))
        lines.append(f'  violations by order ({label}): {cells or "none evaluated"}')
    return lines
