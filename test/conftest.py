"""Shared fixtures: a seeded rng, a synthetic frame, tiny random-initialised models, a local ROS domain."""

import functools
import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from test.ros_domain import claim_domain

# DDS traffic stays on this machine, in a domain this test session holds (test/ros_domain.py): an
# exported ROS_DOMAIN_ID is taken when no other session holds it and no other process uses it.
os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
_ASKED_DOMAIN = os.environ.get('ROS_DOMAIN_ID', '')
os.environ['ROS_DOMAIN_ID'] = str(claim_domain(int(_ASKED_DOMAIN) if _ASKED_DOMAIN.isdigit() else None))
os.environ['HF_HUB_OFFLINE'] = '1'
os.environ['TRANSFORMERS_OFFLINE'] = '1'


@functools.lru_cache(maxsize=1)
def can_mount_tmpfs() -> bool:
    """Whether this machine lets a test mount a small tmpfs of its own (a user and mount namespace)."""
    try:
        done = subprocess.run(['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs -o size=64k tmpfs /mnt'],
                              capture_output=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def pytest_report_header(config: pytest.Config) -> str:
    """Which ROS domain the session's nodes run in, and why it is not the one exported."""
    domain = os.environ['ROS_DOMAIN_ID']
    if _ASKED_DOMAIN and _ASKED_DOMAIN != domain:
        return f'ROS domain {domain} (ROS_DOMAIN_ID {_ASKED_DOMAIN} held by another session or in use)'
    return f'ROS domain {domain}'


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose ROS 2 tools are missing, or fail it where they are required (CI)."""
    from test.ros_tools import REQUIRE_ENV, ROS_TOOLS_DIR, missing

    for marker in item.iter_markers('ros_tools'):
        absent = missing(marker.args)
        if not absent:
            continue
        reason = f'needs the ROS 2 tools {", ".join(absent)}: run tools/setup.sh with {ROS_TOOLS_DIR} present'
        if os.environ.get(REQUIRE_ENV) == '1':
            pytest.fail(f'{REQUIRE_ENV}=1 but this test {reason}', pytrace=False)
        pytest.skip(reason)


#: Set by CI (.ci/run): a skipped test checked nothing, so a run with any skip fails.
FAIL_ON_SKIP_ENV = 'METAVLM_FAIL_ON_SKIP'


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under METAVLM_FAIL_ON_SKIP=1 a run that skipped any test fails, naming the skipped tests."""
    reporter = session.config.pluginmanager.get_plugin('terminalreporter')
    skipped = reporter.stats.get('skipped', []) if reporter is not None else []
    if os.environ.get(FAIL_ON_SKIP_ENV) == '1' and skipped and session.exitstatus == 0:
        names = ', '.join(report.nodeid for report in skipped[:10])
        reporter.write_line(
            f'{FAIL_ON_SKIP_ENV}=1: {len(skipped)} test(s) skipped, which checks nothing: {names}'
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# launch_testing files: run by test/ros/test_launch_system.py through `launch_test`, not by pytest.
collect_ignore_glob = ['launch/test_*.launch.py']


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def make_frame(width: int = 160, height: int = 120, seed: int = 0) -> np.ndarray:
    """A deterministic RGB test frame with structure (gradients, blocks, a bright disc)."""
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    frame = np.zeros((height, width, 3), np.uint8)
    frame[..., 0] = (xx * 255 // max(width - 1, 1)).astype(np.uint8)
    frame[..., 1] = (yy * 255 // max(height - 1, 1)).astype(np.uint8)
    frame[..., 2] = 128
    for _ in range(6):
        x0, y0 = gen.integers(0, width - 20), gen.integers(0, height - 20)
        frame[y0 : y0 + 16, x0 : x0 + 16] = gen.integers(0, 256, 3)
    disc = (xx - width // 2) ** 2 + (yy - height // 2) ** 2 < (min(width, height) // 6) ** 2
    frame[disc] = (250, 240, 200)
    return frame


def write_frames(folder: Path, count: int, width: int, height: int, stem: str = 'frame') -> Path:
    """`count` test frames (make_frame, seeds 0..count-1) as PNG files <stem><i>.png in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        assert cv2.imwrite(str(folder / f'{stem}{i}.png'), make_frame(width, height, seed=i)[..., ::-1])
    return folder


@pytest.fixture
def frame() -> np.ndarray:
    return make_frame()


@pytest.fixture(scope='session')
def tiny_model_dirs(tmp_path_factory):
    """Directories of tiny random-initialised models, built once per test session, by backend and variant
    (`tiny_model_dirs('detector', family='owlv2')`)."""
    from metavlm_ros.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp('tiny-models')
    built = {}

    def get(backend: str, **variant):
        key = (backend, *sorted(variant.items()))
        if key not in built:
            name = '-'.join([backend, *map(str, variant.values())])
            built[key] = build_tiny_model(backend, root / name, seed=0, **variant)
        return built[key]

    return get


@pytest.fixture(scope='session')
def tiny_clip_dir(tiny_model_dirs):
    return tiny_model_dirs('clip')


@pytest.fixture(scope='session')
def tiny_blip_dir(tiny_model_dirs):
    return tiny_model_dirs('blip')


@pytest.fixture(scope='session')
def tiny_instructblip_dir(tiny_model_dirs):
    return tiny_model_dirs('instructblip')
