"""launch_testing: metavlm.launch.py, found through the ament index, with the shipped parameters.

Run by test/ros/test_launch_system.py with `launch_test ... params_file:=YAML`, the shipped
config/metavlm.yaml with a search budget that outlasts the test, its path also in METAVLM_TEST_PARAMS
(a frame publisher gives violations; `ros2 param dump/get` read back that file; `ros2 lifecycle set`
deactivates and reactivates the tester while a search runs; the shutdown that ends the test stops the
running search cleanly). At the shipped 3000 evaluations a search took 9 s here, less than `ros2
lifecycle set` may take to start: whether it still ran when the tester was deactivated was chance.
"""

import os
import unittest
from pathlib import Path

import launch_testing
import launch_testing.actions
import launch_testing.asserts
import rclpy
import yaml
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from test.launch.support import Watcher, clean_output_problems, records, ros2, ros2_together, spin_until

RESULTS = Path(os.getcwd()) / 'results' / 'ros'  # the shipped results_dir, relative to the nodes' cwd


def generate_test_description():
    share = FindPackageShare('metavlm_ros')
    nodes = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([share, 'launch', 'metavlm.launch.py'])),
        launch_arguments={'params_file': LaunchConfiguration('params_file')}.items(),
    )
    return LaunchDescription(
        [DeclareLaunchArgument('params_file'), nodes, launch_testing.actions.ReadyToTest()]
    )


def _flat(values, prefix=''):
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f'{prefix}{key}.'))
        else:
            out[f'{prefix}{key}'] = value
    return out


class TestMetaVLMLaunch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rclpy.init()
        cls.watcher = Watcher()

    @classmethod
    def tearDownClass(cls):
        cls.watcher.destroy_node()
        rclpy.shutdown()

    def test_1_frames_give_violations(self):
        found = spin_until(self.watcher, lambda: self.watcher.violations, timeout=180.0)
        self.assertTrue(found, 'no violation on /violations within 180 s')
        status = self.watcher.violations[0].status[0]
        self.assertEqual(status.name, 'metavlm/violation')

    def test_2_parameters_read_back_equal_the_file_given(self):
        shipped = yaml.safe_load(Path(os.environ['METAVLM_TEST_PARAMS']).read_text())
        nodes = ('metavlm_perception', 'metavlm_tester')
        # Four reads of the running nodes, side by side (each waits 5 s for discovery).
        *dumps, evaluations, scaling = ros2_together(
            *(('param', 'dump', '--no-daemon', '--spin-time', '5', f'/{node}') for node in nodes),
            ('param', 'get', '--no-daemon', '--spin-time', '5', '/metavlm_tester', 'evaluations'),
            ('param', 'get', '--no-daemon', '--spin-time', '5', '/metavlm_tester', 'ranges.scaling'),
        )
        for node, dump in zip(nodes, dumps, strict=True):
            live = _flat(yaml.safe_load(dump)[f'/{node}']['ros__parameters'])
            for name, value in _flat(shipped[node]['ros__parameters']).items():
                self.assertEqual(live[name], value, f'{node} {name}')
        self.assertEqual(
            evaluations.strip(),
            f'Integer value is: {shipped["metavlm_tester"]["ros__parameters"]["evaluations"]}',
        )
        self.assertEqual(scaling.strip(), 'Double values are: [0.7, 1.3]')

    def test_3_lifecycle_set_deactivates_and_reactivates_the_tester(self):
        self.assertIn(
            'active', ros2('lifecycle', 'get', '--no-daemon', '--spin-time', '5', '/metavlm_tester')
        )
        # A search must be running when the tester is deactivated. One runs from the first camera frame
        # on, and its budget outlasts the test: ~/search_now refuses because it runs (or, between two
        # searches, starts one).
        answer = ros2('service', 'call', '/metavlm_tester/search_now', 'std_srvs/srv/Trigger')
        self.assertTrue('success=True' in answer or 'a search is running' in answer, answer)
        before = len(records(RESULTS / 'evaluations.jsonl'))
        running = spin_until(
            self.watcher, lambda: len(records(RESULTS / 'evaluations.jsonl')) > before, timeout=60.0
        )
        self.assertTrue(running, 'no search running before deactivation')
        self.assertIn(
            'Transitioning successful',
            ros2('lifecycle', 'set', '--no-daemon', '--spin-time', '5', '/metavlm_tester', 'deactivate'),
        )
        self.assertTrue(
            ros2('lifecycle', 'get', '--no-daemon', '--spin-time', '5', '/metavlm_tester').startswith(
                'inactive'
            )
        )
        summaries = records(RESULTS / 'summary.jsonl')
        self.assertTrue(summaries and summaries[-1]['stopped'], 'the deactivated search wrote no summary')
        done = ros2('lifecycle', 'set', '--no-daemon', '--spin-time', '5', '/metavlm_tester', 'activate')
        self.assertIn('Transitioning successful', done)
        # a new search runs when the test ends: the shutdown must stop it cleanly
        done = len(records(RESULTS / 'evaluations.jsonl'))
        started = spin_until(
            self.watcher, lambda: len(records(RESULTS / 'evaluations.jsonl')) > done + 30, timeout=120.0
        )
        self.assertTrue(started, 'no search after reactivation')


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_every_process_ended_with_0(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)

    def test_no_error_nor_traceback(self, proc_output):
        self.assertEqual(clean_output_problems(proc_output), [])

    def test_the_running_search_was_stopped_with_its_summary_and_pareto_records(self):
        summaries = records(RESULTS / 'summary.jsonl')
        searched = {r['image'] for r in records(RESULTS / 'evaluations.jsonl')}
        self.assertEqual({s['image'] for s in summaries}, searched)  # every search has its summary
        self.assertTrue(summaries[-1]['stopped'])
        self.assertTrue(records(RESULTS / 'pareto.jsonl'))
