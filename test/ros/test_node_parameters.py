"""Every parameter of both nodes: a wrong value is one line naming the parameter, at start or configure."""

import subprocess
import sys

import pytest
from rclpy.parameter import Parameter

from metavlm_ros.common.errors import MetaVLMError
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.perception_node import PerceptionNode
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from test.ros.helpers import ros_context

# rclpy's own parameters, checked by rclpy.
RCLPY_PARAMETERS = {'use_sim_time', 'start_type_description_service'}

# parameter -> wrong values (each must be refused, naming the parameter).
# The backends' options, the same parameters in both nodes (models/registry.py).
BACKEND_OPTIONS_WRONG = {
    'answer_format': ['yaml'],
    'confidence_question': ['Is it there?'],
    'kind': ['caption'],
    'box_format': ['yolo'],
    'score_threshold': [1.5, -0.1],
    'nms_iou': [1.5, -0.1],
    'max_new_tokens': [0, 5000],
    'preprocess': ['opencv'],
    'image_processor': ['fast'],
    'prompts': ['authors'],
    'vocabularies': [['trash'], ['mammal=seal']],
    'endpoint': ['http://127.0.0.1:9/v1'],  # the default backend (clip) takes no endpoint
    'api_key_env': ['KEY'],
    'timeout_s': [0.0, -1.0],
    'retries': [-1],
    'max_in_flight': [0],
    'input_side': [-1],
    'cache_size': [-1],
}
PERCEPTION_WRONG = {
    **BACKEND_OPTIONS_WRONG,
    'autostart': ['maybe'],
    'backend': ['gpt', 3],
    'batch_wait_ms': [1001, -1, 'soon'],
    'class_prompts': [['a fish']],
    'classes': [['fish', 'fish'], []],
    'confidence': ['max'],
    'device': ['gpu', 'cuda:x', ''],
    'dtype': ['float8'],
    'image_transport': ['theora'],
    'max_batch': [0, 257, 2.5],
    'model': [5, '/no/such/model'],
    'prompt': [5],
}
TESTER_WRONG = {
    **BACKEND_OPTIONS_WRONG,
    'algorithm': ['sgd'],
    'autostart': ['maybe'],
    'backend': ['gpt'],
    'class_prompts': [['a fish']],
    'classes': [['fish', 'fish'], []],
    'confidence': ['max'],
    'device': ['gpu'],
    'criteria_file': ['/no/such/criteria.yaml', 'config/metavlm.yaml'],
    'dtype': ['float8'],
    'evaluations': [0],
    'frame_period_s': [-1.0, 'often'],
    'foxglove_port': [-1, 65536, 'eighty'],
    'foxglove_host': ['', '127.0.0.1:8765', 'my robot'],
    'generations': [-1],
    'image_transport': ['theora'],
    'max_batch': [0],
    'min_free_disk_mb': [-5],
    'modes_period_s': [-1.0],
    'modes_sample': [10],
    'model': [5, '/no/such/model'],
    'population': [1, 'many'],
    'probe_timeout_s': [0.0],
    'prompt': [5],
    'publish_violation_images': ['yes'],
    'find_inserted': ['yes'],
    'iou_threshold': [0.0, 1.5],
    'ranges.downsampling': [[0.5, 1.0]],
    'ranges.histogram_equalization': [[0.0, 3.0]],
    'ranges.rotation': [[-9.0, 5.0], [1.0]],
    'ranges.scaling': [[1.2, 0.8]],
    'ranges.shear': [[0.0, 1.0]],
    'ranges.translation': [[0.0, 0.5]],
    'ranges.colour_cast': [[0.0, 11.0]],
    'ranges.turbidity': [[-1.0, 2.0]],
    'ranges.marine_snow': [[0.0, 700.0]],
    'ranges.motion_blur': [[0.0, 0.5]],
    'ranges.motion_blur_angle': [[-91.0, 0.0], [30.0, 10.0], [0.0]],
    'ranges.low_light': [[2.0, 1.0]],
    'ranges.water': [[-1.0, 2.0], [0.0, 11.0]],
    'ranges.water_type': [[0.0, 9.5], ['II', 'XI'], 'II', [True, False]],
    'ranges.water_depth': [[5.0, 1.0]],
    'ranges.water_lamp_power': [[-1.0, 0.0]],
    'ranges.water_scene_range': [[0.0, 1.0]],
    'ranges.water_tilt': [[0.0, 91.0]],
    'ranges.water_fov': [[5.0, 60.0]],
    'ranges.insertion': [[0.0, 0.5]],
    'ranges.insertion_class': [[0.0, 4.0], ['animal', 'whale']],
    'ranges.insertion_x': [[-0.1, 1.0]],
    'ranges.insertion_y': [[0.8, 0.2]],
    'relations': [['teleport'], []],
    'report_threshold': [0.02],
    'results_dir': ['', '/proc/no/such/place'],
    'seed': [-1],
    'thresholds': [[0.0], [1.5]],
    'transport_size': [-1],
    'violation_image_height': [8],
    'violation_pngs_per_search': [-1],
    'pareto_pngs': [-2],
    'results_max_mb': [-1],
    'vlm_endpoint': ['cloud'],
    'working_size': [-2],
}
NODES = {'perception': (PerceptionNode, PERCEPTION_WRONG), 'tester': (MetaVLMTester, TESTER_WRONG)}


def _declared(node_class) -> set[str]:
    with ros_context() as context:
        node = node_class(context=context)
        try:
            return set(node.list_parameters([], 0).names) - RCLPY_PARAMETERS
        finally:
            node.destroy_node()


@pytest.mark.parametrize('node', NODES)
def test_every_parameter_has_wrong_values_under_test(node):
    node_class, wrong = NODES[node]
    assert _declared(node_class) == set(wrong)


CASES = [
    (node, name, value)
    for node, (_, wrong) in NODES.items()
    for name, values in wrong.items()
    for value in values
]


@pytest.mark.parametrize(('node', 'name', 'value'), CASES, ids=[f'{n}-{p}-{v!r}' for n, p, v in CASES])
def test_a_wrong_value_is_one_line_naming_the_parameter(tmp_path, node, name, value):
    node_class = NODES[node][0]
    overrides = [Parameter(name, value=value)]
    if node == 'tester' and name not in ('results_dir', 'vlm_endpoint'):
        overrides.append(Parameter('results_dir', value=str(tmp_path / 'results')))
    if node == 'tester' and name in ('model', 'backend', 'device', 'dtype', 'class_prompts', 'max_batch'):
        overrides.append(Parameter('vlm_endpoint', value='inprocess'))  # the tester's own model then
    with ros_context() as context:
        try:
            made = node_class(context=context, parameter_overrides=overrides)
        except MetaVLMError as exc:
            message = str(exc)
        else:
            # Only what needs the model or the disk is known to be wrong at configure.
            try:
                with pytest.raises(MetaVLMError) as refused:
                    bring_up(made)
                message = str(refused.value)
            finally:
                made.destroy_node()
    assert '\n' not in message, message
    assert name in message, message


@pytest.mark.parametrize(
    ('module', 'argument', 'needle'),
    [
        ('perception_node', 'device:=gpu', 'metavlm_perception: error: parameter device'),
        ('tester_node', 'vlm_endpoint:=cloud', 'metavlm_tester: error: parameter vlm_endpoint'),
        ('tester_node', 'autostart:=maybe', 'metavlm_tester: error: parameter autostart'),
    ],
)
def test_a_node_started_with_a_wrong_value_prints_one_line_and_exits_1(module, argument, needle):
    done = subprocess.run(
        [sys.executable, '-m', f'metavlm_ros.ros.{module}', '--ros-args', '-p', argument],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(needle), done.stderr
    assert 'Traceback' not in done.stdout + done.stderr


def test_both_nodes_declare_the_model_parameters_from_one_table():
    from metavlm_ros.models.vlm import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE
    from metavlm_ros.ros.parameters import MODEL_PARAMETERS
    from metavlm_ros.ros.perception_node import PARAMETERS as PERCEPTION
    from metavlm_ros.ros.tester_settings import PARAMETERS as TESTER

    limits = ('default', 'low', 'high', 'choices', 'check', 'array_type')
    for table in (PERCEPTION, TESTER):
        declared = {spec.name: spec for spec in table}
        for spec in MODEL_PARAMETERS:
            assert [getattr(declared[spec.name], f) for f in limits] == [getattr(spec, f) for f in limits]
    # max_batch: one documented default and range (it was 32 of 1..4096 in one node, 16 of 1..256 in
    # the other), the model's own default batch.
    max_batch = {spec.name: spec for spec in MODEL_PARAMETERS}['max_batch']
    assert (max_batch.default, max_batch.low, max_batch.high) == (DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE)
    from metavlm_ros.models.registry import resolve_options

    assert resolve_options('clip', {})['batch_size'] == DEFAULT_BATCH_SIZE


def test_the_box_criteria_reach_the_testers_searches():
    from metavlm_ros.ros.tester_settings import PARAMETERS, settings_from_parameters

    values = {p.name: p.default for p in PARAMETERS}
    assert (settings_from_parameters(values).search.iou_threshold, values['find_inserted']) == (0.5, False)
    values.update(iou_threshold=0.7, find_inserted=True)
    search = settings_from_parameters(values).search
    assert (search.iou_threshold, search.find_inserted) == (0.7, True)
