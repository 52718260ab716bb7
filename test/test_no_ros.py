"""The core is ROS-free: every core module imports in a Python where ROS packages cannot be found."""

import subprocess
import sys
from pathlib import Path

import metavlm_ros.core

ROS_PACKAGES = (
    'rclpy',
    'sensor_msgs',
    'std_msgs',
    'diagnostic_msgs',
    'rosgraph_msgs',
    'builtin_interfaces',
    'cv_bridge',
    'rcl_interfaces',
)

# A finder placed first on sys.meta_path that refuses every ROS package, as on a machine without them.
BLOCK_AND_IMPORT = f"""
import importlib, pkgutil, sys
class NoRos:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {ROS_PACKAGES!r}:
            raise ModuleNotFoundError(f'No module named {{name!r}} (blocked by the test)', name=name)
        return None
sys.meta_path.insert(0, NoRos())
import metavlm_ros.core as core
names = sorted(m.name for m in pkgutil.iter_modules(core.__path__, 'metavlm_ros.core.'))
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split('.')[0] in {ROS_PACKAGES!r})
print(len(names), loaded)
"""


def test_every_core_module_imports_without_ros():
    result = subprocess.run([sys.executable, '-c', BLOCK_AND_IMPORT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    count, loaded = result.stdout.strip().split(' ', 1)
    expected = len([p for p in Path(metavlm_ros.core.__path__[0]).glob('*.py') if p.name != '__init__.py'])
    assert int(count) == expected
    assert loaded == '[]'


def test_no_core_source_names_a_ros_package():
    for path in Path(metavlm_ros.core.__path__[0]).glob('*.py'):
        text = path.read_text(encoding='utf-8')
        for package in ROS_PACKAGES:
            assert f'import {package}' not in text and f'from {package}' not in text, (
                f'{path.name}: {package}'
            )
