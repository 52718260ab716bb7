"""Results with planted failure modes, written once per module: Rand searches of the planted double."""

from __future__ import annotations

from pathlib import Path

import pytest

from metavlm_ros.common.results import ResultsStore
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.models.identity import answered_model_identity, identity_record
from test.explain.planted import LIGHTS, PlantedBackend, planted_frame

#: The relations searched. CLAHE and shear are left out: the double must see its conditions in the
#: pixels exactly, and CLAHE moves the markers' colour and the frame's brightness, shear resamples
#: the rows that downsampling repeats. Scaling and translation stay: they act on every follow-up and
#: must not show up in the catalogue.
RELATIONS = ('rotation', 'scaling', 'downsampling', 'translation')
FRAMES_PER_LIGHT = 2
EVALUATIONS = 300  # a frame: 1,800 evaluations in all, ~600 with a planted change


def write_planted(directory: Path, *, seed: int = 11, evaluations: int = EVALUATIONS) -> Path:
    """Search every planted frame with Rand (broad samples of the space) into `directory`."""
    backend = PlantedBackend()
    space = SearchSpace.from_options(RELATIONS)
    config = SearchConfig(algorithm='random', population=30, evaluations=evaluations, seed=seed, space=space)
    model = answered_model_identity(backend.model_id, backend.classes, backend=backend.name)
    with ResultsStore(directory, identity=identity_record(config, model)) as store:
        for i, (light, k) in enumerate((light, k) for light in LIGHTS for k in range(FRAMES_PER_LIGHT)):
            config_i = SearchConfig(**{**config.__dict__, 'seed': seed + i})
            run_search(
                planted_frame(k, light),
                backend,
                config_i,
                image_id=f'{light}{k}',
                store=store,
                extra_fields={'model': backend.model_id, 'backend': backend.name, 'stamp_ns': 0},
            )
    return directory


@pytest.fixture(scope='package')
def planted_results(tmp_path_factory) -> Path:
    return write_planted(tmp_path_factory.mktemp('planted') / 'search')
