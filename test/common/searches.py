"""Searches written into a results directory as `metavlm search` writes them (for the tests of common/)."""

from metavlm_ros.common.results import ResultsStore
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import ImageStatsBackend


def search_frames(directory, algorithm='nsga2', resume=False, frames=('a', 'b'), **store_options):
    """Two frames searched into one directory, as `metavlm search` does."""
    config = SearchConfig(algorithm=algorithm, population=6, evaluations=20, seed=5)
    with ResultsStore(directory, resume=resume, **store_options) as store:
        done = store.completed_searches()
        for i, name in enumerate(frames):
            if (name, algorithm, 5, 'fake-image-stats', None) in done:
                continue
            run_search(make_frame(64, 48, seed=i), ImageStatsBackend(), config, image_id=name, store=store,
                       extra_fields={'model': 'fake-image-stats'})  # fmt: skip


def write_legacy(directory) -> None:
    """Rewrite a directory's record files as earlier versions wrote them: JSON Lines, one whole record a
    line (results format 1), under the names without .gz."""
    import json
    from pathlib import Path

    from metavlm_ros.common.results import EVALUATIONS, PARETO, SUMMARY, VIOLATIONS, read_jsonl, records_file

    for name in (EVALUATIONS, PARETO, SUMMARY, VIOLATIONS):
        compressed = records_file(Path(directory) / name)
        if compressed.suffix == '.gz' and compressed.exists():
            lines = ''.join(json.dumps(r, separators=(',', ':')) + '\n' for r in read_jsonl(compressed))
            (Path(directory) / name).write_text(lines)
            compressed.unlink()
