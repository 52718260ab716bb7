"""Evidence for the assurance tests: searches of stand-in models written as `metavlm search` writes them."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.common.results import ResultsStore
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.models.identity import answered_model_identity, identity_record
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

FRAMES = ('a', 'b', 'c')


def write_run(
    directory: Path,
    algorithm: str = 'nsga2',
    *,
    space: SearchSpace | None = None,
    frames: tuple[str, ...] = FRAMES,
    population: int = 10,
    evaluations: int = 60,
    backend=None,
    seed: int = 5,
) -> Path:
    """Search `frames` (synthetic, one seed each) with a stand-in model into `directory`, with identity."""
    backend = backend or ImageStatsBackend()
    config = SearchConfig(
        algorithm=algorithm,
        population=population,
        evaluations=evaluations,
        seed=seed,
        space=space or SearchSpace.default(),
    )
    model = answered_model_identity(backend.model_id, backend.classes, backend=backend.name)
    with ResultsStore(directory, identity=identity_record(config, model)) as store:
        for i, name in enumerate(frames):
            run_search(make_frame(96, 64, seed=i), backend, config, image_id=name, store=store,
                       extra_fields={'model': backend.model_id})  # fmt: skip
    return directory
