"""The launch files' transitions (ros/launch_lifecycle.py) in a real LaunchService with real processes."""

from __future__ import annotations

import sys
import threading
import time

import pytest

pytestmark = pytest.mark.ros_tools('launch_ros')

# A managed node and nothing else: rclpy's own LifecycleNode, which answers change_state by itself.
LIFECYCLE_NODE = """
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.lifecycle import LifecycleNode
rclpy.init()
node = LifecycleNode('{name}')
try:
    rclpy.spin(node)
except (KeyboardInterrupt, ExternalShutdownException):
    pass
"""


def _process(name: str, code: str):
    from launch.actions import ExecuteProcess

    return ExecuteProcess(cmd=[sys.executable, '-c', code], name=name, output='screen')


def _run(description, timeout: float = 60.0) -> int:
    """Run a launch description in a LaunchService, shut down by the test's own events or at `timeout`."""
    from launch import LaunchService

    service = LaunchService()
    service.include_launch_description(description)
    watchdog = threading.Timer(timeout, service.shutdown)
    watchdog.start()
    try:
        return service.run()
    finally:
        watchdog.cancel()


def _until_active(transitions, node, name: str) -> tuple[int, list[tuple[str, float]]]:
    """Launch `node` brought to active by `transitions`, shut down at its NodeActive (or the watchdog);
    the launch's code, and each NodeActive seen: node name, seconds since the launch began."""
    from launch.actions import EmitEvent, OpaqueFunction, RegisterEventHandler
    from launch.event_handler import EventHandler
    from launch.events import Shutdown

    from launch import LaunchDescription
    from metavlm_ros.ros.launch_lifecycle import NodeActive

    seen: list[tuple[str, float]] = []
    started = time.monotonic()

    def on_active(context, *args):
        seen.append((context.locals.event.node_name, time.monotonic() - started))
        return [EmitEvent(event=Shutdown(reason='node active'))]

    code = _run(
        LaunchDescription(
            [
                *transitions.bring_to_active(node, name),
                transitions.closer(),
                RegisterEventHandler(
                    EventHandler(
                        matcher=lambda event: isinstance(event, NodeActive),
                        entities=[OpaqueFunction(function=on_active)],
                    )
                ),
                node,
            ]
        )
    )
    return code, seen


def test_a_managed_node_is_configured_then_activated_and_nothing_is_left_running():
    from metavlm_ros.ros.launch_lifecycle import Transitions

    transitions = Transitions()
    node = _process('lc', LIFECYCLE_NODE.format(name='metavlm_test_lc'))
    started = time.monotonic()
    code, seen = _until_active(transitions, node, 'metavlm_test_lc')
    names = [name for name, _ in seen]
    assert names == ['metavlm_test_lc'], f'no NodeActive within {time.monotonic() - started:.0f} s'
    assert code == 0
    # close() joined every request thread and its executor thread before the context went away.
    assert not any(thread.is_alive() for thread in transitions._threads)
    assert not any(t.name.startswith('metavlm-transitions') for t in threading.enumerate())


def test_a_node_that_died_before_its_service_came_up_has_no_request_left_waiting():
    """The node exits at once (as on a wrong parameter); its request stops at the exit event, while the
    launch goes on (another process runs), and no transition is asked of it at shutdown."""
    from launch.actions import EmitEvent, OpaqueFunction, RegisterEventHandler
    from launch.event_handlers import OnProcessExit
    from launch.events import Shutdown

    from launch import LaunchDescription
    from metavlm_ros.ros.launch_lifecycle import Transitions

    transitions = Transitions()
    dying = _process('dying', 'import sys; sys.exit(1)')
    other = _process('other', 'import time; time.sleep(120)')
    left: list[bool] = []

    def after_exit(context, *args):
        # The exit event set the stop flag: the request thread ends within its poll.
        deadline = time.monotonic() + 5.0
        while any(t.is_alive() for t in transitions._threads) and time.monotonic() < deadline:
            time.sleep(0.02)
        left.append(any(t.is_alive() for t in transitions._threads))
        return [EmitEvent(event=Shutdown(reason='checked'))]

    code = _run(
        LaunchDescription(
            [
                # Registered first: launch runs the handlers registered later first, so the exit event
                # reaches Transitions before this check.
                RegisterEventHandler(
                    OnProcessExit(target_action=dying, on_exit=[OpaqueFunction(function=after_exit)])
                ),
                *transitions.bring_to_active(dying, 'metavlm_test_dying'),
                transitions.closer(),
                dying,
                other,
            ]
        )
    )
    assert left == [False], 'a request was still waiting on a node whose process had exited'
    assert len(transitions._threads) == 1
    assert code == 0


# A node with the lifecycle services that loses what DDS can lose: the reply to its first configure
# ("failed to send response (timeout)": the transition happened, the answer never came) or, with
# LOSE=request, the first configure itself (nothing happened). Its get_state tells the truth.
LOSSY_NODE = """
import threading, rclpy
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
rclpy.init()
node = rclpy.create_node('{name}')
state = [State.PRIMARY_STATE_UNCONFIGURED]
seen = []
never = threading.Event()
def change(request, response):
    seen.append(request.transition.id)
    first = len(seen) == 1
    if not (first and '{lose}' == 'request'):
        state[0] = {{1: State.PRIMARY_STATE_INACTIVE, 3: State.PRIMARY_STATE_ACTIVE}}[request.transition.id]
    if first:
        while rclpy.ok() and not never.wait(0.1):  # no answer, until the node shuts down
            pass
    response.success = True
    return response
def get(request, response):
    response.current_state.id = state[0]
    return response
group = ReentrantCallbackGroup()
node.create_service(ChangeState, '/{name}/change_state', change, callback_group=group)
node.create_service(GetState, '/{name}/get_state', get, callback_group=group)
executor = MultiThreadedExecutor(num_threads=4)
executor.add_node(node)
try:
    executor.spin()
except (KeyboardInterrupt, ExternalShutdownException):
    pass
"""


@pytest.mark.parametrize('lose', ['reply', 'request'])
def test_a_lost_reply_or_request_is_found_out_by_asking_the_nodes_state(lose):
    from metavlm_ros.ros.launch_lifecycle import ANSWER_S, Transitions

    name = f'metavlm_test_lossy_{lose}'
    _, seen = _until_active(Transitions(), _process('lossy', LOSSY_NODE.format(name=name, lose=lose)), name)
    assert len(seen) == 1, 'the node never reached active'
    assert seen[0][1] >= ANSWER_S  # it waited for the lost answer before it asked
