"""Both nodes as managed nodes: configure, activate, deactivate, cleanup, shutdown; the tester's services."""

import time

import pytest
from lifecycle_msgs.msg import State
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from std_srvs.srv import Trigger

from metavlm_ros.common.results import read_jsonl, records_file
from metavlm_ros.ros.managed import bring_up, state_label
from metavlm_ros.ros.perception_node import PerceptionNode
from test.conftest import make_frame
from test.ros.helpers import ros_context, wait_for

SUCCESS = TransitionCallbackReturn.SUCCESS
LONG = {'evaluations': 1_000_000, 'population': 6}  # a search that only ends when stopped


def feed(g, frame, enough, what, timeout=20.0, period=0.2):
    """Publish `frame` every `period` seconds until `enough()`; fail after `timeout` seconds.

    Not at every spin step: a frame per spin step floods the tester's subscription and starves its
    search thread (12 evaluations took 19 s that way on a busy machine).
    """
    last = [-period]

    def fed() -> bool:
        if enough():
            return True
        if time.monotonic() - last[0] >= period:
            g.camera.publish(frame)
            last[0] = time.monotonic()
        return False

    g.wait(fed, timeout, what)


def test_tester_goes_through_every_transition_and_a_deactivated_search_keeps_its_summary(graph):
    g = graph(start=False, **LONG)
    tester = g.tester
    assert state_label(tester) == 'unconfigured' and tester.backend is None
    assert tester.trigger_configure() == SUCCESS
    assert state_label(tester) == 'inactive' and tester.backend is not None
    assert (
        records_file(g.results / 'evaluations.jsonl').exists() or g.results.is_dir()
    )  # the results are open
    frame = make_frame(seed=5)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # inactive: not subscribed to the camera, nothing searched
        g.camera.publish(frame)
        g.executor.spin_once(timeout_sec=0.05)
    assert tester.frames_received == 0 and tester.evaluations == 0

    assert tester.trigger_activate() == SUCCESS
    g.wait(lambda: g.camera.publisher.get_subscription_count() > 0, 5, 'the camera subscription')
    g.camera.publish(frame)
    feed(g, frame, lambda: tester.evaluations >= 12, 'a running search')

    assert tester.trigger_deactivate() == SUCCESS  # returns once the search stopped
    assert state_label(tester) == 'inactive' and not tester.busy
    (summary,) = read_jsonl(g.results / 'summary.jsonl')
    assert summary['stopped'] is True and summary['evaluations'] == tester.evaluations
    assert len(read_jsonl(g.results / 'evaluations.jsonl')) == tester.evaluations
    assert records_file(g.results / 'pareto.jsonl').exists()
    assert tester.state == 'inactive' and tester.searches_stopped == 1
    g.wait(lambda: g.camera.publisher.get_subscription_count() == 0, 5, 'the camera unsubscribed')

    # Active again: testing resumes.
    done = tester.evaluations
    assert tester.trigger_activate() == SUCCESS
    feed(g, frame, lambda: tester.evaluations > done, 'a search once reactivated')
    assert tester.trigger_deactivate() == SUCCESS
    assert tester.trigger_cleanup() == SUCCESS
    assert state_label(tester) == 'unconfigured' and tester.backend is None
    assert len(read_jsonl(g.results / 'summary.jsonl')) == 2
    assert tester.trigger_shutdown() == SUCCESS
    assert tester.finalized and state_label(tester) == 'finalized'


def test_shutdown_from_active_stops_the_search_and_writes_its_summary(graph):
    g = graph(**LONG)
    tester = g.tester
    frame = make_frame(seed=6)
    g.camera.publish(frame)
    feed(g, frame, lambda: tester.evaluations >= 12, 'a running search')
    started = time.monotonic()
    assert tester.trigger_shutdown() == SUCCESS
    assert time.monotonic() - started < 5.0
    (summary,) = read_jsonl(g.results / 'summary.jsonl')
    assert summary['stopped'] is True
    assert tester.state.startswith('unconfigured') and tester.finalized


def call(g, client, timeout=10.0):
    future = client.call_async(Trigger.Request())
    g.wait(future.done, timeout, f'the answer of {client.srv_name}')
    return future.result()


def test_search_now_and_stop_search_services(graph):
    g = graph(frame_period_s=3600.0, **LONG)
    tester = g.tester
    client_node = g.camera  # any node of the graph can hold the clients
    search_now = client_node.create_client(Trigger, '/metavlm_tester/search_now')
    stop_search = client_node.create_client(Trigger, '/metavlm_tester/stop_search')
    g.wait(lambda: search_now.service_is_ready() and stop_search.service_is_ready(), 5, 'the services')

    answer = call(g, stop_search)
    assert not answer.success and answer.message == 'no search is running'
    answer = call(g, search_now)
    assert not answer.success and answer.message == 'no camera frame received yet'

    frame = make_frame(seed=7)
    g.camera.publish(frame)
    feed(g, frame, lambda: tester.evaluations >= 6, 'the first search')
    answer = call(g, search_now)
    assert not answer.success and answer.message.startswith('a search is running')
    answer = call(g, stop_search)
    assert answer.success and 'stops after its current generation' in answer.message
    g.wait(lambda: tester.searches_stopped == 1 and not tester.busy, 10, 'the search to stop')
    (summary,) = read_jsonl(g.results / 'summary.jsonl')
    assert summary['stopped'] is True
    assert tester.state == 'search stopped: asked to stop (~/stop_search)'

    # frame_period_s (an hour) would hold the next search back; search_now does not wait for it.
    done = tester.evaluations
    answer = call(g, search_now)
    assert answer.success and answer.message.startswith('searching the frame of ')
    g.wait(lambda: tester.evaluations > done, 20, 'the search asked for')
    assert tester.trigger_deactivate() == SUCCESS
    assert not call(g, search_now).success


def test_perception_node_loads_at_configure_subscribes_when_active_and_frees_at_cleanup(tiny_clip_dir):
    overrides = [Parameter('model', value=str(tiny_clip_dir)), Parameter('device', value='cpu')]
    with ros_context() as context:
        node = PerceptionNode(context=context, parameter_overrides=overrides)
        try:
            assert state_label(node) == 'unconfigured' and node.backend is None
            assert node.trigger_configure() == SUCCESS and node.backend is not None
            assert node.count_subscribers('probe') == 0  # inactive: no probe nor camera subscription
            assert node.trigger_activate() == SUCCESS
            wait_for(lambda: node.count_subscribers('probe') == 1, 5, node, 'the probe subscription')
            assert node.count_subscribers('image') == 1
            assert node.trigger_deactivate() == SUCCESS
            wait_for(lambda: node.count_subscribers('probe') == 0, 5, node, 'the probe unsubscribed')
            assert node.trigger_cleanup() == SUCCESS and node.backend is None
            assert node.trigger_shutdown() == SUCCESS and node.finalized
        finally:
            node.destroy_node()


@pytest.mark.parametrize('node_class', ['perception', 'tester'])
def test_a_model_that_cannot_load_fails_configure_with_its_reason(tmp_path, node_class):
    from metavlm_ros.common.errors import ModelError
    from metavlm_ros.ros.tester_node import TesterNode

    missing = str(tmp_path / 'no-model')
    values = {'model': missing, 'device': 'cpu'}
    if node_class == 'tester':
        values.update(vlm_endpoint='inprocess', results_dir=str(tmp_path / 'results'))
    overrides = [Parameter(k, value=v) for k, v in values.items()]
    with ros_context() as context:
        node = (PerceptionNode if node_class == 'perception' else TesterNode)(
            context=context, parameter_overrides=overrides
        )
        try:
            assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
            assert state_label(node) == 'unconfigured'
            assert isinstance(node.transition_error, ModelError) and missing in str(node.transition_error)
            with pytest.raises(ModelError, match='no-model'):
                bring_up(node)
            assert node._state_machine.current_state[0] == State.PRIMARY_STATE_FINALIZED
        finally:
            node.destroy_node()


@pytest.mark.parametrize('node_class', ['perception', 'tester'])
def test_cleanup_destroys_every_entity_configure_and_activate_made(
    graph, tiny_clip_dir, monkeypatch, node_class
):
    """One destroy loop (ManagedNode.destroy_entities) for both nodes: nothing is left after cleanup."""
    from metavlm_ros.ros.managed import ManagedNode

    def entities(node):
        return set(map(id, [*node.publishers, *node.timers, *node.subscriptions]))

    with ros_context() as context:
        if node_class == 'perception':
            model = [Parameter('model', value=str(tiny_clip_dir))]
            node = PerceptionNode(context=context, parameter_overrides=model)
        else:
            node = graph(start=False).tester
        try:
            before = entities(node)
            calls = []
            original = ManagedNode.destroy_entities

            def counted(self, made):
                calls.append(len(made))
                return original(self, made)

            monkeypatch.setattr(ManagedNode, 'destroy_entities', counted)
            assert node.trigger_configure() == SUCCESS
            assert node.trigger_activate() == SUCCESS
            assert entities(node) > before
            assert node.trigger_deactivate() == SUCCESS
            assert node.trigger_cleanup() == SUCCESS
            assert entities(node) == before
            assert calls and sum(calls) >= 3
        finally:
            if node_class == 'perception':
                node.destroy_node()
