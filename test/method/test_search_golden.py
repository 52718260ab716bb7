"""Seeded searches with the tiny models reproduce the committed records, on any x86-64 CPU.

The fixture under test/fixtures/seeded_search/ was written by this module; any change of behaviour (a
genotype, an objective, a stored field, a follow-up PNG) shows up here as a difference. Two fields are
normalised because they depend on the run and not on the method: `seconds` (wall time) and `model`
(the temporary directory the tiny model was built in).

What is compared is the records, in the order of the files, as the one reader returns them
(`read_jsonl`), and the follow-up PNGs' bytes: not the lines on disk, whose layout is the store's. The
fixture's files are whole records, one a line, so this also checks that they read back.

Exactly: every key, every string, int, bool and null, the order and number of records and of list
items, and the PNGs (OpenCV's 8-bit warps are fixed-point). To a tolerance, the floats, because torch's
float32 kernels differ in the last bits between CPU instruction sets (ATen's default, AVX2, AVX512
paths) and between CPUs of one set (54 of 162 evaluation lines of another AVX512 machine differed by at
most 1.6e-7):
- the method's float64 figures (genotype, parameters, f_trans): METHOD_ATOL, for the genes' 9-decimal
  rounding and numpy's dispatched float64 kernels;
- a model's values (source, follow-up): VALUE_ATOL = 1e-5, about 170 float32 roundoffs (6e-8) and 60
  times the largest difference seen between CPUs;
- sums over the classes of two values each (f_pred, strength, hypervolume): 2 |C| VALUE_ATOL.
Within these, no decision of the search can differ: `test_the_fixture_has_no_decision_within_tolerance`
checks that every violation threshold and every comparison of f_pred in the fixture is further away,
so genotypes, compositions and Boolean violations must be equal, and are compared exactly.

`test_seeded_searches_agree_under_every_cpu_capability` proves it: the seeded searches run in
subprocesses under ATEN_CPU_CAPABILITY=default, avx2 and (where the CPU has it) avx512, and each must
match the fixture.

Regenerate (only when a change of behaviour is intended):
    .venv/bin/python -m test.method.test_search_golden
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import tempfile
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / 'fixtures' / 'seeded_search'

#: The method's float64 figures: genes are stored rounded to 9 decimals, and numpy's dispatched kernels
#: (SVML on AVX512) may move a float64 result by an ulp, which can move that rounding by 1e-9.
METHOD_ATOL = 1e-9
METHOD_FIELDS = ('genotype', 'parameters', 'f_trans')
#: One float32 value a model gave (a confidence): see the module's docstring.
VALUE_ATOL = 1e-5
VALUE_FIELDS = ('source', 'followup')
#: Sums over the classes of differences of two values (f_pred, strength, hypervolume): each value may be
#: VALUE_ATOL away, so their sum over 2 |C| values may be 2 |C| VALUE_ATOL away.
CLASSES = 4
SUM_ATOL = 2 * CLASSES * VALUE_ATOL
THRESHOLDS = (0.01, 0.03, 0.05)

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


def tolerance(field: str) -> float:
    """How far a float of the record field `field` may be from the fixture's (the module's docstring)."""
    if field in METHOD_FIELDS:
        return METHOD_ATOL
    if field in VALUE_FIELDS:
        return VALUE_ATOL
    return SUM_ATOL


def differences(expected, actual, where: str, field: str = '') -> list[tuple[str, float]]:
    """Where `actual` differs from `expected` beyond the field's tolerance: (place, size) pairs.

    Everything but floats is compared exactly (keys, strings, ints, bools, nulls, list lengths); an
    exact difference has size inf. Floats differing within tolerance are not listed.
    """
    if isinstance(expected, float) and isinstance(actual, float):
        gap = abs(expected - actual)
        return [(where, gap)] if not gap <= tolerance(field) else []
    if type(expected) is not type(actual):
        return [(f'{where}: {expected!r} != {actual!r}', float('inf'))]
    if isinstance(expected, dict):
        if expected.keys() != actual.keys():
            return [(f'{where}: keys {sorted(expected)} != {sorted(actual)}', float('inf'))]
        found = []
        for key in expected:
            found += differences(expected[key], actual[key], f'{where}.{key}', field or key)
        return found
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return [(f'{where}: {len(expected)} items != {len(actual)}', float('inf'))]
        found = []
        for i, (x, y) in enumerate(zip(expected, actual, strict=True)):
            found += differences(x, y, f'{where}[{i}]', field)
        return found
    return [] if expected == actual else [(f'{where}: {expected!r} != {actual!r}', float('inf'))]


def mismatches(texts: dict[str, str]) -> list[str]:
    """Every difference between seeded searches' `texts` and the fixture, or [] when they match."""
    found = []
    for name in FILES[:3]:
        expected = [json.loads(line) for line in records_text(FIXTURE / name).splitlines()]
        actual = [json.loads(line) for line in texts[name].splitlines()]
        if len(expected) != len(actual):
            found.append(f'{name}: {len(actual)} records, the fixture has {len(expected)}')
            continue
        for i, (x, y) in enumerate(zip(expected, actual, strict=True)):
            found += [f'{place} (by {size:.3g})' for place, size in differences(x, y, f'{name}[{i}]')]
    if texts['frames.sha256'] != (FIXTURE / 'frames.sha256').read_text():
        found.append('the follow-up PNGs differ (frames.sha256)')
    return found


def test_seeded_searches_reproduce_the_committed_records(tiny_model_dirs):
    texts = seeded_searches(tiny_model_dirs)
    assert texts['frames.sha256'], 'the searches saved no follow-up frame: the fixture checks too little'
    found = mismatches(texts)
    assert not found, f'{len(found)} differences from the seeded fixture, the first: ' + '; '.join(found[:10])


def test_the_comparison_finds_a_change_of_behaviour():
    """A float moved past its tolerance, a gene moved by a rounding step, a flipped Boolean: all found."""
    texts = {name: records_text(FIXTURE / name) for name in FILES[:3]}
    texts['frames.sha256'] = (FIXTURE / 'frames.sha256').read_text()
    assert mismatches(texts) == []
    record = json.loads(texts['evaluations.jsonl'].splitlines()[1])
    for change, field in (
        (lambda r: r['followup'].update(animal=r['followup']['animal'] + 2 * VALUE_ATOL), 'followup'),
        (lambda r: r['followup'].update(animal=r['followup']['animal'] + VALUE_ATOL / 2), None),
        (lambda r: r['genotype'].__setitem__(0, r['genotype'][0] + 1e-8), 'genotype'),
        (lambda r: r['violation'].update({'0.01': not r['violation']['0.01']}), 'violation'),
        (lambda r: r.update(f_pred=r['f_pred'] + 2 * SUM_ATOL), 'f_pred'),
    ):
        changed = json.loads(json.dumps(record))
        change(changed)
        lines = texts['evaluations.jsonl'].splitlines()
        lines[1] = json.dumps(changed, sort_keys=True)
        found = mismatches({**texts, 'evaluations.jsonl': '\n'.join(lines) + '\n'})
        if field is None:
            assert found == [], found
        else:
            assert len(found) == 1 and f'.{field}' in found[0], found


def test_the_fixture_has_no_decision_within_tolerance():
    """No violation threshold and no comparison of f_pred in the fixture lies within the tolerances, so a
    CPU's last bits cannot flip a Boolean violation or the search's ranking: those must be equal."""
    from metavlm_ros.common.results import read_jsonl

    margins, gaps = [], []
    by_search: dict[tuple, set] = {}
    for record in read_jsonl(FIXTURE / 'evaluations.jsonl'):
        by_search.setdefault((record['image'], record['algorithm']), set()).add(record['f_pred'])
        if record['kind'] == 'confidence':
            for name, value in record['followup'].items():
                change = abs(value - record['source'][name])
                margins += [abs(change - threshold) for threshold in THRESHOLDS]
    for values in by_search.values():
        ordered = sorted(values)
        gaps += [b - a for a, b in zip(ordered[:-1], ordered[1:], strict=True)]
    assert len(margins) > 100 and len(gaps) > 50
    assert min(margins) > 2 * VALUE_ATOL, min(margins)  # measured 4.9e-5
    assert min(gaps) > 2 * SUM_ATOL, min(gaps)  # measured 2.2e-4


@functools.lru_cache(maxsize=1)
def _capabilities() -> list[str]:
    """ATen's CPU capabilities this CPU can run: default and avx2 on any x86-64 CPU this suite supports,
    avx512 where the CPU has it. Asked of a fresh process without ATEN_CPU_CAPABILITY: this one may run
    under a lower one than the CPU has."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != 'ATEN_CPU_CAPABILITY'}
    best = subprocess.run(
        [sys.executable, '-c', 'import torch; print(torch.backends.cpu.get_cpu_capability())'],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    return ['default', 'avx2', 'avx512'] if best == 'AVX512' else ['default', 'avx2']


def _dispatched() -> tuple[list[str], list[str]]:
    """The SIMD extensions numpy and OpenCV choose at run time on this CPU (names as each library's
    NPY_DISABLE_CPU_FEATURES and OPENCV_CPU_DISABLE take them)."""
    import cv2
    from numpy._core import _multiarray_umath as umath

    numpy_found = [name for name in umath.__cpu_dispatch__ if umath.__cpu_features__.get(name)]
    opencv_found = [
        t[1:].rstrip('?')
        for t in cv2.getCPUFeaturesLine().split()
        if t.startswith('*') and not t.endswith('?')
    ]
    return numpy_found, opencv_found


def _cpu_has_avx512() -> bool:
    """Whether the CPU has the AVX512 subsets ATen's avx512 kernels need (Linux's /proc/cpuinfo; True
    where it cannot be read: the case then finds out in its own process)."""
    try:
        flags = Path('/proc/cpuinfo').read_text(encoding='utf-8').split()
    except OSError:
        return True
    return {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'} <= set(flags)


# avx512 only where the CPU has it: ATen takes ATEN_CPU_CAPABILITY=avx512 at its word and runs AVX512
# kernels on a CPU without them, which die of an illegal instruction (seen on an AMD EPYC with AVX2 only).
CAPABILITIES = ['default', 'avx2', *(['avx512'] if _cpu_has_avx512() else [])]


@pytest.mark.parametrize('capability', CAPABILITIES, ids=['baseline', *CAPABILITIES[1:]])
def test_seeded_searches_agree_under_every_cpu_capability(tmp_path, capability):
    """The seeded searches, models built and run in a fresh process under ATEN_CPU_CAPABILITY=`capability`,
    match the fixture. `baseline` also turns off numpy's and OpenCV's run-time SIMD dispatch, as on the
    plainest x86-64 CPU. Where the CPU's flags could not be read and it turns out to lack AVX512, the
    `avx512` case asks for AVX2 and is checked as `avx2`'s is."""
    import os
    import subprocess
    import sys

    out = tmp_path / 'texts.json'
    asked = capability if capability != 'avx512' or 'avx512' in _capabilities() else 'avx2'
    env = {**os.environ, 'ATEN_CPU_CAPABILITY': asked}
    if capability == 'default':
        numpy_found, opencv_found = _dispatched()
        env.update(NPY_DISABLE_CPU_FEATURES=' '.join(numpy_found), OPENCV_CPU_DISABLE=','.join(opencv_found))
    done = subprocess.run(
        [sys.executable, '-m', 'test.method.test_search_golden', '--emit', str(out)],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    emitted = json.loads(out.read_text())
    expected = capability.upper() if capability in _capabilities() else 'AVX2'
    assert emitted['cpu_capability'] == expected, (
        f'asked for {capability}, ATen ran {emitted["cpu_capability"]}'
    )
    if capability == 'default':
        assert emitted['dispatched'] == [[], []], f'numpy and OpenCV still dispatched {emitted["dispatched"]}'
    found = mismatches(emitted['texts'])
    assert not found, f'{capability}: {len(found)} differences from the fixture: ' + '; '.join(found[:10])


def _fresh_searches() -> dict[str, str]:
    """The seeded searches' texts, with tiny models built here, in this process, and removed after."""
    from metavlm_ros.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        built: dict[str, Path] = {}

        def model_dir(backend: str) -> Path:
            if backend not in built:
                built[backend] = build_tiny_model(backend, Path(tmp) / backend, seed=0)
            return built[backend]

        return seeded_searches(model_dir)


def _write_fixture() -> None:
    FIXTURE.mkdir(parents=True, exist_ok=True)
    # Whole records, one a line (the oldest layout, which `read_jsonl` reads too).
    for name, text in _fresh_searches().items():
        (FIXTURE / name).write_text(text)
    (FIXTURE / 'platform.json').write_text(json.dumps(platform_fingerprint(), indent=1) + '\n')


def _emit(path: Path) -> None:
    """Run the seeded searches in this process and write their texts to `path`, with what ran them."""
    import torch

    texts = _fresh_searches()
    emitted = {
        'cpu_capability': torch.backends.cpu.get_cpu_capability(),
        'dispatched': _dispatched(),
        'texts': texts,
    }
    path.write_text(json.dumps(emitted))


if __name__ == '__main__':
    import sys

    if sys.argv[1:2] == ['--emit']:
        _emit(Path(sys.argv[2]))
    else:
        _write_fixture()
