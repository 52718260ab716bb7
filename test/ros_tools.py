"""Where the real ROS 2 tools are (ros2, launch_testing, colcon, rosdep) and what a test lacks of them.

Tests that need them carry `@pytest.mark.ros_tools('ros2', ...)`: without them they skip, saying what
is missing, except where METAVLM_REQUIRE_ROS_TOOLS=1 (CI, `.ci/run`), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = ['BIN', 'REQUIRE_ENV', 'ROOT', 'ROS_TOOLS_DIR', 'missing']

ROOT = Path(__file__).resolve().parents[1]
ROS_TOOLS_DIR = Path(os.environ.get('METAVLM_ROS_TOOLS', ROOT.parent / 'shared' / 'ros-tools'))
BIN = Path(sys.executable).parent  # the virtualenv's bin: tools/setup.sh installs the tools there
REQUIRE_ENV = 'METAVLM_REQUIRE_ROS_TOOLS'

# tool -> (what proves it is installed, how to check)
_TOOLS = {
    'ros2': ('executable', 'ros2'),
    'colcon': ('executable', 'colcon'),
    'rosdep': ('executable', 'rosdep'),
    'launch_testing': ('module', 'launch_testing'),
    'launch_ros': ('module', 'launch_ros'),
    'ros2lifecycle': ('module', 'ros2lifecycle'),
    'ros2param': ('module', 'ros2param'),
    'rosdep_data': ('file', 'rosdep/base.yaml'),
}


def missing(names: tuple[str, ...]) -> list[str]:
    """The tools among `names` that are not installed here."""
    absent = []
    for name in names:
        kind, what = _TOOLS[name]
        if kind == 'executable':
            ok = (BIN / what).is_file()
        elif kind == 'module':
            ok = importlib.util.find_spec(what) is not None
        else:
            ok = (ROS_TOOLS_DIR / what).is_file()
        if not ok:
            absent.append(name)
    return absent
