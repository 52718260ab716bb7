"""The tester node (ros/tester_node.py): scheduling, drops, run-time parameters, identity checks, start-up."""

import threading
from pathlib import Path

import pytest
from rclpy.parameter import Parameter

from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.results import read_identity, read_jsonl, records_file
from metavlm_ros.footage.frames import frame_digest
from metavlm_ros.ros.managed import bring_up
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from metavlm_ros.ros.tester_node import main
from test.conftest import make_frame
from test.ros.helpers import ros_context
from test.ros.tester_graph import StatsBackend, params


def test_frames_arriving_during_a_search_are_dropped_and_counted(graph):
    gate = threading.Event()
    g = graph(backend=StatsBackend(gate))
    frames = [make_frame(64, 48, seed=i) for i in range(5)]
    g.camera.publish(frames[0])
    g.wait(lambda: g.backend.entered.is_set(), 10, 'the first search to reach the model')
    for frame in frames[1:]:
        g.camera.publish(frame)
    g.wait(lambda: g.tester.frames_received == 5, 5, 'the camera frames')
    # One search runs (blocked in the model), one frame waits in the slot, the three before it went.
    assert g.tester.busy
    assert g.tester.frames_dropped == 3
    assert g.tester.has_pending_frame
    assert g.tester.camera_callback_max_s < 0.05
    gate.set()
    g.wait(lambda: g.tester.searches_done == 2, 20, 'the kept frame to be searched')
    images = {r['image'] for r in read_jsonl(g.results / 'summary.jsonl')}
    assert images == {f'camera@{g.camera.stamps[0]}', f'camera@{g.camera.stamps[4]}'}


def test_run_time_changes_are_validated_with_a_reason(graph):
    g = graph()
    tester = g.tester
    refused = tester.set_parameters([Parameter('report_threshold', value=0.02)])[0]
    assert not refused.successful
    assert 'report_threshold 0.02 must be one of the thresholds 0.01, 0.03, 0.05' in refused.reason
    out_of_range = tester.set_parameters([Parameter('ranges.rotation', value=[-9.0, 5.0])])[0]
    assert not out_of_range.successful
    reason = 'ranges.rotation: MR1 rotation angle -9.0 is outside the allowed range [-5, 5]'
    assert out_of_range.reason == reason
    inverted = tester.set_parameters([Parameter('ranges.scaling', value=[1.2, 0.8])])[0]
    assert not inverted.successful and inverted.reason.startswith('ranges.scaling: ')
    too_small = tester.set_parameters([Parameter('violation_image_height', value=8)])[0]
    assert not too_small.successful and 'violation_image_height' in too_small.reason
    assert tester.settings.violation_image_height == 360  # a refused value never reaches the settings
    fixed = tester.set_parameters([Parameter('vlm_endpoint', value='ros')])[0]
    assert not fixed.successful
    assert tester.settings.search.population == 6
    accepted = tester.set_parameters(
        [Parameter('population', value=8), Parameter('relations', value=['shear'])]
    )
    assert all(r.successful for r in accepted)
    assert tester.settings.search.population == 8
    assert tester.settings.search.space.enabled_ids == ('shear',)
    underwater = tester.set_parameters([Parameter('relations', value=['paper', 'turbidity', 'marine_snow'])])
    assert underwater[0].successful
    assert tester.settings.search.space.enabled_ids[6:] == ('turbidity', 'marine_snow')
    unknown = tester.set_parameters([Parameter('relations', value=['fog'])])[0]
    assert not unknown.successful and unknown.reason.startswith("relations: unknown relation 'fog'")
    assert '\n' not in unknown.reason


def test_the_angle_range_parameter_fixes_or_frees_the_blur_direction_of_the_searches(graph):
    g = graph(relations=['motion_blur'], **{'ranges.motion_blur_angle': [90.0, 90.0]})
    assert g.tester.settings.search.space.extra_bounds()[0].tolist() == [90.0]
    g.camera.publish(make_frame(160, 120, seed=5))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    records = read_jsonl(g.results / 'evaluations.jsonl')
    blurred = [r['parameters'] for r in records if r['order'] > 0]
    assert blurred and {p['motion_blur_angle'] for p in blurred} == {90.0}
    assert read_identity(g.results)['settings']['relations']['extras'] == {'motion_blur_angle': [90.0, 90.0]}
    # Out of range: one line naming the parameter; another range: another identity, refused here.
    wrong = g.tester.set_parameters([Parameter('ranges.motion_blur_angle', value=[-95.0, 0.0])])[0]
    assert not wrong.successful
    assert wrong.reason == (
        'ranges.motion_blur_angle: MR10 motion_blur angle -95.0 is outside the allowed range [-90, 90]'
    )
    free = g.tester.set_parameters([Parameter('ranges.motion_blur_angle', value=[-90.0, 90.0])])[0]
    assert (
        not free.successful
        and 'settings.relations.extras.motion_blur_angle: [90.0, 90.0] there' in free.reason
    )
    elsewhere = [
        Parameter('results_dir', value=str(g.results) + '-free'),
        Parameter('ranges.motion_blur_angle', value=[-90.0, 90.0]),
    ]
    assert g.tester.set_parameters_atomically(elsewhere).successful
    assert g.tester.settings.search.space.extra_bounds()[1].tolist() == [90.0]


def test_the_water_type_range_takes_jerlov_names_or_indices_and_records_indices(graph):
    # As `ros2 param set /metavlm_tester ranges.water_type "['II', '5C']"` sets it: a string array.
    g = graph(relations=['water'], **{'ranges.water_type': ['II', '5C']})
    low, high = g.tester.settings.search.space.extra_bounds()
    assert (low[0], high[0]) == (3.0, 7.0)  # water's first extra: its type
    g.camera.publish(make_frame(48, 36, seed=2))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    assert read_identity(g.results)['settings']['relations']['extras']['water_type'] == [3.0, 7.0]
    types = {r['parameters']['water_type'] for r in read_jsonl(g.results / 'evaluations.jsonl') if r['order']}
    assert types and all(3.0 <= t <= 7.0 for t in types)
    unknown = g.tester.set_parameters([Parameter('ranges.water_type', value=['II', 'XI'])])[0]
    assert not unknown.successful
    assert unknown.reason == (
        "ranges.water_type: unknown Jerlov water type 'XI'; known: I, IA, IB, II, III, 1C, 3C, 5C, 7C, 9C "
        'or an index 0-9'
    )
    one = g.tester.set_parameters([Parameter('ranges.water_type', value='II')])[0]
    assert not one.successful and one.reason == "ranges.water_type must be [low, high], got 'II'"
    # Numbers as `"[2, 5]"` gives them (integers), into another directory: another identity.
    indices = [
        Parameter('results_dir', value=str(g.results) + '-2-5'),
        Parameter('ranges.water_type', value=[2, 5]),
    ]
    assert g.tester.set_parameters_atomically(indices).successful
    low, high = g.tester.settings.search.space.extra_bounds()
    assert (low[0], high[0]) == (2.0, 5.0)
    # A name at one end, an index between types at the other: a ROS array holds one type, so both are
    # strings (`"['1C', '7.5']"`), each end read as the name or the number it is.
    mixed = [
        Parameter('results_dir', value=str(g.results) + '-mixed'),
        Parameter('ranges.water_type', value=['1C', '7.5']),
    ]
    assert g.tester.set_parameters_atomically(mixed).successful
    low, high = g.tester.settings.search.space.extra_bounds()
    assert (low[0], high[0]) == (5.0, 7.5)


def test_a_new_transport_size_applies_to_the_next_search(graph):
    g = graph(transport_size=64)
    g.camera.publish(make_frame(160, 120, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the first search')
    assert set(g.backend.shapes) == {(48, 64, 3)}
    # Other searches go to another results directory: one directory holds searches of one identity.
    change = [Parameter('transport_size', value=40), Parameter('results_dir', value=str(g.results) + '-40')]
    assert g.tester.set_parameters_atomically(change).successful
    g.backend.shapes.clear()
    g.camera.publish(make_frame(160, 120, seed=2))
    g.wait(lambda: g.tester.searches_done == 2, message='the second search')
    # 160x120 -> longer side 40: 40x30, source and follow-ups alike.
    assert set(g.backend.shapes) == {(30, 40, 3)}
    assert len(read_jsonl(Path(str(g.results) + '-40') / 'summary.jsonl')) == 1


def test_the_results_directory_records_the_identity_of_its_searches(graph):
    g = graph()
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    identity = read_identity(g.results)
    assert identity['settings']['population'] == 6 and identity['settings']['evaluations'] == 18
    assert identity['settings']['relations']['enabled'] == [True] * 6
    assert identity['source'] == {
        'endpoint': 'inprocess',
        'transport_size': 0,
        'image_transport': 'raw',
        'report_threshold': 0.01,
    }
    # A model handed over ready-made is known by what it says of itself.
    assert identity['model'] == {
        'backend': 'stats',
        'model': 'stats',
        'weights_sha256': None,
        'options': {'classes': list(StatsBackend.classes)},
    }
    # Each record names the pixels its search searched.
    digest = frame_digest(make_frame(96, 72, seed=1))
    assert {r['frame_sha256'] for r in read_jsonl(g.results / 'evaluations.jsonl')} == {digest}
    assert read_jsonl(g.results / 'summary.jsonl')[0]['frame_sha256'] == digest
    # A run-time change that would make the next searches another search is refused, naming it;
    # together with a new results_dir it is taken.
    refused = g.tester.set_parameters([Parameter('population', value=8)])[0]
    assert not refused.successful
    assert refused.reason.startswith(f'parameter results_dir: {g.results} holds searches of another identity')
    assert 'settings.population: 6 there, 8 here' in refused.reason
    assert g.tester.settings.search.population == 6
    other = str(g.results) + '-p8'
    assert g.tester.set_parameters([Parameter('results_dir', value=other)])[0].successful
    assert g.tester.set_parameters([Parameter('population', value=8)])[0].successful
    # Changes outside the identity stay free.
    assert g.tester.set_parameters([Parameter('frame_period_s', value=0.5)])[0].successful


def test_a_restart_into_results_of_another_search_is_refused_naming_what_differs(graph, tmp_path):
    g = graph()
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    before = records_file(g.results / 'evaluations.jsonl').read_bytes()
    g.close()
    with ros_context() as context:
        tester = MetaVLMTester(
            context=context,
            backend=StatsBackend(),
            parameter_overrides=params(results_dir=str(g.results), population=4, seed=3),
        )
        try:
            with pytest.raises(ResultsError) as refused:
                bring_up(tester)
        finally:
            tester.destroy_node()
    message = str(refused.value)
    assert '\n' not in message
    assert 'settings.population: 6 there, 4 here' in message and 'settings.seed: 0 there, 3 here' in message
    assert records_file(g.results / 'evaluations.jsonl').read_bytes() == before
    # Results without an identity record (an older tester's) cannot be continued either.
    (g.results / 'search.json').unlink()
    with ros_context() as context:
        tester = MetaVLMTester(
            context=context, backend=StatsBackend(), parameter_overrides=params(results_dir=str(g.results))
        )
        try:
            with pytest.raises(ResultsError, match='holds results without an identity record'):
                bring_up(tester)
        finally:
            tester.destroy_node()
    assert records_file(g.results / 'evaluations.jsonl').read_bytes() == before


@pytest.mark.parametrize(
    ('name', 'value', 'words'),
    [
        ('population', 1, 'population'),
        ('relations', ['warp'], 'warp'),
        ('ranges.translation', [-0.05, 0.03], 'ranges.translation'),
        ('probe_timeout_s', 0.0, 'probe_timeout_s'),
        ('algorithm', 'hill', 'algorithm'),
    ],
)
def test_invalid_parameters_at_start_raise_a_parameter_error(tmp_path, name, value, words):
    with ros_context() as context:
        with pytest.raises(ParameterError, match=words):
            MetaVLMTester(
                context=context, backend=StatsBackend(), parameter_overrides=params(**{name: value})
            )


def test_main_exits_1_with_one_line_on_invalid_parameters(capsys):
    code = main(['--ros-args', '-p', 'population:=1', '-p', 'vlm_endpoint:=inprocess'])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith('metavlm_tester: error: parameter population')
    code = main(['--ros-args', '-p', 'relations:=[rotation, fog]', '-p', 'vlm_endpoint:=inprocess'])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("metavlm_tester: error: relations: unknown relation 'fog'"), err


def test_the_algorithm_parameter_runs_any_registered_search_mobo_included(graph):
    g = graph(algorithm='mobo')
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    records = read_jsonl(g.results / 'evaluations.jsonl')
    assert len(records) == 18 and {r['algorithm'] for r in records} == {'mobo'}
    assert read_identity(g.results)['settings']['algorithm'] == 'mobo'
