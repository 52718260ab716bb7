"""launch_testing: replay.launch.py plays 6 s of footage (metavlm replay) into the nodes once they are active.

Run by test/ros/test_launch_system.py with `launch_test ... bag:=PATH params_file:=YAML`: the footage
(a rosbag2 or ROS 1 bag, or a video) gives violations although it ends long before a search does,
and once it has ended (the replay's /clock stopped) the tester still publishes /diagnostics and
shuts down cleanly. METAVLM_TEST_PLAYER (default metavlm) is the `player` asked for, and
METAVLM_TEST_MESSAGES the messages the replay publishes (default 240: 60 frames of a scenes bag, 4 topics).
"""

import os
import time
import unittest

import launch_testing
import launch_testing.actions
import launch_testing.asserts
import rclpy
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from test.launch.support import Watcher, clean_output_problems, spin_until


def generate_test_description():
    share = FindPackageShare('metavlm_ros')
    replay = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([share, 'launch', 'replay.launch.py'])),
        launch_arguments={
            'bag': LaunchConfiguration('bag'),
            'params_file': LaunchConfiguration('params_file'),
            'player': os.environ.get('METAVLM_TEST_PLAYER', 'metavlm'),
        }.items(),
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument('bag'),
            DeclareLaunchArgument('params_file'),
            replay,
            launch_testing.actions.ReadyToTest(),
        ]
    )


class TestReplay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rclpy.init()
        cls.watcher = Watcher(publish=False)

    @classmethod
    def tearDownClass(cls):
        cls.watcher.destroy_node()
        rclpy.shutdown()

    def test_1_the_bag_gives_violations(self, proc_output):
        found = spin_until(self.watcher, lambda: self.watcher.violations, timeout=240.0)
        self.assertTrue(found, 'no violation within 240 s')

    def test_2_diagnostics_go_on_after_the_bag_and_its_clock_ended(self, proc_output):
        messages = os.environ.get('METAVLM_TEST_MESSAGES', '240')
        proc_output.assertWaitFor(f'published {messages} messages', timeout=120, stream='stdout')
        ended = time.monotonic()
        spin_until(self.watcher, lambda: self.watcher.tester_diagnostics_since(ended) >= 3, timeout=20.0)
        self.assertGreaterEqual(self.watcher.tester_diagnostics_since(ended), 3)
        results = os.environ['METAVLM_TEST_RESULTS']
        self.assertTrue(os.path.isfile(os.path.join(results, 'violations.jsonl.gz')))  # from configure on


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_every_process_ended_with_0(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)

    def test_no_error_nor_traceback(self, proc_output):
        self.assertEqual(clean_output_problems(proc_output), [])
