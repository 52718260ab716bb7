"""Evidence for the assurance tests: stand-in models' searches, gathered as `metavlm verify` does."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.assurance.gather import PlannedSearch, gather
from metavlm_ros.common.images import Frame
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.search import SearchConfig
from metavlm_ros.models.identity import answered_model_identity
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
    footage = [Frame(name, make_frame(96, 64, seed=i)) for i, name in enumerate(frames)]
    gather(
        [PlannedSearch(directory.name, config, 'test')], footage, backend, model, directory.parent, log=_quiet
    )
    return directory


def _quiet(message: str) -> None:
    pass
