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


def test_a_managed_node_is_configured_then_activated_and_nothing_is_left_running():
    from launch.actions import EmitEvent, OpaqueFunction, RegisterEventHandler
    from launch.event_handler import EventHandler
    from launch.events import Shutdown

    from launch import LaunchDescription
    from metavlm_ros.ros.launch_lifecycle import NodeActive, Transitions

    transitions = Transitions()
    node = _process('lc', LIFECYCLE_NODE.format(name='metavlm_test_lc'))
    seen: list[str] = []

    def on_active(context, *args):
        seen.append(context.locals.event.node_name)
        return [EmitEvent(event=Shutdown(reason='node active'))]

    started = time.monotonic()
    code = _run(
        LaunchDescription(
            [
                *transitions.bring_to_active(node, 'metavlm_test_lc'),
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
    assert seen == ['metavlm_test_lc'], f'no NodeActive within {time.monotonic() - started:.0f} s'
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
