"""A campaign's configuration as parsed: its frames, models, search settings and identity."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from metavlm_ros.method import defaults
from metavlm_ros.method.boxes import DEFAULT_IOU_THRESHOLD
from metavlm_ros.method.metrics import DEFAULT_THRESHOLDS

__all__ = [
    'CampaignConfig',
    'EXECUTORS',
    'FRAME_KEYS',
    'FrameSpec',
    'GENERATE_KEYS',
    'MODEL_KEYS',
    'ModelSpec',
    'PAPER_ALGORITHMS',
    'RELATION_KEYS',
    'TOP_KEYS',
    'search_space',
    'sha256_text',
]


#: The algorithms a campaign compares when its file names none: the paper's pair (MetaVLM and Rand).
PAPER_ALGORITHMS = ('nsga2', 'random')
EXECUTORS = ('local', 'dask')


TOP_KEYS = {
    'frames',
    'models',
    'algorithms',
    'runs',
    'population',
    'evaluations',
    'seed',
    'thresholds',
    'iou_threshold',
    'find_inserted',
    'water_ranges',
    'working_size',
    'relations',
    'warp',
    'pareto_pngs',
    'threads',
    'baseline',
}


FRAME_KEYS = {'sources', 'topic', 'every', 'start', 'end', 'max_frames', 'size', 'generate'}


GENERATE_KEYS = {'count', 'size', 'seed'}


MODEL_KEYS = {'name', 'backend', 'model'}  # and the options the backend declares (models/registry.py)


RELATION_KEYS = {'enabled', 'ranges'}


@dataclass(frozen=True)
class FrameSpec:
    """Where a campaign's images come from: files, folders, videos or bags, or generated scenes."""

    sources: tuple[str, ...] = ()
    topic: str | None = None
    every: int = 1
    start: float | None = None
    end: float | None = None
    max_frames: int | None = None
    size: int | None = None
    generate: dict | None = None


@dataclass(frozen=True)
class ModelSpec:
    """One model under test: its name in the campaign, backend, model and the backend's options, every
    default filled in (create_backend's keywords; models/registry.py)."""

    name: str
    backend: str
    model: str
    options: dict = field(default_factory=dict)

    @property
    def needs_gpu(self) -> bool:
        """Whether cells of this model must run on a worker that offers a GPU."""
        return str(self.options.get('device') or 'auto').startswith('cuda')

    def key(self) -> str:
        """A stable text key: equal keys build identical backends."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class CampaignConfig:
    """A validated campaign: frames, models, algorithms, runs, budget and base seed."""

    frames: FrameSpec
    models: tuple[ModelSpec, ...]
    algorithms: tuple[str, ...] = PAPER_ALGORITHMS
    runs: int = 10
    population: int = defaults.POPULATION
    evaluations: int = defaults.EVALUATIONS
    seed: int = defaults.SEED
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    # Detections: a matched box below this IoU is displaced; object insertion's strict oracle
    # (docs/method.md §13). Left out of the identity at their defaults, so older campaigns keep theirs.
    iou_threshold: float = DEFAULT_IOU_THRESHOLD
    find_inserted: bool = False
    # Where MR12 water takes each pixel's range: 'prior' (its extras) or 'truth' (each frame's range map,
    # which the footage must carry; docs/underwater.md). In the identity only when 'truth', as above.
    water_ranges: str = 'prior'
    working_size: int | None = None
    relations: dict | None = None
    # Campaigns reproduce the paper, which resamples after every relation (docs/method.md §8).
    warp: str = 'sequential'
    # Follow-up PNGs per search for its non-dominated set (None: all). It changes no record (every
    # follow-up is re-rendered from the stored source frame), so it is no part of the identity.
    pareto_pngs: int | None = defaults.PARETO_PNGS
    # Torch threads per cell, whatever the executor: float sums (and so the tables) depend on it.
    threads: int = 1
    # The algorithm the report compares every other one against (None: Rand, as the paper; 'all':
    # every pair). It changes no cell, so it is no part of the campaign's identity.
    baseline: str | None = None

    def to_dict(self) -> dict:
        """The normalised configuration (every default filled in) as plain JSON values.

        `baseline` appears only when set, and pareto_pngs, iou_threshold, find_inserted and water_ranges
        only when not at their defaults, so a configuration without them is what it was before.
        """
        values = json.loads(json.dumps(asdict(self)))
        if values['baseline'] is None:
            del values['baseline']
        if values['pareto_pngs'] == defaults.PARETO_PNGS:
            del values['pareto_pngs']
        if values['iou_threshold'] == DEFAULT_IOU_THRESHOLD:
            del values['iou_threshold']
        if not values['find_inserted']:
            del values['find_inserted']
        if values['water_ranges'] == 'prior':
            del values['water_ranges']
        return values

    def identity(self) -> dict:
        """The configuration that decides the cells' results: to_dict() without the report's baseline.

        With a relation that has extras (MR10's angle), their ranges as searched are added under
        `extras`, defaults included: campaigns that search other angles never mix, and those
        without such a relation keep the identity they had.
        """
        values = self.to_dict()
        values.pop('baseline', None)
        values.pop('pareto_pngs', None)
        extras = search_space(self.relations).as_record().get('extras')
        if extras:
            values['extras'] = extras
        return values

    def fingerprint(self) -> str:
        """A short hash of the normalised configuration (its identity)."""
        return sha256_text(json.dumps(self.identity(), sort_keys=True))[:16]

    def search_config(self, algorithm: str, seed: int):
        """The SearchConfig of one cell."""
        from metavlm_ros.method.search import SearchConfig

        return SearchConfig(
            algorithm=algorithm,
            population=self.population,
            evaluations=self.evaluations,
            seed=seed,
            space=search_space(self.relations),
            thresholds=tuple(self.thresholds),
            working_size=self.working_size,
            warp=self.warp,
            pareto_pngs=self.pareto_pngs,
            iou_threshold=self.iou_threshold,
            find_inserted=self.find_inserted,
            water_ranges=self.water_ranges,
        )


def search_space(relations: Mapping | None):
    """The search space a campaign's `relations` mapping (enabled, ranges) names; the paper's when empty."""
    from metavlm_ros.method.encoding import SearchSpace

    if not relations:
        return SearchSpace.default()
    ranges = relations.get('ranges')
    return SearchSpace.from_options(
        enabled=relations.get('enabled'),
        ranges={k: tuple(v) for k, v in ranges.items()} if ranges else None,
    )


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
