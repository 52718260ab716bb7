"""Running the managed (lifecycle) nodes: transitions driven in process, signals, an orderly shutdown."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import rclpy
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.signals import SignalHandlerOptions
from rclpy.subscription import Subscription
from rclpy.timer import Timer

from metavlm_ros.common.errors import MetaVLMError, ParameterError

__all__ = ['ManagedNode', 'bring_up', 'run_managed', 'shut_down', 'state_label']

# Longest wait for a transition in progress (a model loading) before a shutdown is attempted anyway.
TRANSITION_WAIT_S = 30.0
# How long `ros2 launch` and a terminal's process group wait for us matter: launch sends SIGTERM 5 s
# after SIGINT and SIGKILL 5 s later. A node's on_shutdown stays well inside the first 5 s.


class ManagedNode(LifecycleNode):
    """A lifecycle node that says why a transition failed and tells when it is finalized.

    Its read-only parameter `autostart` (the launch files set it) makes `run_managed` configure and
    activate it at start, as `ros2 lifecycle set NODE configure` then `activate` would.

    Subclasses implement `_configure`, `_activate`, `_deactivate` and `_cleanup`; a MetaVLMError
    raised there fails the transition (FAILURE, back to the previous state) with one logged line.
    `shutdown` from any primary state deactivates and cleans up as needed.
    """

    def __init__(self, node_name: str, **kwargs: Any) -> None:
        """Create the node; it starts unconfigured."""
        super().__init__(node_name, **kwargs)
        self.transition_error: MetaVLMError | None = None  # why the last transition failed
        self._configured = False
        self._active = False
        self._finalized = threading.Event()
        self.shutting_down = False  # set when the shutdown transition begins
        try:
            self.declare_parameter(
                'autostart',
                False,
                ParameterDescriptor(
                    description='configure and activate at start (the launch files set it)', read_only=True
                ),
            )
        except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
            super().destroy_node()  # a node that failed to start must not linger in its context
            raise ParameterError(
                f'parameter autostart: expected true or false ({type(exc).__name__})'
            ) from None

    @property
    def active(self) -> bool:
        """Whether the node is in the active state."""
        return self._active

    @property
    def finalized(self) -> bool:
        """Whether the node went through shutdown."""
        return self._finalized.is_set()

    # -- entities that transitions create and destroy -------------------------------------------------

    # rclpy (Kilted) adds a publisher's or subscription's QoS event handlers to a wait set even when
    # they were destroyed meanwhile, which kills the spinning thread (InvalidHandle). Entities that a
    # transition destroys while the executor runs are therefore created without them.
    def create_transient_publisher(self, *args: Any, **kwargs: Any) -> Any:
        """create_publisher without QoS event handlers (safe to destroy while the executor spins)."""
        return self.create_publisher(
            *args, event_callbacks=PublisherEventCallbacks(use_default_callbacks=False), **kwargs
        )

    def create_transient_subscription(self, *args: Any, **kwargs: Any) -> Any:
        """create_subscription without QoS event handlers (safe to destroy while the executor spins)."""
        return self.create_subscription(
            *args, event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False), **kwargs
        )

    def destroy_entities(self, entities: list[Any]) -> None:
        """Destroy the timers, publishers and subscriptions a transition created (in that list's order)."""
        for entity in entities:
            if isinstance(entity, Timer):
                self.destroy_timer(entity)
            elif isinstance(entity, Subscription):
                self.destroy_subscription(entity)
            else:
                self.destroy_publisher(entity)

    # -- hooks for subclasses ---------------------------------------------------------------------

    def prepare_shutdown(self) -> None:
        """What must happen while the executor still spins, before `shutdown` (default: nothing)."""

    def _configure(self) -> None:
        raise NotImplementedError

    def _activate(self) -> None:
        raise NotImplementedError

    def _deactivate(self) -> None:
        raise NotImplementedError

    def _cleanup(self) -> None:
        raise NotImplementedError

    # -- rclpy's transition callbacks ---------------------------------------------------------------

    def _run(self, what: str, step: Callable[[], None]) -> TransitionCallbackReturn:
        try:
            step()
        except MetaVLMError as exc:
            self.transition_error = exc
            self.get_logger().error(f'{what} failed: {exc}')
            return TransitionCallbackReturn.FAILURE
        except Exception as exc:  # rclpy would turn it into ERROR silently; say what it was
            self.transition_error = MetaVLMError(f'{what} failed: {type(exc).__name__}: {exc}')
            self.get_logger().error(str(self.transition_error))
            return TransitionCallbackReturn.ERROR
        self.transition_error = None
        return TransitionCallbackReturn.SUCCESS

    def on_configure(self, state: Any) -> TransitionCallbackReturn:
        def step() -> None:
            self._configure()
            self._configured = True

        return self._run('configure', step)

    def on_activate(self, state: Any) -> TransitionCallbackReturn:
        def step() -> None:
            self._activate()
            self._active = True

        return self._run('activate', step)

    def on_deactivate(self, state: Any) -> TransitionCallbackReturn:
        def step() -> None:
            self._active = False
            self._deactivate()

        return self._run('deactivate', step)

    def on_cleanup(self, state: Any) -> TransitionCallbackReturn:
        def step() -> None:
            self._configured = False
            self._cleanup()

        return self._run('cleanup', step)

    def on_shutdown(self, state: Any) -> TransitionCallbackReturn:
        self.shutting_down = True

        def step() -> None:
            try:
                if self._active:
                    self._active = False
                    self._deactivate()
                if self._configured:
                    self._configured = False
                    self._cleanup()
            finally:
                self._finalized.set()

        return self._run('shutdown', step)

    def on_error(self, state: Any) -> TransitionCallbackReturn:
        # A transition raised something unexpected: free what is held and go back to unconfigured.
        self._active = False
        if self._configured:
            self._configured = False
            try:
                self._cleanup()
            except Exception as exc:
                self.get_logger().error(f'cleanup after an error failed: {type(exc).__name__}: {exc}')
        return TransitionCallbackReturn.SUCCESS


def state_label(node: LifecycleNode) -> str:
    """The node's lifecycle state: unconfigured, inactive, active, finalized, or a transition."""
    return node._state_machine.current_state[1]


def bring_up(node: ManagedNode) -> None:
    """Configure and activate a node in this process (`metavlm run`, tests).

    Raises:
        MetaVLMError: a transition failed; the message is the node's reason (bad model, results dir).
    """
    for name, trigger in (('configure', node.trigger_configure), ('activate', node.trigger_activate)):
        if trigger() != TransitionCallbackReturn.SUCCESS:
            error = node.transition_error or MetaVLMError(f'{node.get_name()}: {name} failed')
            shut_down(node)  # free what a failed step kept, so the caller can destroy the node
            raise error


def shut_down(node: ManagedNode, wait_s: float = TRANSITION_WAIT_S) -> None:
    """Take the node through `shutdown` from whatever state it is in (no-op once finalized)."""
    deadline = time.monotonic() + wait_s
    while state_label(node) not in ('unconfigured', 'inactive', 'active', 'finalized'):
        if time.monotonic() > deadline:
            node.get_logger().warning(f'still {state_label(node)} after {wait_s:g} s; shutting down anyway')
            break
        time.sleep(0.05)
    if node.finalized or state_label(node) == 'finalized':
        return
    try:
        node.trigger_shutdown()
    except Exception as exc:  # the state machine refused (a transition in progress): free it directly
        node.get_logger().warning(f'shutdown transition refused ({exc}); releasing directly')
        node.on_shutdown(None)


def run_managed(
    create: Callable[[], ManagedNode], name: str, args: list[str] | None = None, threads: int = 4
) -> int:
    """The `main` of a managed node: spin until SIGINT, SIGTERM or the shutdown transition, then end cleanly.

    rclpy's own signal handler is not installed: it would invalidate the context at once, and the
    running search could then neither publish nor store what it found. Instead a signal ends the
    spin loop; the node goes through `shutdown` while the executor still runs (probe answers and
    lifecycle services keep flowing), then everything is destroyed in order.

    Returns:
        0; 1 when the node could not be created (a one-line `NAME: error: ...` on stderr) or when
        `autostart` could not bring it to active (the failed transition logged its reason).
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    signalled = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        signalled.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            node = create()
        except MetaVLMError as exc:
            print(f'{name}: error: {exc}', file=sys.stderr)
            return 1
        if node.get_parameter('autostart').value:
            try:
                bring_up(node)
            except MetaVLMError:
                node.destroy_node()
                return 1
        executor = MultiThreadedExecutor(num_threads=threads)
        executor.add_node(node)
        try:
            while not signalled.is_set() and not node.finalized:
                executor.spin_once(timeout_sec=0.1)
            # First what needs the executor (the tester's last generation waits for probe answers),
            # then the shutdown transition with no other thread in the executor.
            done = threading.Event()

            def spin() -> None:
                while not done.is_set():
                    executor.spin_once(timeout_sec=0.05)

            spinner = threading.Thread(target=spin, name=f'{name}-shutdown-spin', daemon=True)
            spinner.start()
            try:
                if not node.finalized:
                    node.prepare_shutdown()
            finally:
                done.set()
                spinner.join()
            shut_down(node)
        finally:
            executor.shutdown()
            node.destroy_node()
    finally:
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
