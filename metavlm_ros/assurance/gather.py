"""Gathering the evidence acceptance criteria need: which searches, with what budget, and running them.

Each planned search writes its own results directory under the evidence folder:
- `search`: NSGA-II over the paper's six relations (and any the criteria name), for the claims on
  f_trans alone;
- `existence-<id>`: NSGA-II inside an existence claim's region (a search over the whole space rarely
  lands inside a narrow one);
- `rate-<id>`: `samples` uniform samples of a rate claim's region per frame;
- `envelope`: the boundary search over the relations the envelope claims name.
Every search judges at the criteria's threshold only (the boundary search refines by it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.kinds import KINDS
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.results import ResultsStore
from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.footage.ranges import RangeLookup
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import ENVELOPE_ROUNDS
from metavlm_ros.method.search import SearchConfig, prepare_frame, run_search
from metavlm_ros.models.identity import identity_record

__all__ = ['ENVELOPE_ROUNDS', 'PlannedSearch', 'gather', 'plan']


@dataclass(frozen=True)
class PlannedSearch:
    """One search of the evidence: its directory name under the evidence folder, and its settings."""

    name: str
    config: SearchConfig
    why: str


def plan(
    criteria: Criteria,
    *,
    population: int,
    evaluations: int,
    seed: int,
    working_size: int | str | None,
    envelope_rounds: int = ENVELOPE_ROUNDS,
) -> list[PlannedSearch]:
    """The searches the criteria need, in the order they run (by kind: existence, rate, envelope, as
    `KINDS` lists them). `evaluations` is the NSGA-II budget a frame."""

    def config(algorithm: str, space: SearchSpace, budget: int) -> SearchConfig:
        return SearchConfig(
            algorithm=algorithm,
            population=population,
            evaluations=budget,
            seed=seed,
            space=space,
            thresholds=(criteria.threshold,),
            iou_threshold=criteria.iou_threshold,
            working_size=working_size,
            # The footage's ranges for the searches of MR12; the others have no use for them.
            water_ranges=criteria.water_ranges if 'water' in space.enabled_ids else 'prior',
        ).validate()

    planned = []
    for kind in KINDS.values():
        mine = [c for c in criteria.criteria if c.kind == kind.kind]  # a subclass is a kind of its own
        if mine:
            for need in kind.searches(mine, evaluations=evaluations, envelope_rounds=envelope_rounds):
                planned.append(
                    PlannedSearch(need.name, config(need.algorithm, need.space, need.budget), need.why)
                )
    return planned


def gather(
    planned: Sequence[PlannedSearch],
    frames: Sequence[Frame],
    backend,
    model: dict,
    evidence: Path,
    *,
    log: Callable[[str], None] = print,
) -> None:
    """Run every planned search on every frame, each into evidence/<name> with its identity.

    The i-th frame is searched with seed + i: with one seed for all, every frame would get the same
    uniform samples (not independent draws, which a rate's bounds assume) and the same initial
    population (so one seed's luck would move every search of a model alike, and a comparison of two
    models with other seeds would see it as a difference). Both models of a comparison get the same
    frames in the same order, so the same samples: they pair. Each record keeps its own seed.
    """
    ranges = RangeLookup()
    for search in planned:
        directory = evidence / search.name
        with ResultsStore(directory, identity=identity_record(search.config, model)) as store:
            log(
                f'{search.name} ({search.why}): {search.config.algorithm}, {search.config.evaluations} '
                f'evaluations a frame on {len(frames)} frame(s)'
            )
            for i, frame in enumerate(frames):
                config = dataclasses.replace(search.config, seed=search.config.seed + i)
                truth = ranges(frame) if config.water_ranges == 'truth' else None
                try:
                    prepared = prepare_frame(frame.rgb, config, getattr(backend, 'input_size', 0), truth)
                except InputError as exc:
                    raise InputError(f'{frame.file or frame.id}: {exc}') from None
                run_search(
                    prepared,
                    backend,
                    config,
                    image_id=frame.id,
                    store=store,
                    extra_fields={
                        'model': backend.model_id,
                        'backend': backend.name,
                        'stamp_ns': frame.stamp_ns,
                        'frame_sha256': frame_digest(frame.rgb),
                        'frame_file': frame.file,
                        'frame_index': frame.index,
                    },
                )
