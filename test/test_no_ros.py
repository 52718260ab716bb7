"""Everything but ros/ and commands/ is ROS-free: each module imports where ROS packages cannot be found."""

import subprocess
import sys
from pathlib import Path

import metavlm_ros
from test.test_layers import LAYERS

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

PACKAGE = Path(metavlm_ros.__path__[0])
#: The subpackages that must run without a ROS distribution: every layer but ros/, commands/ and cli.py.
ROS_FREE = tuple(layer for layer in LAYERS if layer not in ('ros', 'commands', 'cli'))

# A finder placed first on sys.meta_path that refuses every ROS package, as on a machine without them.
BLOCK_AND_IMPORT = f"""
import importlib, pkgutil, sys
class NoRos:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {ROS_PACKAGES!r}:
            raise ModuleNotFoundError(f'No module named {{name!r}} (blocked by the test)', name=name)
        return None
sys.meta_path.insert(0, NoRos())
names = []
for sub in {ROS_FREE!r}:
    package = importlib.import_module('metavlm_ros.' + sub)
    names += sorted(m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.'))
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split('.')[0] in {ROS_PACKAGES!r})
print(len(names), loaded)
"""


def ros_free_sources() -> list[Path]:
    """Every module of the ROS-free subpackages, nested packages (models/backends/) included."""
    return sorted(
        p
        for sub in ROS_FREE
        for p in (PACKAGE / sub).rglob('*.py')
        if p.name != '__init__.py' or p.parent != PACKAGE / sub
    )


def test_every_subpackage_but_ros_and_commands_is_listed():
    subpackages = {p.parent.name for p in PACKAGE.glob('*/__init__.py')}
    assert subpackages == set(ROS_FREE) | {'ros', 'commands'}


def test_every_ros_free_module_imports_without_ros():
    result = subprocess.run([sys.executable, '-c', BLOCK_AND_IMPORT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    count, loaded = result.stdout.strip().split(' ', 1)
    assert int(count) == len(ros_free_sources())
    assert loaded == '[]'


def test_no_ros_free_source_names_a_ros_package():
    for path in ros_free_sources():
        text = path.read_text(encoding='utf-8')
        for package in ROS_PACKAGES:
            assert f'import {package}' not in text and f'from {package}' not in text, (
                f'{path.relative_to(PACKAGE)}: {package}'
            )


def test_commands_are_argparse_and_calls_with_no_ros_code_of_their_own():
    # rclpy code lives in ros/ (the launcher, the bag player, the nodes); a command only calls it.
    sources = [*sorted((PACKAGE / 'commands').glob('*.py')), PACKAGE / 'cli.py']
    for path in sources:
        text = path.read_text(encoding='utf-8')
        for package in ROS_PACKAGES:
            assert f'import {package}' not in text and f'from {package}' not in text, (
                f'{path.relative_to(PACKAGE)}: {package}'
            )
