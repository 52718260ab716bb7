"""Criteria judged on evidence written by searches of a stand-in model: each kind of claim's PASS, FAIL
and INCONCLUSIVE, from the right records only, with figures checked against a direct computation."""

import shlex

import pytest
import yaml
from scipy import stats

from metavlm_ros.assurance.criteria import load_criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.gather import plan
from metavlm_ros.assurance.judge import judge
from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import boundaries
from test.assurance.evidence import write_run

SIX = tuple('abcdef')


def _criteria(tmp_path, *criteria, threshold=0.05, confidence=0.95):
    path = tmp_path / 'criteria.yaml'
    document = {'format': 1, 'name': 'test', 'threshold': threshold, 'confidence': confidence}
    path.write_text(yaml.safe_dump({**document, 'criteria': [dict(c) for c in criteria]}))
    return load_criteria(path)


@pytest.fixture(scope='module')
def evidence_root(tmp_path_factory):
    """One root holding an NSGA-II search, uniform samples of two regions and a boundary search."""
    root = tmp_path_factory.mktemp('evidence')
    write_run(root / 'search', 'nsga2', evaluations=60)
    write_run(
        root / 'calm',
        'uniform',
        space=SearchSpace.from_options(['downsampling'], {'downsampling': (0.98, 1)}),
    )
    write_run(root / 'roll', 'uniform', space=SearchSpace.from_options(['rotation'], {'rotation': (-5, 5)}))
    write_run(root / 'envelope', 'envelope', space=SearchSpace.from_options(['rotation']), frames=SIX,
              population=8, evaluations=64)  # fmt: skip
    return root


def test_existence_fails_with_the_smallest_counterexample_which_renders_again(evidence_root, tmp_path):
    criteria = _criteria(tmp_path, {'id': 'any', 'kind': 'existence', 'f_trans_max': 6})
    (verdict,) = judge(criteria, load_evidence(evidence_root))
    evidence = load_evidence(evidence_root)
    broken = [r for _, r in evidence.evaluations() if r['order'] and r['violation']['0.05']]
    assert verdict.status == 'FAIL' and verdict.figures['violations'] == len(broken) > 0
    example = verdict.counterexample
    assert example['f_trans'] == min(r['f_trans'] for r in broken)
    # The counterexample is evidence an engineer can look at: `metavlm render` makes its follow-up.
    argv = shlex.split(example['render'])[1:] + ['--out', str(tmp_path / 'rendered')]
    assert main(argv) == 0
    assert len(list((tmp_path / 'rendered').glob('*.png'))) == 1


def test_existence_passes_as_none_found_and_is_inconclusive_where_nothing_was_searched(
    evidence_root, tmp_path
):
    criteria = _criteria(
        tmp_path,
        {'id': 'calm', 'kind': 'existence', 'within': {'downsampling': [0.98, 1.0]}},
        {'id': 'murky', 'kind': 'existence', 'within': {'turbidity': [0, 1]}},
    )
    evidence = load_evidence(evidence_root)
    calm, murky = judge(criteria, evidence)
    # Every evaluation in the region counts, whichever search judged it (a few of NSGA-II's too).
    inside = [
        r for _, r in evidence.evaluations()
        if r['order'] and set(r['parameters']) == {'downsampling'} and r['parameters']['downsampling'] >= 0.98
    ]  # fmt: skip
    assert len(inside) >= 180
    assert calm.status == 'PASS' and calm.reason.startswith(f'none found: no violation among {len(inside)} ')
    assert calm.figures == {'evaluations_in_region': len(inside), 'frames': 3, 'violations': 0}
    assert murky.status == 'INCONCLUSIVE' and murky.figures['evaluations_in_region'] == 0


def test_rate_claims_use_only_uniform_samples_of_their_region_with_exact_bounds(evidence_root, tmp_path):
    evidence = load_evidence(evidence_root)
    (roll,) = [run for run in evidence.runs if run.directory.name == 'roll']
    k = sum(r['violation']['0.03'] for r in roll.records)
    n = len(roll.records)
    assert 0 < k < n
    criteria = _criteria(
        tmp_path,
        {'id': 'pass', 'kind': 'rate', 'within': {'downsampling': [0.98, 1]}, 'limit': 0.05},
        {'id': 'fail', 'kind': 'rate', 'within': {'rotation': [-5, 5]}, 'limit': k / n / 3},
        {'id': 'open', 'kind': 'rate', 'within': {'rotation': [-5, 5]}, 'limit': k / n},
        {'id': 'none', 'kind': 'rate', 'within': {'rotation': [-1, 1]}, 'limit': 0.5},
        threshold=0.03,
    )
    passed, failed, undecided, missing = judge(criteria, evidence)
    assert passed.status == 'PASS' and passed.figures['samples'] == 180 and passed.figures['violations'] == 0
    assert passed.figures['upper'] == pytest.approx(1 - 0.05 ** (1 / 180))
    assert failed.status == 'FAIL' and failed.figures['violations'] == k and failed.figures['samples'] == n
    assert failed.figures['lower'] == pytest.approx(stats.beta.ppf(0.05, k, n - k + 1))
    assert undecided.status == 'INCONCLUSIVE' and 'no number of samples decides' in undecided.reason
    # Another region's samples, and a search's records, are not samples of this one.
    assert missing.status == 'INCONCLUSIVE' and missing.figures['samples'] == 0


def test_envelope_claims_bound_the_boundary_over_frames_from_order_statistics(evidence_root, tmp_path):
    evidence = load_evidence(evidence_root)
    (run,) = [run for run in evidence.runs if run.directory.name == 'envelope']
    # At the smallest threshold, the one the boundary search refines (at 0.05 every frame holds to 5).
    found = boundaries(run.records, '0.01', run.space)
    per_frame = {
        image: min(b.violating for b in found if b.image == image and b.violating is not None)
        for image in SIX
    }
    cleans = {image: min(b.clean for b in found if b.image == image) for image in SIX}
    assert all(v is not None for v in per_frame.values())  # rotation breaks every frame inside +-5
    easy, hard, all_frames, few = judge(
        _criteria(
            tmp_path,
            {'id': 'easy', 'kind': 'envelope', 'relation': 'rotation', 'at_least': min(cleans.values()),
             'frames': 0.5, 'confidence': 0.9},
            {'id': 'hard', 'kind': 'envelope', 'relation': 'rotation', 'at_least': 4.99, 'frames': 0.5,
             'confidence': 0.9},
            {'id': 'all', 'kind': 'envelope', 'relation': 'rotation', 'direction': '+', 'at_least': 0.01,
             'frames': 1.0},
            {'id': 'few', 'kind': 'envelope', 'relation': 'rotation', 'at_least': 0.01, 'frames': 0.95},
            threshold=0.01,
        ),
        evidence,
    )  # fmt: skip
    # 6 frames, median, 90 %: the smallest clean magnitude bounds it from below (P(Bin(6, .5) >= 1) = .98).
    assert easy.status == 'PASS' and easy.figures['lower'] == min(cleans.values())
    # ... and the largest violating one from above (P(Bin(6, .5) <= 5) = .98; <= 4 is only .89).
    assert hard.status == 'FAIL' and hard.figures['upper'] == max(per_frame.values())
    assert all_frames.status == 'PASS'
    # The 5 % quantile from 6 frames: no order statistic bounds it at 95 %; never a PASS.
    assert few.status == 'INCONCLUSIVE' and few.figures['lower'] is None


def test_evidence_at_other_thresholds_and_empty_roots_are_refused_in_one_line(evidence_root, tmp_path):
    criteria = _criteria(tmp_path, {'id': 'x', 'kind': 'existence', 'f_trans_max': 1}, threshold=0.07)
    with pytest.raises(InputError, match='not at the criteria threshold 0.07'):
        judge(criteria, load_evidence(evidence_root))
    with pytest.raises(InputError, match='no results directory'):
        load_evidence(tmp_path)


def test_detection_evidence_is_judged_at_the_criteria_iou_threshold(tmp_path):
    from test.fakes import ThresholdDetector

    root = tmp_path / 'evidence'
    write_run(root / 'search', 'nsga2', evaluations=40, backend=ThresholdDetector(threshold=120))
    evidence = load_evidence(root)
    assert evidence.kind == 'detection' and evidence.keys == ['iou0.5']
    claims = ({'id': 'any', 'kind': 'existence', 'f_trans_max': 6},)
    (verdict,) = judge(_criteria(tmp_path, *claims), evidence)
    broken = [
        r for _, r in evidence.evaluations() if r['order'] and not r['failed'] and r['violation']['iou0.5']
    ]
    assert verdict.figures['violations'] == len(broken)
    assert verdict.status == ('FAIL' if broken else 'PASS')
    # Criteria that ask for another IoU threshold than the records were judged at are refused.
    path = tmp_path / 'strict.yaml'
    path.write_text(
        yaml.safe_dump({'format': 1, 'name': 'strict', 'iou_threshold': 0.7, 'criteria': list(claims)})
    )
    with pytest.raises(InputError, match='not at the criteria threshold'):
        judge(load_criteria(path), evidence)


def test_an_existence_claim_about_some_classes_counts_only_their_violations(evidence_root, tmp_path):
    evidence = load_evidence(evidence_root)
    any_class, trash_only = judge(
        _criteria(
            tmp_path,
            {'id': 'any', 'kind': 'existence', 'f_trans_max': 6},
            {'id': 'trash', 'kind': 'existence', 'f_trans_max': 6, 'classes': ['trash']},
        ),
        evidence,
    )
    judged = [r for _, r in evidence.evaluations() if r['order'] and not r['failed']]
    # A trash violation: its confidence moved by the threshold or more (Eq. 5 for that class alone).
    trash = [r for r in judged if abs(r['followup']['trash'] - r['source']['trash']) >= 0.05 - 1e-12]
    assert trash_only.figures['violations'] == len(trash) < any_class.figures['violations']
    assert trash_only.claim == 'no violation of trash with f_trans <= 6'
    if trash:
        example = trash_only.counterexample
        assert example['f_trans'] == min(r['f_trans'] for r in trash)
    with pytest.raises(ParameterError, match=r'classes: must be a list of class names'):
        _criteria(tmp_path, {'id': 'bad', 'kind': 'existence', 'f_trans_max': 1, 'classes': 'trash'})


def test_a_localisation_claim_bounds_the_share_of_samples_with_a_displaced_object(tmp_path):
    from test.fakes import ThresholdDetector

    root = tmp_path / 'evidence'
    roll = SearchSpace.from_options(['rotation', 'scaling'], {'rotation': (-5, 5), 'scaling': (0.8, 1.2)})
    detector = ThresholdDetector(threshold=120)
    write_run(root / 'placed', 'uniform', space=roll, evaluations=40, backend=detector)
    region = {'rotation': [-5, 5], 'scaling': [0.8, 1.2]}
    claims = [
        {'id': f'iou{at_least}', 'kind': 'localisation', 'within': region, 'at_least': at_least, 'limit': 0.2}
        for at_least in (0.3, 0.9)
    ]
    loose, strict = judge(_criteria(tmp_path, *claims), load_evidence(root))
    records = [r for _, r in load_evidence(root).evaluations() if (r.get('boxes') or {}).get('matched')]
    for verdict, at_least in ((loose, 0.3), (strict, 0.9)):
        displaced = sum(any(iou < at_least for _, _, iou in r['boxes']['matched']) for r in records)
        assert (verdict.figures['samples'], verdict.figures['violations']) == (len(records), displaced)
        assert verdict.kind == 'localisation'
    assert loose.figures['violations'] <= strict.figures['violations']
    assert strict.claim == (
        'objects found keep IoU >= 0.9 in all but 0.2 of samples within rotation in [-5, 5], scaling in '
        '[0.8, 1.2], 95% confidence'
    )
    # A fourth kind is one more declaration: verify plans its uniform samples under its own name.
    planned = plan(_criteria(tmp_path, *claims), population=10, evaluations=60, seed=0, working_size=None)
    assert [p.name for p in planned] == ['localisation-iou0.3', 'localisation-iou0.9']
