"""Each test session gets a ROS domain of its own: never one another session holds, nor one in use."""

import mmap
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test import ros_domain
from test.ros_domain import PORT_BASE, claim_domain, domains_in_use, port_domain

ROOT = Path(__file__).resolve().parents[1]


def test_this_session_runs_in_a_domain_it_holds():
    domain = int(os.environ['ROS_DOMAIN_ID'])
    assert domain in ros_domain._held


def test_port_mapping_follows_rtps():
    assert port_domain(7400) == 0 and port_domain(7411) == 0 and port_domain(7650) == 1
    assert port_domain(PORT_BASE + 250 * 42 + 11) == 42
    assert port_domain(5353) is None and port_domain(65535) == 232


def test_another_session_never_gets_the_domain_this_one_holds():
    mine = int(os.environ['ROS_DOMAIN_ID'])
    # The other session prefers this one's domain (the same exported ROS_DOMAIN_ID, or the same pid
    # remainder) and claims a second while it runs: it gets neither of ours.
    second = claim_domain(preferred=mine)
    assert second != mine
    code = (
        'import sys; sys.path.insert(0, sys.argv[1]); from test.ros_domain import claim_domain; '
        'print(claim_domain(preferred=int(sys.argv[2])), claim_domain(preferred=int(sys.argv[3])))'
    )
    done = subprocess.run(
        [sys.executable, '-c', code, str(ROOT), str(mine), str(second)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    theirs = {int(d) for d in done.stdout.split()}
    assert len(theirs) == 2 and not theirs & {mine, second}


def _free_candidates(count):
    busy = domains_in_use()
    free = [d for d in range(150, 199) if d not in busy and d not in ros_domain._held]
    if len(free) < count:
        pytest.skip('too few unused domains on this machine for the test')
    return free[:count]


def test_a_domain_whose_udp_ports_are_in_use_is_skipped():
    (domain, other) = _free_candidates(2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(('127.0.0.1', PORT_BASE + 250 * domain + 11))  # a participant's unicast port
        assert domain in domains_in_use()
        assert claim_domain(preferred=domain, candidates=[domain, other]) == other


def test_a_domain_whose_shared_memory_port_is_mapped_is_skipped(tmp_path):
    (domain, other) = _free_candidates(2)
    shm = Path('/dev/shm')
    if not shm.is_dir():
        pytest.skip('no /dev/shm')
    path = shm / f'fastdds_port{PORT_BASE + 250 * domain + 13}'
    assert not path.exists()
    try:
        with open(path, 'w+b') as handle:  # what a Fast DDS participant with the SHM transport maps
            handle.truncate(4096)
            with mmap.mmap(handle.fileno(), 4096):
                assert domain in domains_in_use()
                assert claim_domain(preferred=domain, candidates=[domain, other]) == other
    finally:
        path.unlink(missing_ok=True)
