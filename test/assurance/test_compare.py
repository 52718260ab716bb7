"""Model comparison on stand-in evidence: a less robust candidate is called regressed by the paired
tests (and the other way round the more robust one improved: the gate passes), the same model is not
(same seed or another), and every not-comparable case is named."""

import json
import shutil

import pytest

from metavlm_ros.assurance.compare import IMPROVED, NO_CHANGE, REGRESSED, compare, comparison_outcome
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.prediction import Prediction
from test.assurance.evidence import write_run
from test.fakes import BlackCountBackend, ImageStatsBackend

SIX = tuple('abcdef')
REGION = SearchSpace.from_options(['rotation'], {'rotation': (-5, 5)})


class TouchyBackend(ImageStatsBackend):
    """A less robust stand-in: its 'animal' confidence moves three times as much with the black fill."""

    model_id = 'fake-touchy'

    def predict(self, frames):
        out = []
        for p in super().predict(frames):
            values = {**p.values, 'animal': min(1.0, 3 * p.values['animal'])}
            out.append(Prediction(kind='confidence', values=values))
        return out


def _evidence(root, backend=None, seed=5):
    """The plan `metavlm verify` runs for a rotation rate claim and a rotation envelope, at Th 0.03."""
    backend = backend or ImageStatsBackend()
    common = {'frames': SIX, 'backend': backend, 'seed': seed}
    write_run(root / 'rate', 'uniform', space=REGION, evaluations=40, **common)
    write_run(root / 'envelope', 'envelope', space=SearchSpace.from_options(['rotation']), population=8,
              evaluations=48, **common)  # fmt: skip
    write_run(root / 'search', 'nsga2', evaluations=40, **common)
    return load_evidence(root)


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return _evidence(tmp_path_factory.mktemp('base'))


@pytest.fixture(scope='module')
def touchy(tmp_path_factory):
    return _evidence(tmp_path_factory.mktemp('touchy'), TouchyBackend())


def test_a_less_robust_candidate_is_called_regressed(base, touchy):
    changes, notes = compare(base, touchy, threshold=0.03)
    by_item = {c.item: c for c in changes}
    assert set(by_item) == {'rotation- boundary', 'rotation+ boundary', 'violation rate of rate',
                            'hypervolume of search'}  # fmt: skip
    rate = by_item['violation rate of rate']
    assert rate.test.startswith('exact McNemar, 240 paired samples')
    assert rate.verdict == REGRESSED and rate.effect > 0.05
    for side in '-+':
        boundary = by_item[f'rotation{side} boundary']
        assert boundary.test == 'Wilcoxon signed-rank, paired over 6 frames'
        # Six frames all earlier: the smallest two-sided p an exact test of 6 pairs gives is 1/32.
        assert boundary.p == pytest.approx(1 / 32) and boundary.worse
        assert boundary.verdict == NO_CHANGE  # 1/32 times Holm's factor is not below 0.05
    assert by_item['hypervolume of search'].verdict in (REGRESSED, NO_CHANGE)
    assert all(c.p_adjusted >= c.p for c in changes)
    # Said instead: every frame moved, and how many frames would decide it (4 items: 2 * 4 / 2**8 < 0.05).
    assert [n.split(':')[0] for n in notes] == ['rotation- boundary', 'rotation+ boundary']
    assert all('all 6 frames moved the same way' in n and 'verify on at least 8 frames' in n for n in notes)


def test_a_more_robust_candidate_is_called_improved_and_passes_the_gate(base, touchy, tmp_path, capsys):
    changes, _ = compare(touchy, base, threshold=0.03)
    by_item = {c.item: c for c in changes}
    assert by_item['violation rate of rate'].verdict == IMPROVED
    assert REGRESSED not in {c.verdict for c in changes} and comparison_outcome(changes) == 'IMPROVED'
    out = tmp_path / 'c'
    code = main(['compare', str(touchy.root), str(base.root), '--out', str(out), '--threshold', '0.03'])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.splitlines()[-1].startswith(f'IMPROVED: {base.root} against {touchy.root}')
    assert json.loads((out / 'compare.json').read_text())['outcome'] == 'IMPROVED'
    assert (out / 'compare.md').read_text().startswith('# Model comparison: IMPROVED')


def test_the_same_model_is_never_called_changed_with_the_same_seed_or_another(base, tmp_path):
    same, _ = compare(base, _evidence(tmp_path / 'same'), threshold=0.03)
    assert all(c.verdict == NO_CHANGE and c.p == 1 for c in same)
    for seed in (6, 7, 8):
        other = _evidence(tmp_path / f'seed{seed}', seed=seed)
        changes, notes = compare(base, other, threshold=0.03)
        assert all(c.verdict not in (REGRESSED, IMPROVED) for c in changes), [c.__dict__ for c in changes]
        assert any(f'seed 5 in BASE, {seed} in CANDIDATE' in note for note in notes)
        rate = next(c for c in changes if c.kind == 'rate')
        assert rate.test.startswith('Fisher exact')  # other samples: compared unpaired


def test_evidence_that_is_not_comparable_is_named_in_one_line(base, tmp_path):
    def refused(candidate, words, threshold=0.03):
        with pytest.raises(InputError) as caught:
            compare(base, candidate, threshold=threshold)
        assert words in str(caught.value) and '\n' not in str(caught.value), str(caught.value)

    other_frames = tmp_path / 'frames'
    write_run(other_frames / 'rate', 'uniform', space=REGION, evaluations=40, frames=tuple('abcdeg'))
    refused(load_evidence(other_frames), 'is in BASE only')
    for name in ('envelope', 'search'):
        shutil.copytree(base.root / name, other_frames / name)
    refused(load_evidence(other_frames), 'frame f is ')
    budget = tmp_path / 'budget'
    write_run(budget / 'rate', 'uniform', space=REGION, evaluations=41, frames=SIX)
    for name in ('envelope', 'search'):
        shutil.copytree(base.root / name, budget / name)
    refused(load_evidence(budget), 'rate: settings.evaluations is 40 in BASE, 41 in CANDIDATE')
    counts = tmp_path / 'counts'
    _evidence(counts, BlackCountBackend())
    refused(load_evidence(counts), 'a count model and a confidence model')
    refused(_evidence(tmp_path / 'again'), 'choose one with --threshold', threshold=None)
