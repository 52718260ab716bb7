"""Bringing the launch files' managed nodes to active, with no transition left pending at shutdown."""

from __future__ import annotations

import functools
import threading
from typing import Any

import launch.logging
import rclpy
from launch.actions import RegisterEventHandler
from launch.event_handlers import OnProcessExit, OnProcessStart, OnShutdown
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

import launch

__all__ = ['NodeActive', 'Transitions']

# How often a request thread looks at its stop flag while it waits for a service or an answer.
POLL_S = 0.1
# How long an answer may take before the node is asked where it is (GetState): DDS may drop a reply
# sent before the reply's reader was matched ("failed to send response (timeout)" in the node's log),
# and a request sent then is lost with it.
ANSWER_S = 5.0
# The state each transition leads to, and the one it starts from.
_GOAL = {
    Transition.TRANSITION_CONFIGURE: State.PRIMARY_STATE_INACTIVE,
    Transition.TRANSITION_ACTIVATE: State.PRIMARY_STATE_ACTIVE,
}
_START = {
    Transition.TRANSITION_CONFIGURE: State.PRIMARY_STATE_UNCONFIGURED,
    Transition.TRANSITION_ACTIVATE: State.PRIMARY_STATE_INACTIVE,
}


class NodeActive(launch.Event):
    """Emitted once a node this launch brought up answered `activate` with success."""

    name = 'metavlm_ros.events.NodeActive'

    def __init__(self, node_name: str) -> None:
        super().__init__()
        self.node_name = node_name


class Transitions:
    """Configure, then activate, each managed node once its process runs; stop asking once it exits.

    Why not launch_ros's ChangeState event: launch_ros runs each request in a thread that polls the
    node's `change_state` service on the launch's shared rclpy node (launch_ros/actions/lifecycle_node.py,
    `_call_change_state`: `wait_for_service(timeout_sec=1.0)` in a loop that looks at `is_shutdown` only
    between waits), and on Shutdown destroys that node without waiting for those threads
    (launch_ros/ros_adapters.py, `ROSAdapter.shutdown`). A request for a node that died before its
    service came up (a wrong parameter) waits until Ctrl-C, then raises `InvalidHandle: cannot use
    Destroyable because destruction was requested`, a traceback in the user's terminal.

    Here the requests start from each node's process start event, stop at its exit event, and run on
    a ROS context this object owns: `close` (on Shutdown) stops and joins every request thread before
    it destroys that context, so no request can outlive it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logger = launch.logging.get_logger('metavlm_ros')
        self._context: rclpy.Context | None = None
        self._node: Any = None
        self._executor: SingleThreadedExecutor | None = None
        self._spinner: threading.Thread | None = None
        self._spinning = threading.Event()
        self._clients: dict[str, Any] = {}
        self._stops: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False

    # -- launch entities ------------------------------------------------------------------------------

    def bring_to_active(self, action: launch.Action, node_name: str) -> list[launch.Action]:
        """The event handlers that bring `action` (a LifecycleNode named `node_name`) to active."""
        return [
            RegisterEventHandler(
                OnProcessStart(target_action=action, on_start=functools.partial(self._on_start, node_name))
            ),
            RegisterEventHandler(
                OnProcessExit(target_action=action, on_exit=functools.partial(self._on_exit, node_name))
            ),
        ]

    def closer(self) -> launch.Action:
        """The event handler that ends every request and the ROS context on Shutdown."""
        return RegisterEventHandler(OnShutdown(on_shutdown=lambda event, context: self.close()))

    # -- events ---------------------------------------------------------------------------------------

    def _on_start(self, node_name: str, event: Any, context: launch.LaunchContext) -> None:
        with self._lock:
            if self._closed:
                return
            self._start_ros()
            if node_name not in self._clients:
                self._clients[node_name] = (
                    self._node.create_client(ChangeState, f'/{node_name}/change_state'),
                    self._node.create_client(GetState, f'/{node_name}/get_state'),
                )
            stop = threading.Event()
            self._stops[node_name] = stop  # a respawned process gets a request thread of its own
            thread = threading.Thread(
                target=self._bring_up,
                args=(node_name, self._clients[node_name], stop, context),
                name=f'metavlm-transitions-{node_name}',
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _on_exit(self, node_name: str, event: Any, context: launch.LaunchContext) -> None:
        with self._lock:
            stop = self._stops.get(node_name)
        if stop is not None:
            stop.set()

    def close(self) -> None:
        """Stop every request, join their threads, then destroy the node and the context (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for stop in self._stops.values():
                stop.set()
            threads = list(self._threads)
        for thread in threads:
            thread.join()
        if self._context is None:
            return
        self._spinning.clear()
        self._spinner.join()
        self._executor.shutdown()
        self._node.destroy_node()
        rclpy.try_shutdown(context=self._context)

    # -- requests -------------------------------------------------------------------------------------

    def _start_ros(self) -> None:
        """This object's own context, node and executor thread (the first node start creates them)."""
        if self._context is not None:
            return
        self._context = rclpy.Context()
        # launch handles SIGINT/SIGTERM itself; this context must not install rclpy's handlers.
        rclpy.init(context=self._context, signal_handler_options=SignalHandlerOptions.NO)
        self._node = rclpy.create_node('metavlm_launch_transitions', context=self._context)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self._node)
        self._spinning.set()

        def spin() -> None:
            while self._spinning.is_set():
                self._executor.spin_once(timeout_sec=POLL_S)

        self._spinner = threading.Thread(target=spin, name='metavlm-transitions-spin', daemon=True)
        self._spinner.start()

    def _bring_up(
        self, node_name: str, client: Any, stop: threading.Event, context: launch.LaunchContext
    ) -> None:
        for transition, label in (
            (Transition.TRANSITION_CONFIGURE, 'configure'),
            (Transition.TRANSITION_ACTIVATE, 'activate'),
        ):
            answer = self._request(client, transition, stop)
            if answer is None:  # the process exited, or the launch is shutting down
                return
            if not answer.success:
                self._logger.info(
                    f'{node_name} did not {label} (its own line says why); it waits: '
                    f'`ros2 lifecycle set /{node_name} {label}` tries again'
                )
                return
        loop = context.asyncio_loop
        if loop is not None and not stop.is_set():
            try:
                loop.call_soon_threadsafe(context.emit_event_sync, NodeActive(node_name))
            except RuntimeError:  # the launch's loop closed meanwhile: nobody is left to tell
                pass

    @staticmethod
    def _request(clients: tuple[Any, Any], transition: int, stop: threading.Event) -> Any:
        """The node's answer to one transition, or None when `stop` was set before it came.

        An answer that does not come within ANSWER_S makes it ask the node's state: the goal state is
        the answer (the reply was lost), the start state sends the request again (the request was lost),
        a transition state (a model still loading) waits on.
        """
        change, get = clients
        while not change.service_is_ready():
            if stop.wait(POLL_S):
                return None
        request = ChangeState.Request()
        request.transition.id = transition
        future = change.call_async(request)
        waited = 0.0
        while not future.done():
            if stop.wait(POLL_S):
                future.cancel()
                return None
            waited += POLL_S
            if waited < ANSWER_S:
                continue
            waited = 0.0
            state = Transitions._state(get, stop)
            if state == _GOAL[transition]:
                future.cancel()
                return ChangeState.Response(success=True)
            if state == _START[transition]:
                future.cancel()
                future = change.call_async(request)
        return future.result()

    @staticmethod
    def _state(get: Any, stop: threading.Event) -> int | None:
        """The node's primary or transition state id, or None when it does not answer within ANSWER_S."""
        if not get.service_is_ready():
            return None
        future = get.call_async(GetState.Request())
        waited = 0.0
        while not future.done() and waited < ANSWER_S:
            if stop.wait(POLL_S):
                break
            waited += POLL_S
        if not future.done():
            future.cancel()
            return None
        return future.result().current_state.id
