"""docs/architecture.md's worked examples of an optimiser and a relation run as written."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def example(name: str) -> str:
    text = (ROOT / 'docs' / 'architecture.md').read_text(encoding='utf-8')
    found = re.search(rf'<!-- worked example: {name} -->\n```python\n(.*?)```', text, re.DOTALL)
    assert found, f'docs/architecture.md lost its worked example of {name}'
    return found.group(1)


def run(script: str, code: str) -> dict:
    """Run `script` in a fresh interpreter (registries are read once, at import) with the example."""
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    result = subprocess.run(
        [sys.executable, '-c', script, code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# The factory goes into method/algorithms.py and its registry, as step 1 says, before the search
# (or anything else) reads ALGORITHMS.
_OPTIMISER = r"""
import json, sys
import metavlm_ros.method.algorithms as algorithms
exec(compile(sys.argv[1], 'docs/architecture.md', 'exec'), vars(algorithms))
algorithms.ALGORITHM_FACTORIES['unsga3'] = algorithms._unsga3
algorithms.ALGORITHMS = tuple(algorithms.ALGORITHM_FACTORIES)

from metavlm_ros.method.search import ALGORITHMS, SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

class Spy(ImageStatsBackend):
    def __init__(self):
        super().__init__()
        self.batches = []
    def predict(self, frames):
        self.batches.append(len(frames))
        return super().predict(frames)

def search(seed):
    backend = Spy()
    config = SearchConfig(algorithm='unsga3', population=6, evaluations=20, seed=seed)
    result = run_search(make_frame(64, 48, seed=1), backend, config)
    genotypes = [[round(float(v), 12) for v in ev.genotype] for ev in result.evaluations]
    generations = len({ev.generation for ev in result.evaluations})
    return genotypes, generations, backend.batches
one, generations, batches = search(3)
again, _, _ = search(3)
other, _, _ = search(4)
print(json.dumps({'registered': 'unsga3' in ALGORITHMS, 'evaluations': len(one), 'same': one == again,
                  'other': one != other, 'generations': generations, 'batches': batches}))
"""


def test_the_optimiser_example_runs_with_an_exact_budget_one_call_a_generation_and_its_seed():
    out = run(_OPTIMISER, example('optimiser'))
    assert out['registered']
    assert out['evaluations'] == 20  # the budget is exact
    assert out['same'] and out['other']  # the seed reproduces the genotypes, another seed does not
    # The source frame, then at most one model call per generation, never more than a population.
    assert 1 <= len(out['batches']) - 1 <= out['generations']
    assert out['batches'][0] == 1 and max(out['batches'][1:]) <= 6


# The function and its rows go into method/underwater.py's tables, as step 1 says, before the
# relation registry (method/relations.py) reads them.
_RELATION = r"""
import json, sys
import numpy as np
import metavlm_ros.method.underwater as underwater
exec(compile(sys.argv[1], 'docs/architecture.md', 'exec'), vars(underwater))

from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.relations import RELATION_BY_ID, RELATIONS, apply_relation
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

frame = make_frame(96, 64, seed=2)
relation = RELATION_BY_ID['vignetting']
changes = [float(np.abs(apply_relation(frame, 'vignetting', v).astype(int) - frame).mean())
           for v in (0.2, 0.4, 0.8)]
space = SearchSpace.from_options(enabled=['vignetting'])
result = run_search(frame, ImageStatsBackend(), SearchConfig(algorithm='random', population=4,
                    evaluations=8, space=space))
print(json.dumps({
    'number': relation.number, 'before': [r.id for r in RELATIONS if r.number > relation.number],
    'identity': bool(np.array_equal(apply_relation(frame, 'vignetting', 0.0), frame)),
    'changes': changes,
    'repeatable': bool(np.array_equal(apply_relation(frame, 'vignetting', 0.5),
                                      apply_relation(frame, 'vignetting', 0.5))),
    'labels': sorted({ev.composition.label for ev in result.evaluations}),
    'f_trans': sorted({round(ev.f_trans, 9) for ev in result.evaluations}),
}))
"""


def test_the_relation_example_runs_as_the_twelfth_relation_and_can_be_searched():
    out = run(_RELATION, example('relation'))
    # After the paper's six and the five underwater ones; the optics relation (water) and object
    # insertion come after it.
    assert out['number'] == 12 and out['before'] == ['water', 'insertion']
    assert out['identity'] and out['repeatable']
    assert 0 < out['changes'][0] < out['changes'][1] < out['changes'][2]
    # Rand over a space of that one relation: every sample is order 1, {12}, at its own f_trans.
    assert out['labels'] == ['{12}']
    assert all(0 < f <= 1 for f in out['f_trans'])
