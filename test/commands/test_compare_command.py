"""`metavlm compare` as a user runs it at a model update: the demo CLIP's verify evidence against a copy
made worse on purpose (its patch embedding perturbed) is a regression, exit 1, a JUnit failure; against
itself with another seed it is not; evidence of another plan is refused, exit 2. Two campaigns compare
when only their model differs, and are refused when their configurations differ in anything else."""

import json
import shutil
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from metavlm_ros.assurance.compare import compare
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.manifest import write_manifest
from metavlm_ros.demo.variants import damaged_copy
from test.campaign.configs import small_config
from test.conftest import write_frames

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / 'config' / 'criteria' / 'aur_camera.yaml'
DEMO_CLIP = ROOT / 'metavlm_ros' / 'models' / 'demo-clip'


@pytest.fixture(scope='module')
def verified(tmp_path_factory):
    """verify runs of the example criteria on 6 demo frames: the demo CLIP (seeds 0 and 1), the worse copy."""
    root = tmp_path_factory.mktemp('compare')
    scenes = [
        'scenes',
        '--out',
        str(root / 'frames'),
        '--format',
        'png',
        '--frames',
        '6',
        '--size',
        '640x360',
    ]
    assert main([*scenes, '--seed', '3']) == 0
    runs = {}
    for name, model, seed in (
        ('base', 'demo', 0),
        ('again', 'demo', 1),
        ('worse', str(damaged_copy(DEMO_CLIP, root / 'm')), 0),
    ):
        runs[name] = root / name
        budget = ['--evaluations', '120', '--population', '20', '--envelope-rounds', '2']
        args = [
            'verify',
            str(root / 'frames'),
            '--criteria',
            str(EXAMPLE),
            '--model',
            model,
            '--seed',
            str(seed),
        ]
        code = main([*args, *budget, '--out', str(runs[name])])
        assert code in (0, 1, 3)
    return runs


def test_a_worse_model_is_a_regression_and_the_junit_report_says_which(verified, tmp_path, capsys):
    out, junit = tmp_path / 'c', tmp_path / 'c.xml'
    code = main(
        ['compare', str(verified['base']), str(verified['worse']), '--out', str(out), '--junit', str(junit)]
    )
    printed = capsys.readouterr().out
    assert code == 1, printed
    record = json.loads((out / 'compare.json').read_text())
    regressed = [c['item'] for c in record['changes'] if c['verdict'] == 'regressed']
    assert regressed and record['regressed'] is True
    assert printed.splitlines()[-1].startswith(f'REGRESSED: {verified["worse"]} against {verified["base"]}')
    (suite,) = list(JUnitXml.fromfile(str(junit)))
    failed = [case.name for case in suite if any(isinstance(r, Failure) for r in case.result)]
    assert failed == [item.replace(' ', '_') for item in regressed]
    assert suite.tests == len(record['changes'])


def test_the_same_model_with_another_seed_is_no_regression(verified, tmp_path, capsys):
    code = main(['compare', str(verified['base']), str(verified['again']), '--out', str(tmp_path / 'c')])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'note: evidence/search: seed 0 in BASE, 1 in CANDIDATE' in printed
    record = json.loads((tmp_path / 'c' / 'compare.json').read_text())
    assert not any(c['verdict'] == 'regressed' for c in record['changes'])


def test_evidence_of_another_plan_is_not_comparable(verified, tmp_path, capsys):
    other = tmp_path / 'other'
    shutil.copytree(verified['base'], other)
    shutil.rmtree(other / 'evidence' / 'envelope')
    # Another plan, as verify with other criteria writes it (its manifest whole): refused by what differs.
    write_manifest(other)
    assert main(['compare', str(verified['base']), str(other), '--out', str(tmp_path / 'c')]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith('metavlm: error: not comparable: evidence/envelope is in BASE only')
        and err.count('\n') == 1
    )


def test_campaigns_compare_when_only_the_model_differs_and_name_any_other_setting(
    tmp_path, tiny_clip_dir, capsys
):
    images = write_frames(tmp_path / 'images', 2, 48, 36, stem='img')
    worse = damaged_copy(tiny_clip_dir, tmp_path / 'worse-clip')

    def campaign(name, model=tiny_clip_dir, options=(), **settings):
        models = [{'backend': 'clip', 'model': str(model), 'name': name, 'device': 'cpu', **dict(options)}]
        settings = {'runs': 1, 'algorithms': ['random'], 'evaluations': 12, 'models': models, **settings}
        config = small_config(images, model, **settings)
        run_campaign(config, tmp_path / name, progress=False, threads=1)
        return str(tmp_path / name)

    # Other weights, path and name on the same configuration: compared (regressed or not, never exit 2).
    base, candidate = campaign('base'), campaign('candidate', worse)
    args = ['--threshold', '0.03', '--out', str(tmp_path / 'c')]
    assert main(['compare', base, candidate, *args]) in (0, 1)
    capsys.readouterr()
    # Without --threshold: the campaign's own thresholds are named (its cells record none).
    assert main(['compare', base, candidate, '--out', str(tmp_path / 'c0')]) == 2
    err = capsys.readouterr().err
    assert 'the searches judged at thresholds 0.01, 0.03, 0.05: choose one with --threshold' in err, err
    prompts = campaign('prompts', options={'prompts': 'paper'})
    relations = campaign('relations', relations={'enabled': ['paper', 'turbidity']})
    for other, field in (
        (prompts, "models.0.options.prompts is 'default' in BASE, 'paper' in CANDIDATE"),
        (relations, 'config.relations.enabled is None in BASE'),
    ):
        assert main(['compare', base, other, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f'metavlm: error: not comparable: campaign.json {field}'), err
        assert err.count('\n') == 1
    cell = next((tmp_path / 'candidate' / 'cells').iterdir())
    with pytest.raises(InputError, match='BASE is a campaign .campaign.json., CANDIDATE is not'):
        compare(load_evidence(base), load_evidence(cell), threshold=0.03)
