"""The tester's settings (ros/tester_settings.py): parameters into settings, the violation status
(ros/tester_violations.py), and the identity record (ros/tester_identity.py: the shape `metavlm search`
and the demo write, any change refused, earlier records read as today's where they say as much)."""

import json

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from metavlm_ros import __version__
from metavlm_ros.cli import main
from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.record_format import SEARCH_SOURCE
from metavlm_ros.common.results import read_identity, write_identity
from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.method.search import Evaluation
from metavlm_ros.models.tiny import build_tiny_model
from metavlm_ros.models.vlm import answered_model_identity
from metavlm_ros.ros import tester_identity as ts
from metavlm_ros.ros.tester_identity import check_identity
from metavlm_ros.ros.tester_settings import (
    PARAMETERS,
    coerce_parameters,
    settings_from_parameters,
)
from metavlm_ros.ros.tester_violations import violation_status
from test.conftest import make_frame
from test.ros.tester_graph import values_of

SMALL = {'population': 6, 'evaluations': 12, 'seed': 2}


def settings_for(results, model_dir, **values):
    """The settings of an inprocess tester judging with the model in `model_dir`."""
    return settings_from_parameters(
        {
            'vlm_endpoint': 'inprocess',
            'model': str(model_dir),
            'device': 'cpu',
            'transport_size': 0,
            'results_dir': str(results),
            **SMALL,
            **values,
        }
    )


def holding_results(directory, identity):
    """A results directory that holds a search's records under `identity`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / 'evaluations.jsonl').write_text('{"index": 0}\n')
    write_identity(directory, identity)
    return directory


def earlier_record(directory, identity):
    """search.json as it was written before the one identity shape (format 1)."""
    record = {'format': 1, 'package': 'metavlm_ros', 'version': __version__, 'identity': identity}
    (directory / 'search.json').write_text(json.dumps(record, indent=1, sort_keys=True) + '\n')


def test_search_and_the_tester_record_one_identity_for_the_same_model_and_settings(tmp_path, tiny_clip_dir):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(96, 64)[..., ::-1])
    out = tmp_path / 'search'
    flags = [f'--{name}={value}' for name, value in SMALL.items()]
    command = ['search', str(image), '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet']
    assert main([*command, '--device', 'cpu', *flags, '--out', str(out)]) == 0
    searched = read_identity(out)

    settings = settings_for(tmp_path / 'ros', tiny_clip_dir)
    tester = json.loads(json.dumps(ts.tester_identity(settings, ts.tester_model_identity(settings))))
    # One record, settings and model alike (the whole weights digest, what the backend adds); they
    # differ only in how the frames reached the model.
    assert tester['settings'] == searched['settings']
    assert tester['model'] == searched['model'] and len(tester['model']['weights_sha256']) == 64
    assert searched['source'] == dict(SEARCH_SOURCE)
    assert tester['source'] == ts.tester_source(settings) and set(tester['source']) == set(SEARCH_SOURCE)
    assert {**tester, 'source': searched['source']} == searched
    # Each refuses the other's directory, naming how the frames came.
    with pytest.raises(ResultsError, match='source.image_transport: none there, "raw" here'):
        check_identity(settings_for(out, tiny_clip_dir), ts.tester_model_identity(settings))
    holding_results(tmp_path / 'ros', tester)
    assert main([*command, '--device', 'cpu', *flags, '--out', str(tmp_path / 'ros'), '--resume']) == 2


@pytest.mark.parametrize(
    ('change', 'named'),
    [
        ({'population': 8}, 'settings.population: 6 there, 8 here'),
        ({'seed': 3}, 'settings.seed: 2 there, 3 here'),
        ({'relations': ['rotation']}, 'settings.relations.enabled'),
        ({'thresholds': [0.05]}, 'settings.thresholds'),
        ({'working_size': 64}, 'settings.working_size: "auto" there, 64 here'),
        ({'confidence': 'softmax'}, 'model.options.confidence: "cosine" there, "softmax" here'),
        ({'classes': ['animal', 'trash']}, 'model.options.classes'),
        ({'transport_size': 32}, 'source.transport_size: 0 there, 32 here'),
        ({'image_transport': 'compressed'}, 'source.image_transport: "raw" there, "compressed" here'),
        ({'report_threshold': 0.01}, 'source.report_threshold: 0.05 there, 0.01 here'),
    ],
)
def test_the_tester_refuses_results_of_any_other_identity(tmp_path, tiny_clip_dir, change, named):
    settings = settings_for(tmp_path / 'results', tiny_clip_dir)
    holding_results(tmp_path / 'results', ts.tester_identity(settings, ts.tester_model_identity(settings)))
    assert check_identity(settings, ts.tester_model_identity(settings))  # the same: continued
    other = settings_for(tmp_path / 'results', tiny_clip_dir, **change)
    with pytest.raises(ResultsError) as refused:
        check_identity(other, ts.tester_model_identity(other))
    message = str(refused.value)
    assert message.startswith(
        f'parameter results_dir: {tmp_path / "results"} holds searches of another identity'
    )
    assert named in message and '\n' not in message


def test_the_tester_refuses_results_of_other_weights_or_another_endpoint(tmp_path, tiny_clip_dir):
    settings = settings_for(tmp_path / 'results', tiny_clip_dir)
    holding_results(tmp_path / 'results', ts.tester_identity(settings, ts.tester_model_identity(settings)))
    # The same directory retrained in place: other weights under the same name.
    retrained = tmp_path / 'model'
    build_tiny_model('clip', retrained, seed=1)
    stored = read_identity(tmp_path / 'results')
    stored['model']['model'] = str(retrained)
    write_identity(tmp_path / 'results', stored)
    moved = settings_for(tmp_path / 'results', retrained)
    with pytest.raises(ResultsError, match=r'model\.weights_sha256: "\w+\.\.\. there'):
        check_identity(moved, ts.tester_model_identity(moved))
    # The perception node's model: known by its name once it answers, not compared before.
    ros = settings_for(tmp_path / 'results', tiny_clip_dir, vlm_endpoint='ros')
    with pytest.raises(ResultsError, match='source.endpoint: "inprocess" there, "ros" here'):
        check_identity(ros, ts.tester_model_identity(ros))


def test_an_earlier_tester_record_of_the_perception_node_reads_as_today(tmp_path, tiny_clip_dir):
    ros = settings_for(tmp_path / 'results', tiny_clip_dir, vlm_endpoint='ros', transport_size=32)
    classes = ['animal', 'vegetation', 'object', 'trash']
    answered = answered_model_identity('demo-clip', classes)
    today = json.loads(json.dumps(ts.tester_identity(ros, answered)))
    # Before issue 28 the tester kept its source fields in the settings and its endpoint in the model.
    earlier = {
        'settings': {
            **today['settings'],
            'transport_size': 32,
            'image_transport': 'raw',
            'report_threshold': 0.05,
        },
        'model': {'endpoint': 'ros', 'model': 'demo-clip', 'classes': classes},
    }
    earlier_record(holding_results(tmp_path / 'results', today), earlier)
    assert check_identity(ros, answered) == ts.tester_identity(ros, answered)
    assert check_identity(ros, answered_model_identity(None, classes))  # not answered yet
    wider = settings_for(tmp_path / 'results', tiny_clip_dir, vlm_endpoint='ros', transport_size=64)
    with pytest.raises(ResultsError, match='source.transport_size: 32 there, 64 here'):
        check_identity(wider, answered)
    with pytest.raises(ResultsError, match='model.model: "demo-clip" there, "other" here'):
        check_identity(ros, answered_model_identity('other', classes))


def test_an_earlier_tester_record_of_an_inprocess_model_is_refused_in_one_line(tmp_path, tiny_clip_dir):
    settings = settings_for(tmp_path / 'results', tiny_clip_dir)
    today = ts.tester_identity(settings, ts.tester_model_identity(settings))
    # It named the weights by 12 hex digits and knew nothing of what the backend adds.
    earlier = {
        'settings': {
            **today['settings'],
            'transport_size': 0,
            'image_transport': 'raw',
            'report_threshold': 0.05,
        },
        'model': {
            'endpoint': 'inprocess',
            'model': str(tiny_clip_dir),
            'classes': list(today['model']['options']['classes']),
            'backend': 'clip',
            'weights_sha256': today['model']['weights_sha256'][:12],
            'options': today['model']['options'],
        },
    }
    earlier_record(holding_results(tmp_path / 'results', today), earlier)
    with pytest.raises(ResultsError) as refused:
        check_identity(settings, ts.tester_model_identity(settings))
    message = str(refused.value)
    assert message.startswith(
        f'parameter results_dir: {tmp_path / "results" / "search.json"}: written by an earlier'
    )
    assert 'another directory' in message and '\n' not in message


def test_settings_combine_generations_population_and_ranges():
    settings = settings_from_parameters(
        {'population': 5, 'generations': 3, 'evaluations': 999, 'ranges.rotation': [-2.0, 1.0], 'seed': 4}
    )
    assert settings.search.evaluations == 15
    assert settings.search.seed == 4
    assert settings.search.space.low[0] == -2.0 and settings.search.space.high[0] == 1.0
    assert settings.endpoint == 'ros' and settings.transport_size == 384
    # working_size: -1 (the default) is auto, 0 the camera's resolution.
    assert settings.search.working_size == 'auto'
    assert settings_from_parameters({'working_size': 0}).search.working_size is None
    assert settings_from_parameters({'working_size': 512}).search.working_size == 512
    with pytest.raises(ParameterError, match='class_prompts: 1 prompts for 4 classes'):
        settings_from_parameters({'class_prompts': ['a fish']})
    heave = settings_from_parameters({'relations': ['motion_blur'], 'ranges.motion_blur_angle': [90.0, 90.0]})
    assert heave.search.space.extra_low[9] == heave.search.space.extra_high[9] == (90.0,)
    with pytest.raises(
        ParameterError, match=r'^ranges.motion_blur_angle must be \[low, high\], got \[1.0\]$'
    ):
        settings_from_parameters({'ranges.motion_blur_angle': [1.0]})


def test_coerce_turns_integers_into_floats_only_for_double_parameters():
    out = coerce_parameters({'probe_timeout_s': 5, 'ranges.scaling': [1, 1.3], 'population': 30, 'other': 1})
    assert out == {'probe_timeout_s': 5.0, 'ranges.scaling': [1.0, 1.3], 'population': 30, 'other': 1}
    assert isinstance(out['probe_timeout_s'], float) and isinstance(out['population'], int)
    assert {p.name for p in PARAMETERS} >= {'vlm_endpoint', 'transport_size', 'frame_period_s', 'results_dir'}


def test_violation_status_levels_and_values():
    source = Prediction('count', {'animal': 2.0, 'vegetation': 0.0, 'object': 1.0, 'trash': 0.0})
    followup = Prediction('count', {'animal': 0.0, 'vegetation': 1.0, 'object': 1.0, 'trash': 0.0})
    comp = Composition.from_parameters({'rotation': 2.5, 'translation': -0.03})

    def evaluation(f_pred):
        return Evaluation(0, 0, np.zeros(12), comp, 1.5, f_pred, followup, {'count': True}, {'count': 3.0})

    # Eq. 2: 2/3 + 1/2 = 1.1667 < 4/2: a warning; 2.0 reaches half the classes: an error.
    warn = violation_status(evaluation(2 / 3 + 1 / 2), source, 42)
    error = violation_status(evaluation(2.0), source, 42)
    assert warn.level == DiagnosticStatus.WARN and error.level == DiagnosticStatus.ERROR
    kv = values_of(warn)
    assert warn.message == '{1,6}'
    assert kv['composition'] == '{1,6}' and kv['order'] == '2'
    assert float(kv['rotation']) == 2.5 and float(kv['translation']) == -0.03
    assert float(kv['f_trans']) == 1.5
    assert (
        kv['source/animal'] == '2.0' and kv['followup/animal'] == '0.0' and kv['followup/vegetation'] == '1.0'
    )
    assert kv['source_stamp'] == '42'
    blur = Composition.from_parameters({'motion_blur': 0.008, 'motion_blur_angle': -35.0})
    status = violation_status(Evaluation(0, 0, np.zeros(3), blur, 0.8, 1.0, followup, {}, {}), source, 42)
    assert values_of(status)['motion_blur'] == '0.008' and values_of(status)['motion_blur_angle'] == '-35.0'
