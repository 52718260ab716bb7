"""The campaign file's schema (campaign/config.py): every problem listed, defaults, paths, the examples."""

from pathlib import Path

import pytest

from metavlm_ros.campaign.config import load_config, parse_config
from metavlm_ros.common.errors import ParameterError
from test.campaign.configs import small_config


def test_invalid_config_lists_every_problem(tmp_path, tiny_clip_dir):
    data = {
        'frames': {'sources': ['missing-folder'], 'every': 0},
        'models': [
            {'backend': 'clip', 'model': str(tiny_clip_dir)},
            {'backend': 'x', 'model': './nowhere', 'colour': 1},
        ],
        'algorithms': ['nsga2', 'hillclimb'],
        'runs': 0,
        'population': 'thirty',
        'thresholds': [0.01, 1.5],
        'budget': 10,
    }
    with pytest.raises(ParameterError) as info:
        parse_config(data, base_dir=tmp_path, source='c.yaml')
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith('c.yaml: 10 problems: ')
    for expected in (
        'budget: unknown key',
        'frames.every: must be >= 1, got 0',
        f'frames.sources[0]: no such file or directory: {tmp_path / "missing-folder"}',
        'models[1].colour: unknown key',
        'models[1].backend: unknown backend "x"',
        f'models[1].model: no such model directory: {tmp_path / "nowhere"}',
        'algorithms[1]: unknown algorithm "hillclimb"',
        'runs: must be >= 1, got 0',
        "population: must be an integer, got 'thirty'",
        'thresholds[1]: must lie in (0, 1), got 1.5',
    ):
        assert expected in message


def test_config_file_defaults_and_relative_paths(tmp_path, image_dir, tiny_clip_dir):
    path = tmp_path / 'campaign.yaml'
    path.write_text(f'frames: [images]\nmodels:\n  - backend: clip\n    model: {tiny_clip_dir}\n')
    config = load_config(path)
    assert config.frames.sources == (str(image_dir.resolve()),)
    # docs/method.md §7 defaults, and the paper's 10 runs.
    assert (config.runs, config.population, config.evaluations, config.algorithms) == (
        10,
        30,
        3000,
        ('nsga2', 'random'),
    )
    assert config.models[0].name == f'clip:{Path(tiny_clip_dir).name}'
    path.write_text('frames: [images]\nmodels: [{backend: clip, model: ./absent}]\n')
    with pytest.raises(ParameterError, match=r'models\[0\]\.model: no such model directory'):
        load_config(path)
    path.write_text('frames: [images\n')
    with pytest.raises(ParameterError, match='not valid YAML'):
        load_config(path)


def test_any_registered_algorithm_and_a_baseline_may_be_configured(image_dir, tiny_clip_dir):
    config = small_config(
        image_dir, tiny_clip_dir, algorithms=['smsemoa', 'moead', 'nsga2'], baseline='nsga2'
    )
    assert config.algorithms == ('smsemoa', 'moead', 'nsga2') and config.baseline == 'nsga2'
    # The baseline only changes the report: the campaign's identity is the same without it.
    plain = small_config(image_dir, tiny_clip_dir, algorithms=['smsemoa', 'moead', 'nsga2'])
    assert config.fingerprint() == plain.fingerprint() and 'baseline' not in plain.to_dict()
    assert config.to_dict()['baseline'] == 'nsga2'
    with pytest.raises(
        ParameterError, match=r'baseline: must be one of the algorithms \(nsga2, random\) or all'
    ):
        small_config(image_dir, tiny_clip_dir, baseline='moead')
    with pytest.raises(
        ParameterError, match='unknown algorithm "hill" .*nsga2, random, nsga3, smsemoa, moead'
    ):
        small_config(image_dir, tiny_clip_dir, algorithms=['hill'])
    with pytest.raises(ParameterError, match="relations: unknown relation 'fog'"):
        small_config(image_dir, tiny_clip_dir, relations={'enabled': ['paper', 'fog']})


def test_models_take_the_paper_prompt_preset(image_dir, tiny_clip_dir):
    config = small_config(
        image_dir,
        tiny_clip_dir,
        models=[{'backend': 'clip', 'model': str(tiny_clip_dir), 'prompts': 'paper'}],
    )
    assert config.models[0].options['prompts'] == 'paper'
    assert small_config(image_dir, tiny_clip_dir).models[0].options['prompts'] == 'default'
    from metavlm_ros.campaign.executors import _backend_for
    from metavlm_ros.models.vlm import PAPER_CLASS_PROMPTS

    assert _backend_for(config.models[0].key()).class_prompts == PAPER_CLASS_PROMPTS
    with pytest.raises(ParameterError, match=r"models\[0\]: prompts: 'x' is not one of default, paper"):
        small_config(
            image_dir,
            tiny_clip_dir,
            models=[{'backend': 'clip', 'model': str(tiny_clip_dir), 'prompts': 'x'}],
        )


@pytest.mark.parametrize('name', ['demo-campaign.yaml', 'demo-rq1.yaml', 'underwater-campaign.yaml'])
def test_the_example_campaigns_are_valid(name):
    config = load_config(Path(__file__).resolve().parents[2] / 'examples' / name)
    if name == 'demo-rq1.yaml':
        # RQ1 needs runs enough to show an A12 of 0.7-0.9 (docs/demo.md), at the demo's budget.
        assert (config.runs, config.population, config.evaluations) == (20, 30, 300)
    if name.startswith('underwater'):
        assert config.relations == {'enabled': ['turbidity', 'marine_snow']}
        assert config.algorithms == ('nsga2', 'smsemoa', 'random') and config.baseline == 'random'


def test_the_box_criteria_are_campaign_settings_outside_the_identity_at_their_defaults(
    image_dir, tiny_clip_dir
):
    base = {
        'frames': {'sources': [str(image_dir)]},
        'models': [{'backend': 'clip', 'model': str(tiny_clip_dir)}],
    }
    plain = parse_config(base, base_dir=image_dir.parent)
    strict = parse_config({**base, 'iou_threshold': 0.7, 'find_inserted': True}, base_dir=image_dir.parent)
    # A campaign that does not set them keeps the identity it had before they existed.
    assert not {'iou_threshold', 'find_inserted'} & set(plain.identity())
    assert (strict.identity()['iou_threshold'], strict.identity()['find_inserted']) == (0.7, True)
    assert strict.fingerprint() != plain.fingerprint()
    cell = strict.search_config('nsga2', 1)
    assert (cell.iou_threshold, cell.find_inserted) == (0.7, True)
    with pytest.raises(ParameterError) as info:
        parse_config({**base, 'iou_threshold': 0, 'find_inserted': 'yes'}, base_dir=image_dir.parent)
    assert 'iou_threshold: must lie in (0, 1], got 0' in str(info.value)
    assert "find_inserted: must be true or false, got 'yes'" in str(info.value)
