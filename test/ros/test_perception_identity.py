"""The perception node answers with its identity, options included (ros/perception_node.py): the tester
records it as an in-process run would, `--resume` and `metavlm compare` refuse a changed option."""

import json

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter

from metavlm_ros.cli import main
from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.results import read_identity, read_jsonl
from metavlm_ros.ros import tester_identity as ts
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.perception_node import PerceptionNode
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from metavlm_ros.ros.tester_settings import settings_from_parameters
from test.conftest import make_frame
from test.ros.helpers import CameraPublisher, ros_context, wait_for

SEARCH = {'population': 6, 'evaluations': 12, 'seed': 3, 'frame_period_s': 0.0, 'transport_size': 48}


def node_values(results, endpoint, model, prompts):
    return {
        'vlm_endpoint': endpoint,
        'model': str(model),
        'device': 'cpu',
        'prompts': prompts,
        'results_dir': str(results),
        **SEARCH,
    }


def through_the_perception_node(context, results, model, prompts, done):
    """Run a perception node with `prompts` and a tester (ros endpoint) writing to `results`, until
    `done(tester)`; returns the tester's last error and what its probe client heard of the model."""
    perception = PerceptionNode(
        context=context,
        parameter_overrides=[
            Parameter(k, value=v) for k, v in (('model', str(model)), ('device', 'cpu'), ('prompts', prompts))
        ],
    )
    bring_up(perception)
    values = node_values(results, 'ros', model, 'default')  # the tester's own model options are not asked
    tester = MetaVLMTester(
        context=context, parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]
    )
    bring_up(tester)
    camera = CameraPublisher(context)
    nodes = [perception, tester, camera]
    executor = SingleThreadedExecutor(context=context)
    for node in nodes:
        executor.add_node(node)
    try:
        ready = lambda: camera.publisher.get_subscription_count() > 0 and tester._endpoint_ready()  # noqa: E731
        wait_for(ready, 10, executor, 'the tester and the perception node')
        camera.publish(make_frame(96, 72, seed=4), 2_000_000_000)
        wait_for(lambda: done(tester), 30, executor, f'the tester on {results.name}')
        return tester.last_error, dict(tester.probe.identity), perception.identity
    finally:
        executor.shutdown(timeout_sec=2)
        for node in nodes:
            node.destroy_node()


@pytest.fixture(scope='module')
def runs(tmp_path_factory, tiny_clip_dir):
    """Two searches through the perception node (its default and the paper's prompts), and a tester
    resuming the first one's results with the paper's prompts."""
    root = tmp_path_factory.mktemp('identity')
    out = {'root': root}
    with ros_context() as context:
        searched = lambda tester: tester.searches_done == 1  # noqa: E731
        for prompts in ('default', 'paper'):
            _, heard, said = through_the_perception_node(
                context, root / prompts, tiny_clip_dir, prompts, searched
            )
            out[prompts] = {'heard': heard, 'said': said}
        before = read_jsonl(root / 'default' / 'evaluations.jsonl')
        refused = lambda tester: 'holds searches of another identity' in tester.last_error  # noqa: E731
        error, _, _ = through_the_perception_node(context, root / 'default', tiny_clip_dir, 'paper', refused)
        out['resumed'] = {'error': error, 'before': before}
    return out


def test_the_tester_records_the_perception_nodes_options_as_an_in_process_run(runs, tiny_clip_dir):
    for prompts in ('default', 'paper'):
        results = runs['root'] / prompts
        stored = read_identity(results)
        inprocess = settings_from_parameters(node_values(results, 'inprocess', tiny_clip_dir, prompts))
        expected = json.loads(json.dumps(ts.tester_model_identity(inprocess)))
        # The model part word for word: backend, model, whole weights digest, every option, what the
        # backend adds; the perception node said it, the probe client heard it, the tester wrote it.
        assert stored['model'] == expected == runs[prompts]['heard']
        assert stored['model']['options']['prompts'] == prompts
        assert json.loads(json.dumps(runs[prompts]['said'])) == expected
        ros = settings_from_parameters(node_values(results, 'ros', tiny_clip_dir, 'default'))
        assert stored['source']['endpoint'] == 'ros'
        assert stored == json.loads(json.dumps(ts.tester_identity(ros, expected)))


def test_resuming_with_other_prompts_is_refused_and_adds_nothing(runs):
    error = runs['resumed']['error']
    assert error.startswith('parameter results_dir:') and '\n' not in error
    assert 'model.options.prompts: "default" there, "paper" here' in error
    results = runs['root'] / 'default'
    assert read_jsonl(results / 'evaluations.jsonl') == runs['resumed']['before']
    # The same check, as the tester makes it, for the identity the paper's node answered with.
    ros = settings_from_parameters(node_values(results, 'ros', 'x', 'default'))
    with pytest.raises(ResultsError, match='model.options.prompts'):
        ts.check_identity(ros, runs['paper']['heard'])


def test_compare_refuses_two_prompt_settings_naming_the_option(runs, capsys):
    root = runs['root']
    code = main(['compare', str(root / 'default'), str(root / 'paper'), '--out', str(root / 'compared')])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "metavlm: error: not comparable: .: model.options.prompts is 'default' in BASE, "
        "'paper' in CANDIDATE\n"
    )
