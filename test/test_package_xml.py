"""package.xml: every dependency key is one that rosdep resolves (checked offline with rosdep itself)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from test.ros_tools import BIN, ROOT, ROS_TOOLS_DIR

DEPEND_TAGS = ('depend', 'build_depend', 'exec_depend', 'test_depend', 'buildtool_depend')
# Keys that name ROS 2 packages of the distribution: rosdep resolves those from the rosdistro
# distribution file (online), not from the rosdep databases. The ones with Python modules must import
# here (from the Kilted wheels or the ROS tools); these three are C++-backed and have no wheel.
ROS_PACKAGES_WITHOUT_WHEEL = {'cv_bridge', 'ros2bag', 'rosbag2_storage_mcap'}


def dependency_keys() -> list[str]:
    root = ET.parse(ROOT / 'package.xml').getroot()
    return [element.text.strip() for tag in DEPEND_TAGS for element in root.iter(tag)]


def is_ros_package(key: str) -> bool:
    return key in ROS_PACKAGES_WITHOUT_WHEEL or importlib.util.find_spec(key) is not None


@pytest.fixture(scope='module')
def rosdep_env(tmp_path_factory) -> dict[str, str]:
    """A rosdep set up offline: its sources list names the shipped databases, an empty rosdistro index."""
    home = tmp_path_factory.mktemp('rosdep')
    sources = home / 'sources.list.d'
    sources.mkdir()
    (sources / '10-metavlm-test.list').write_text(
        ''.join(f'yaml file://{ROS_TOOLS_DIR / "rosdep" / name}\n' for name in ('base.yaml', 'python.yaml'))
    )
    index = home / 'index-v4.yaml'
    index.write_text('%YAML 1.1\n---\ntype: index\nversion: 4\ndistributions: {}\n')
    env = {
        **os.environ,
        'ROSDEP_SOURCE_PATH': str(sources),
        'ROS_HOME': str(home / 'ros_home'),
        'ROSDISTRO_INDEX_URL': f'file://{index}',
        'ROS_PYTHON_VERSION': '3',
    }
    done = subprocess.run(
        [str(BIN / 'rosdep'), 'update'], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return env


def test_package_xml_declares_the_runtime_dependencies():
    keys = dependency_keys()
    assert len(keys) == len(set(keys)), 'a key is declared twice'
    for needed in ('rclpy', 'lifecycle_msgs', 'std_srvs', 'python3-torch', 'python3-transformers-pip'):
        assert needed in keys


@pytest.mark.ros_tools('rosdep', 'rosdep_data', 'launch_ros')
def test_every_key_resolves_with_rosdep_offline(rosdep_env):
    keys = dependency_keys()
    ros_packages = [key for key in keys if is_ros_package(key)]
    system_keys = [key for key in keys if key not in ros_packages]
    # Every ROS package key names a package: none is a misspelt rosdep key of the databases.
    assert set(ros_packages) >= {'rclpy', 'sensor_msgs', 'launch_ros'}
    unresolved = {}
    resolved = {}
    for key in system_keys:
        done = subprocess.run(
            [str(BIN / 'rosdep'), 'resolve', key, '--os', 'ubuntu:noble'],
            env=rosdep_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            unresolved[key] = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1]
        else:
            resolved[key] = done.stdout.split()
    assert not unresolved, f'rosdep cannot resolve: {unresolved}'
    # pip keys install with pip, the rest with apt
    assert resolved['python3-transformers-pip'] == ['#pip', 'transformers']
    assert resolved['python3-numpy'] == ['#apt', 'python3-numpy']


@pytest.mark.ros_tools('rosdep', 'rosdep_data')
def test_the_check_fails_on_a_key_rosdep_does_not_know(rosdep_env):
    done = subprocess.run(
        [str(BIN / 'rosdep'), 'resolve', 'python3-pymoo-pip', '--os', 'ubuntu:noble'],
        env=rosdep_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert 'python3-pymoo-pip' in done.stdout + done.stderr
