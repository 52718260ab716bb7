"""Seeded searches with the tiny models reproduce the committed records byte for byte.

The fixture under test/fixtures/seeded_search/ was written by this module on the code before the
package layout changed; any change of behaviour (a genotype, an objective, a stored field, a
follow-up PNG) shows up here as a diff. Two fields are normalised because they depend on the run and
not on the method: `seconds` (wall time) and `model` (the temporary directory the tiny model was
built in). Everything else is compared as written.

What is compared is the records, each as one canonical JSON line (keys sorted), in the order of the
files, as the one reader returns them (`read_jsonl`), and the follow-up PNGs' bytes: not the lines
on disk, whose layout (header lines, references to evaluations, docs/results.md) is the store's. The
fixture's files are in the header-line format (format 1) and the searches write the current one, so
this also checks that records of the older format read back equal.

Float results of torch kernels may differ between CPU instruction sets and library versions, so the
fixture records the platform it was made on; elsewhere the comparison is skipped with the reason.

Regenerate (only when a change of behaviour is intended):
    .venv/bin/python -m test.method.test_search_golden
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / 'fixtures' / 'seeded_search'
# The same records made on other platforms (a subfolder each, with its platform.json): CI's machine
# must compare, not skip. AVX2/ was written by the code of 1af3b40 on an AVX2 CPU and read back equal,
# record for record, by the code that writes header lines (docs/results.md).
PLATFORM_FIXTURES = (FIXTURE, *sorted(p for p in FIXTURE.iterdir() if (p / 'platform.json').is_file()))


def fixture_for(here: dict) -> Path | None:
    """The fixture folder made on this platform, or None."""
    for folder in PLATFORM_FIXTURES:
        if json.loads((folder / 'platform.json').read_text()) == here:
            return folder
    return None


# The tiny CLIP and BLIP, and a count-type fake whose counts do change (the tiny BLIP's answer never does).
BACKENDS = ('clip', 'blip', 'black-count')
ALGORITHMS = ('nsga2', 'random')
FILES = ('evaluations.jsonl', 'pareto.jsonl', 'summary.jsonl', 'frames.sha256')


def platform_fingerprint() -> dict:
    """What float results of a tiny-model search depend on besides the code."""
    import cv2
    import numpy
    import pymoo
    import torch
    import transformers

    return {
        'machine': platform.machine(),
        'cpu_capability': torch.backends.cpu.get_cpu_capability(),
        'torch': torch.__version__,
        'transformers': transformers.__version__,
        'numpy': numpy.__version__,
        'opencv': cv2.__version__,
        'pymoo': pymoo.__version__,
    }


def records_text(path: Path) -> str:
    """A results file's records, each whole (as `read_jsonl` returns it), one canonical line each."""
    from metavlm_ros.common.results import read_jsonl

    lines = []
    for record in read_jsonl(path):
        if 'seconds' in record:
            record['seconds'] = 'SECONDS'
        if 'model' in record:
            record['model'] = 'TINY_MODEL_DIR'
        lines.append(json.dumps(record, sort_keys=True) + '\n')
    return ''.join(lines)


def seeded_searches(model_dir) -> dict[str, str]:
    """Run the fixed seeded searches; return each results file's records (`records_text`) by name."""
    import torch

    from metavlm_ros.common.results import ResultsStore
    from metavlm_ros.method.encoding import SearchSpace
    from metavlm_ros.method.search import SearchConfig, run_search
    from metavlm_ros.models.vlm import create_backend
    from test.conftest import make_frame
    from test.fakes import BlackCountBackend

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float reductions depend on the thread count
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = ResultsStore(Path(tmp) / 'results')
            for backend_name in BACKENDS:
                if backend_name == 'black-count':
                    backend = BlackCountBackend()
                else:
                    backend = create_backend(backend_name, str(model_dir(backend_name)), device='cpu')
                for seed, algorithm in enumerate(ALGORITHMS):
                    config = SearchConfig(
                        algorithm=algorithm,
                        population=6,
                        evaluations=27,
                        seed=seed + 3,
                        space=SearchSpace.default(),
                        # Every member's PNG, as the fixture was written before PNGs had a budget.
                        pareto_pngs='all',
                    )
                    run_search(
                        make_frame(seed=seed),
                        backend,
                        config,
                        image_id=f'{backend_name}-frame{seed}',
                        store=store,
                        extra_fields={'run': seed},
                    )
            texts = {name: records_text(store.directory / name) for name in FILES[:3]}
            frames = sorted((store.directory / 'frames').glob('*.png'))
            texts['frames.sha256'] = ''.join(
                f'{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n' for p in frames
            )
            return texts
    finally:
        torch.set_num_threads(threads)


def test_seeded_searches_reproduce_the_committed_records(tiny_model_dirs):
    here = platform_fingerprint()
    folder = fixture_for(here)
    if folder is None:
        recorded = json.loads((FIXTURE / 'platform.json').read_text())
        differing = {k: (recorded.get(k), v) for k, v in here.items() if recorded.get(k) != v}
        pytest.skip(f'no fixture made on this platform (first recorded, here): {differing}')
    texts = seeded_searches(tiny_model_dirs)
    assert texts['frames.sha256'], 'the searches saved no follow-up frame: the fixture checks too little'
    for name in FILES[:3]:
        assert texts[name] == records_text(folder / name), f'{name} differs from the seeded fixture'
    assert texts['frames.sha256'] == (folder / 'frames.sha256').read_text(), 'the follow-up PNGs differ'


def _write_fixture() -> None:
    from metavlm_ros.models.tiny import build_tiny_model

    FIXTURE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        built: dict[str, Path] = {}

        def model_dir(backend: str) -> Path:
            if backend not in built:
                built[backend] = build_tiny_model(backend, Path(tmp) / backend, seed=0)
            return built[backend]

        # Whole records, one a line (the oldest layout, which `read_jsonl` reads too).
        for name, text in seeded_searches(model_dir).items():
            (FIXTURE / name).write_text(text)
    (FIXTURE / 'platform.json').write_text(json.dumps(platform_fingerprint(), indent=1) + '\n')


if __name__ == '__main__':
    _write_fixture()
