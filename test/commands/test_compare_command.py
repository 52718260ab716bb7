"""`metavlm compare` as a user runs it at a model update: the demo CLIP's verify evidence against a copy
made worse on purpose (its patch embedding perturbed) is a regression, exit 1, a JUnit failure; against
itself with another seed it is not; evidence of another plan is refused, exit 2."""

import json
import shutil
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from metavlm_ros.assurance.manifest import write_manifest
from metavlm_ros.cli import main
from metavlm_ros.demo.variants import damaged_copy

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
