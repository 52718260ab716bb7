#!/usr/bin/env bash
# Set up metavlm_ros from nothing: a virtual environment in .venv with pinned requirements and the
# package installed in editable mode. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
# torch and torchvision are pinned in requirements.txt (an unpinned torch pulls the newest multi-GB build).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
# The ROS 2 tools (ros2 launch/param/lifecycle, launch_testing, colcon, rosdep) for the tests that run the
# package as a ROS user does. Their wheels are not on PyPI; where ../shared/ros-tools is absent those
# tests skip, saying so.
ROS_TOOLS=${METAVLM_ROS_TOOLS:-../shared/ros-tools}
if [ -d "$ROS_TOOLS/wheels" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "$ROS_TOOLS"/wheels/*.whl
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-ros-tools.txt
  echo "ROS 2 tools installed from $ROS_TOOLS"
else
  echo "no $ROS_TOOLS: the tests that need ros2 launch, launch_testing, colcon or rosdep will skip"
fi
echo "metavlm_ros is set up in .venv ($(.venv/bin/python --version))"
