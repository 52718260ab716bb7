"""Criteria files: the shipped example reads; every error names its key in one line, exit 2 in the CLI."""

from pathlib import Path

import pytest
import yaml

from metavlm_ros.assurance.criteria import load_criteria
from metavlm_ros.cli import main
from metavlm_ros.common.errors import ParameterError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / 'config' / 'criteria' / 'aur_camera.yaml'


def test_the_shipped_example_reads_with_every_kind_of_claim():
    criteria = load_criteria(EXAMPLE)
    assert [c.kind for c in criteria.criteria] == ['existence', 'existence', 'rate', 'envelope']
    assert (
        criteria.threshold == 0.05
        and criteria.key('confidence') == '0.05'
        and criteria.key('count') == 'count'
    )
    assert len(criteria.sha256) == 64
    rate = criteria.criteria[2]
    # The region in the fixed relation order, whatever the file's: equal regions compare equal.
    assert rate.within.relations == ('rotation', 'turbidity')
    assert rate.within.space().enabled_ids == ('rotation', 'turbidity')
    assert rate.within.holds({'rotation': 1.5}) and not rate.within.holds({'rotation': 2.5})
    assert not rate.within.holds({'rotation': 1.0, 'scaling': 1.1})


def _write(tmp_path, document) -> Path:
    path = tmp_path / 'criteria.yaml'
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return path


def _base(**criterion):
    return {'format': 1, 'name': 'n', 'criteria': [{'id': 'c', **criterion}]}


@pytest.mark.parametrize(
    'document, where',
    [
        ({'format': 1, 'name': 'n', 'criteria': [], 'extra': 1}, 'extra: unknown key'),
        ({'format': 2, 'name': 'n', 'criteria': []}, 'format: must be 1'),
        ({'format': 1, 'criteria': [{}]}, 'name: must be'),
        ({'format': 1, 'name': 'n', 'threshold': 1.5, 'criteria': [{}]}, 'threshold: must lie in (0, 1]'),
        ({'format': 1, 'name': 'n', 'criteria': []}, 'criteria: must be a list'),
        (_base(kind='exists'), 'criteria[0].kind: must be one of existence, rate, localisation, envelope'),
        (_base(kind='existence'), 'criteria[0] (c): an existence claim needs within'),
        (_base(kind='existence', f_trans_max=-1), 'criteria[0] (c).f_trans_max: must lie in (0, 6]'),
        (_base(kind='existence', within={'roll': [0, 1]}), 'criteria[0] (c).within.roll: unknown relation'),
        (_base(kind='existence', within={'rotation': [-9, 1]}), 'rotation: must lie in [-5, 5], got -9'),
        (_base(kind='existence', within={'rotation': [2, 1]}), 'within.rotation: low 2 is above high 1'),
        (_base(kind='existence', within={'rotation': 2}), 'within.rotation: must be [low, high]'),
        (_base(kind='rate', within={'rotation': [-1, 1]}), 'criteria[0] (c).limit: missing'),
        (_base(kind='rate', within={'rotation': [-1, 1]}, limit=0.1, samples=0), 'samples: must be a whole'),
        (_base(kind='rate', within={'rotation': [-1, 1]}, limit=0.1, limt=1), '[0].limt: unknown key'),
        (_base(kind='rate', limit=0.1), '(c).within: missing'),
        (_base(kind='envelope', relation='downsampling', direction='+', at_least=0.05, frames=0.9),
         '(c).direction: downsampling has the directions -'),
        (_base(kind='envelope', relation='rotation', at_least=6, frames=0.9), 'at_least: must lie in (0, 5]'),
        (_base(kind='envelope', relation='rotation', at_least=1, frames=0.9, confidence=1),
         '(c).confidence: must lie in (0, 1)'),
        ({'format': 1, 'name': 'n', 'criteria': [{'id': 'bad id', 'kind': 'existence', 'f_trans_max': 1}]},
         'criteria[0].id: must be letters'),
        ({'format': 1, 'name': 'n', 'criteria': [{'id': 'a', 'kind': 'existence', 'f_trans_max': 1}] * 2},
         "criteria[1].id: 'a' is used twice"),
        ('format: 1\nname: n\ncriteria: {a: 1\nb: 2\n', 'line 4: not valid YAML'),
    ],
)  # fmt: skip
def test_each_error_names_its_key(tmp_path, document, where):
    path = _write(tmp_path, document)
    with pytest.raises(ParameterError) as caught:
        load_criteria(path)
    message = str(caught.value)
    assert message.startswith(f'{path}: ') and where in message and '\n' not in message, message


def test_the_command_refuses_a_bad_file_in_one_line_with_exit_2(tmp_path, capsys):
    path = _write(tmp_path, _base(kind='rate', within={'rotation': [-1, 1]}))
    assert main(['verify', '--criteria', str(path), '--results', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f'metavlm: error: {path}: criteria[0] (c).limit: missing\n'
    assert main(['verify', '--criteria', str(tmp_path / 'none.yaml'), '--results', str(tmp_path)]) == 2
    assert 'cannot read the criteria file' in capsys.readouterr().err
