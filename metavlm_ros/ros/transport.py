"""The DDS transport of local runs: Fast DDS shared memory large enough for raw camera frames."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    'PROFILE_FILE',
    'TRANSPORTS',
    'USER_VARIABLES',
    'add_transport_argument',
    'local_transport_env',
    'shm_profile',
    'use_transport',
]

TRANSPORTS = ('shm', 'default')
PROFILE_FILE = 'fastdds_shm.xml'
# Variables by which a user (or their robot's setup) already chose Fast DDS's transports: then ours
# is not imposed.
USER_VARIABLES = (
    'FASTDDS_DEFAULT_PROFILES_FILE',
    'FASTRTPS_DEFAULT_PROFILES_FILE',
    'FASTDDS_BUILTIN_TRANSPORTS',
)


def shm_profile() -> Path | None:
    """The shipped Fast DDS profile config/fastdds_shm.xml, wherever the package is installed.

    Looked for in the package's share directory (colcon, or a pip install into a prefix) and in the
    source checkout (an editable install); None when neither has it.
    """
    candidates = []
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            candidates.append(Path(get_package_share_directory('metavlm_ros')) / 'config')
        except (PackageNotFoundError, OSError):  # not installed there, or no AMENT_PREFIX_PATH at all
            pass
    except ImportError:
        pass
    candidates.append(Path(sys.prefix) / 'share' / 'metavlm_ros' / 'config')
    candidates.append(Path(__file__).resolve().parents[2] / 'config')
    for directory in candidates:
        if (directory / PROFILE_FILE).is_file():
            return directory / PROFILE_FILE
    return None


def local_transport_env(env: Mapping[str, str] | None = None, transport: str = 'shm') -> dict[str, str]:
    """The environment variables that give processes of this machine the project's transport.

    Args:
        env: The environment to judge (default os.environ): when it already chooses Fast DDS
            transports (USER_VARIABLES), or another RMW than Fast DDS, nothing is added.
        transport: 'shm' (the project's default) or 'default' (DDS as installed: nothing added).

    Returns:
        Variables to add ({} when none).
    """
    env = os.environ if env is None else env
    if transport not in TRANSPORTS:
        raise ValueError(f'transport must be one of {", ".join(TRANSPORTS)}, got {transport!r}')
    rmw = env.get('RMW_IMPLEMENTATION', '') or 'rmw_fastrtps_cpp'
    if transport == 'default' or 'fastrtps' not in rmw or any(env.get(name) for name in USER_VARIABLES):
        return {}
    profile = shm_profile()
    return {} if profile is None else {'FASTDDS_DEFAULT_PROFILES_FILE': str(profile)}


@contextmanager
def use_transport(transport: str = 'shm', env: MutableMapping[str, str] | None = None) -> Iterator[str]:
    """Give this process (rclpy started inside the block) and its children the transport.

    Fast DDS reads the profile when a process makes its first participant; the variables are taken
    away again after the block, so that they do not leak into what this process starts later.

    Yields:
        A short description for logs.
    """
    env = os.environ if env is None else env
    added = local_transport_env(env, transport)
    env.update(added)
    try:
        if added:
            yield f'Fast DDS shared memory for full-size frames ({added["FASTDDS_DEFAULT_PROFILES_FILE"]})'
        else:
            chosen = [f'{name}={env[name]}' for name in USER_VARIABLES if env.get(name)]
            yield 'DDS as configured: ' + (', '.join(chosen) if chosen else 'defaults')
    finally:
        for name in added:
            env.pop(name, None)


def add_transport_argument(parser: argparse.ArgumentParser) -> None:
    """The --dds-transport option of the commands that start ROS processes on this machine."""
    parser.add_argument(
        '--dds-transport',
        choices=TRANSPORTS,
        default='shm',
        help='shm (default): Fast DDS shared memory with room for raw full-size frames, for this process '
        'and the processes it talks to on this machine, unless FASTDDS_DEFAULT_PROFILES_FILE or '
        'FASTDDS_BUILTIN_TRANSPORTS already choose; default: DDS as installed',
    )
