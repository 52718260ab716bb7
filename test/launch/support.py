"""What the launch_testing files share: a camera of synthetic footage, checks of output and results."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image

from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.ros.conversions import rgb_to_image_msg

__all__ = ['Watcher', 'clean_output_problems', 'records', 'ros2']

# Lines that must not appear in a node's output on a clean run and a clean shutdown.
BAD = ('ERROR', 'Traceback', 'context is invalid', 'terminate called', 'Segmentation fault')


class Watcher(Node):
    """Publishes SeaClear-like frames on the camera topic and keeps /violations and /diagnostics."""

    def __init__(self, camera_topic: str = '/camera/image_raw', publish: bool = True) -> None:
        super().__init__('launch_test_watcher')
        self.violations: list[DiagnosticArray] = []
        self.diagnostics: list[tuple[float, DiagnosticArray]] = []
        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(DiagnosticArray, '/violations', self.violations.append, reliable)
        self.create_subscription(
            DiagnosticArray, '/diagnostics', lambda m: self.diagnostics.append((_now(), m)), reliable
        )
        if publish:
            generator = SceneGenerator(384, 216, 5.0, 0, environment='shallow')
            self.frames = [generator.frame(i)[0] for i in range(4)]
            self.publisher = self.create_publisher(Image, camera_topic, qos_profile_sensor_data)
            self.sent = 0
            self.create_timer(0.2, self._publish)

    def _publish(self) -> None:
        stamp = 1_000_000_000 + self.sent * 200_000_000
        self.publisher.publish(rgb_to_image_msg(self.frames[self.sent % len(self.frames)], stamp, 'camera'))
        self.sent += 1

    def tester_diagnostics_since(self, since: float) -> int:
        """How many of the tester's /diagnostics arrived after `since` (time.monotonic())."""
        return sum(
            1
            for when, msg in self.diagnostics
            if when > since and any(s.name.startswith('metavlm_tester') for s in msg.status)
        )


def _now() -> float:
    import time

    return time.monotonic()


def spin_until(node: Node, predicate, timeout: float) -> bool:
    """Spin `node` until `predicate()` or `timeout` seconds; returns the predicate's last value."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.1)
    return bool(predicate())


def ros2(*args: str, timeout: float = 60.0) -> str:
    """Run a `ros2` command (no daemon) and return its output; fails on a non-zero exit."""
    done = subprocess.run(
        ['ros2', *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )
    if done.returncode != 0:
        raise AssertionError(f'ros2 {" ".join(args)} exited {done.returncode}: {done.stdout}{done.stderr}')
    return done.stdout


def ros2_together(*commands: tuple[str, ...], timeout: float = 60.0) -> list[str]:
    """Run independent `ros2` commands (no daemon) at once, each as `ros2` runs it, and return their
    outputs in order; fails on any non-zero exit. Each spends its --spin-time discovering the graph:
    side by side, the waits overlap instead of adding up."""
    running = [
        (args, subprocess.Popen(['ros2', *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for args in commands
    ]
    outputs = []
    for args, process in running:
        stdout, stderr = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise AssertionError(f'ros2 {" ".join(args)} exited {process.returncode}: {stdout}{stderr}')
        outputs.append(stdout)
    return outputs


def records(path: Path) -> list[dict]:
    """The records of a results file by its name (evaluations.jsonl: the .gz beside it, or itself),
    whole, as the one reader returns them (docs/results.md); empty when it does not exist."""
    return read_jsonl(path)


def clean_output_problems(proc_output, names: tuple[str, ...] = ('perception_node', 'tester_node')) -> list:
    """Lines of the nodes' output that a clean run must not have."""
    problems = []
    for name in proc_output.process_names():
        if not name.startswith(names):
            continue
        for io in proc_output[name]:
            for line in io.text.decode(errors='replace').splitlines():
                if any(bad in line for bad in BAD):
                    problems.append(f'{name}: {line}')
    return problems
