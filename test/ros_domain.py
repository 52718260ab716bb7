"""A ROS domain for one test session: no other session on this machine holds it, none of its ports in use.

Nodes of two test runs in one domain answer each other (the same node names, the same topics): a
probe answered by the other run's perception node, a lifecycle request served by the other run's
tester. A pid-based domain id can be shared by two runs, and an exported ROS_DOMAIN_ID by two
checkouts. So each session claims its domain: an exclusive lock file per domain, held for the life
of the process, and only a domain whose RTPS ports no process of this machine uses (UDP sockets in
/proc/net/udp*, Fast DDS shared-memory ports mapped by a live process). Discovery stays on this
machine (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST), so this machine is all there is to check.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ['LOCK_DIR', 'claim_domain', 'domains_in_use', 'port_domain']

FIRST, LAST = 100, 199  # the range chosen from when nothing is preferred
MAX_DOMAIN = 232  # the largest domain id whose RTPS ports fit in 16 bits
PORT_BASE, DOMAIN_GAIN = 7400, 250  # RTPS port mapping: PB + DG * domain + offsets
LOCK_DIR = Path(tempfile.gettempdir()) / 'metavlm-ros-domains'
_SHM_PORT = re.compile(r'/dev/shm/fastdds_port(\d+)')
_held: dict[int, int] = {}  # domain -> descriptor of its lock, open for the life of this process


def port_domain(port: int) -> int | None:
    """The ROS domain whose RTPS ports include `port` (None: below the RTPS range)."""
    if port < PORT_BASE:
        return None
    domain = (port - PORT_BASE) // DOMAIN_GAIN
    return domain if domain <= MAX_DOMAIN else None


def _udp_ports() -> set[int]:
    ports = set()
    for table in ('/proc/net/udp', '/proc/net/udp6'):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 1:
                ports.add(int(fields[1].rsplit(':', 1)[1], 16))
    return ports


def _shared_memory_ports() -> set[int]:
    ports = set()
    for maps in Path('/proc').glob('[0-9]*/maps'):
        try:
            text = maps.read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        ports.update(int(port) for port in _SHM_PORT.findall(text))
    return ports


def domains_in_use() -> set[int]:
    """Domains in which some process of this machine has a DDS participant now (UDP or shared memory)."""
    ports = _udp_ports() | _shared_memory_ports()
    return {domain for domain in map(port_domain, ports) if domain is not None}


def _lock(domain: int) -> bool:
    LOCK_DIR.mkdir(exist_ok=True)
    fd = os.open(LOCK_DIR / f'{domain}.lock', os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held[domain] = fd
    return True


def claim_domain(preferred: int | None = None, candidates: Iterable[int] | None = None) -> int:
    """Claim a domain for this process: `preferred` if it is free, else the next free one.

    Free: no other process holds its lock and no process of this machine uses its ports. The lock is
    kept until this process ends; a second claim in the same process gets another domain.

    Raises:
        RuntimeError: every candidate is locked by another process.
    """
    if candidates is None:
        start = FIRST + os.getpid() % (LAST - FIRST + 1)
        candidates = [*range(start, LAST + 1), *range(FIRST, start)]
    order = list(dict.fromkeys([*([preferred] if preferred is not None else []), *candidates]))
    busy = domains_in_use()
    for domain in order:
        if domain not in _held and domain not in busy and _lock(domain):
            return domain
    # Ports can stay bound by unrelated programs: a domain no other session holds is the fallback.
    for domain in order:
        if domain not in _held and _lock(domain):
            return domain
    raise RuntimeError(f'no ROS domain free among {order[0]}..{order[-1]}: other test sessions hold them all')
