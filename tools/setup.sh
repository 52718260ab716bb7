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
# torch==2.13.0 is pinned in requirements.txt: it is the CPU build (an unpinned torch pulls CUDA).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "metavlm_ros is set up in .venv ($(.venv/bin/python --version))"
