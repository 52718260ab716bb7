"""The backend registry: one declaration per backend, every surface derived from it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.models.options import Option
from metavlm_ros.models.registry import BACKENDS, all_options, given_options, options_for, resolve_options
from metavlm_ros.models.vlm import create_backend, model_identity
from test.conftest import make_frame

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / 'metavlm_ros'


def _worked_example() -> str:
    text = (ROOT / 'docs' / 'architecture.md').read_text()
    found = re.search(r'<!-- worked example: backend -->\n```python\n(.*?)```', text, re.DOTALL)
    assert found, 'docs/architecture.md lost its worked example'
    return found.group(1)


# Runs in a fresh interpreter: the example registers its backend before anything reads the registry, as
# a module of models/backends/ would; then every surface is asked about it.
_DRIVE_EXAMPLE = r"""
import json, sys, argparse
from pathlib import Path
example, image, out, campaign_dir = sys.argv[1:5]
exec(compile(example, 'docs/architecture.md', 'exec'), {'__name__': 'metavlm_ros.models.backends.example'})

from metavlm_ros.models.registry import BACKENDS
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import create_backend
import numpy as np
model = build_tiny_model('clip_temperature', Path(out) / 'model')
hot = create_backend('clip_temperature', str(model), device='cpu', temperature=100.0)
cold = create_backend('clip_temperature', str(model), device='cpu', temperature=0.01)
frame = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
hot_p, cold_p = hot.predict([frame])[0].values, cold.predict([frame])[0].values

from metavlm_ros.commands import search
parser = argparse.ArgumentParser()
search.add_model_arguments(parser)
args = parser.parse_args(['--backend', 'clip_temperature', '--temperature', '2.5'])

from metavlm_ros.ros.parameters import MODEL_PARAMETERS
spec = next(s for s in MODEL_PARAMETERS if s.name == 'temperature')

from metavlm_ros.campaign.config import parse_config
config = parse_config({'frames': {'generate': {'count': 1}},
                       'models': [{'backend': 'clip_temperature', 'model': str(model), 'temperature': 3.0}]},
                      base_dir=Path(campaign_dir))
try:
    parse_config({'frames': {'generate': {'count': 1}},
                  'models': [{'backend': 'clip_temperature', 'model': str(model), 'temperature': 1000.0}]},
                 base_dir=Path(campaign_dir))
    refused = ''
except Exception as exc:
    refused = str(exc)

from metavlm_ros.cli import main
code = main(['search', image, '--backend', 'clip_temperature', '--model', str(model), '--temperature', '0.5',
             '--population', '4', '--evaluations', '8', '--out', str(Path(out) / 'results'), '--quiet'])
print(json.dumps({
    'listed': list(BACKENDS), 'hot': hot_p, 'cold': cold_p, 'cli': args.temperature,
    'parameter': [spec.default, spec.low, spec.high, spec.read_only],
    'campaign': config.models[0].options['temperature'], 'refused': refused, 'search': code,
}))
"""


def test_the_worked_example_is_one_module_that_every_surface_takes(tmp_path):
    import cv2

    image_path = tmp_path / 'frame.png'
    cv2.imwrite(str(image_path), make_frame(96, 64)[..., ::-1])
    result = subprocess.run(
        [
            sys.executable,
            '-c',
            _DRIVE_EXAMPLE,
            _worked_example(),
            str(image_path),
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert 'clip_temperature' in seen['listed'] and 'clip' in seen['listed']
    # The option reached the model: a high temperature flattens the softmax, a low one sharpens it.
    assert max(seen['hot'].values()) - min(seen['hot'].values()) < 0.05
    assert max(seen['cold'].values()) > 0.99 and sum(seen['cold'].values()) == pytest.approx(1.0)
    assert seen['cli'] == 2.5
    assert seen['parameter'] == [1.0, 0.01, 100.0, True]
    assert seen['campaign'] == 3.0
    assert 'temperature: 1000.0 is outside [0.01, 100]' in seen['refused']
    assert seen['search'] == 0
    identity = json.loads((tmp_path / 'results' / 'search.json').read_text())['identity']
    assert identity['model']['backend'] == 'clip_temperature'
    assert identity['model']['options']['temperature'] == 0.5


def test_an_option_is_refused_for_a_backend_that_does_not_take_it(tiny_blip_dir, tiny_clip_dir):
    # A setting silently ignored would be a test of another model than the user meant.
    with pytest.raises(
        ParameterError, match=r'option confidence does not apply to backend blip \(it is an option of clip\)'
    ):
        create_backend('blip', str(tiny_blip_dir), confidence='softmax')
    with pytest.raises(ParameterError, match='prompts does not apply to backend blip'):
        given_options('blip', {'prompts': 'paper'})
    with pytest.raises(ParameterError, match='max_new_tokens does not apply to backend clip'):
        given_options('clip', {'max_new_tokens': 5})
    # The default (what every surface sends when the user said nothing) is not a setting.
    assert given_options('blip', {'confidence': 'cosine', 'classes': ['animal']}) == {'classes': ['animal']}
    with pytest.raises(ModelError, match="unknown backend 'nope'; valid backends: "):
        resolve_options('nope', {})


def test_options_are_validated_before_a_model_loads():
    with pytest.raises(ParameterError, match=r'batch_size: 0 is outside \[1, 256\]'):
        resolve_options('clip', {'batch_size': 0})
    with pytest.raises(ParameterError, match="dtype: 'int8' is not one of auto, float32, float16, bfloat16"):
        resolve_options('vlm', {'dtype': 'int8'})
    with pytest.raises(ParameterError, match='max_new_tokens: expected int'):
        resolve_options('blip', {'max_new_tokens': '4'})
    with pytest.raises(ParameterError, match='classes: class names must be non-empty and distinct'):
        resolve_options('siglip', {'classes': ['fish', 'fish']})
    resolved = resolve_options('vlm', {'kind': 'confidence'})
    assert resolved['kind'] == 'confidence' and resolved['classes'] == [
        'animal',
        'vegetation',
        'object',
        'trash',
    ]
    assert BACKENDS['vlm'].kind_for(resolved) == 'confidence'


def test_every_option_is_a_flag_a_node_parameter_and_a_campaign_key():
    import argparse

    from metavlm_ros.campaign.config import MODEL_KEYS
    from metavlm_ros.commands.search import add_model_arguments

    pytest.importorskip('rclpy')
    from metavlm_ros.ros.parameters import MODEL_PARAMETERS

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    parameters = {spec.name: spec for spec in MODEL_PARAMETERS}
    for name, option in all_options().items():
        assert option.cli_flag in flags, name
        spec = parameters[option.parameter_name]
        assert spec.read_only is not option.dynamic
        if option.default is None:
            # Not given ('' as a parameter) is the backend's own default: a choice of its own, and a
            # number checked only once given.
            assert spec.choices == (None if option.choices is None else ('', *option.choices)), name
            assert (spec.low, spec.high) == (None, None) and (spec.check is None or spec.check('') is None)
            if option.low is not None:
                assert spec.check(option.high + 1) and not spec.check(option.high), name
        else:
            assert (spec.low, spec.high, spec.choices) == (option.low, option.high, option.choices)
        assert name not in MODEL_KEYS  # campaign keys beyond name/backend/model are the options
        assert options_for(name), name
    assert set(parameters) == {'backend', 'model', *(o.parameter_name for o in all_options().values())}


def test_two_backends_share_an_option_only_as_one_declaration():
    from metavlm_ros.models.options import Backend
    from metavlm_ros.models.registry import register

    class Clash(Backend):
        name = 'clash'
        kinds = ('count',)
        options = (Option('max_new_tokens', int, 7, 'another default'),)

    with pytest.raises(TypeError, match='option max_new_tokens differs'):
        register(Clash)
    assert 'clash' not in BACKENDS


def test_model_identity_holds_what_changes_answers_and_not_where_they_run(tiny_clip_dir):
    one = model_identity('clip', str(tiny_clip_dir), {'device': 'cpu', 'batch_size': 4})
    two = model_identity('clip', str(tiny_clip_dir), {})
    assert one == two  # device and batch size do not change an answer
    assert one['weights_sha256'] and len(one['weights_sha256']) == 64
    assert one['options']['confidence'] == 'cosine'
    softmax = model_identity('clip', str(tiny_clip_dir), {'confidence': 'softmax'})
    assert softmax['options'] != one['options']


def test_no_module_outside_a_backends_own_branches_on_its_name():
    # The demo-model trainer trains the two demo models by name; it is the one place that may.
    allowed = {'demo/config.py', 'demo/training.py', 'commands/train_demo_models.py'}
    names = '|'.join(map(re.escape, BACKENDS))
    pattern = re.compile(rf"(==|!=)\s*'({names})'|'({names})'\s*(==|!=)|in \(('({names})',?\s*)+\)")
    offenders = []
    for path in PACKAGE.rglob('*.py'):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith('models/backends/') or relative in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f'{relative}:{number}: {line.strip()}')
    assert offenders == []


def test_the_backends_are_listed_in_one_order_whichever_module_was_imported_first():
    listed = set()
    for first in (
        'metavlm_ros.models.backends.served',
        'metavlm_ros.models.backends.chat',
        'metavlm_ros.models.vlm',
    ):
        code = f'import {first}; from metavlm_ros.models.registry import BACKENDS; print(list(BACKENDS))'
        listed.add(
            subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
        )
    assert listed == {str(list(BACKENDS)) + '\n'}
