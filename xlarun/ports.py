"""Port checks on this host: a free port for ``--standalone``, a taken master port caught early."""

from __future__ import annotations

import errno
import socket
from typing import Optional

from xlarun.exceptions import UsageError


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick), as torchrun's ``localhost:0``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def is_local_address(host: str) -> bool:
    """True when ``host`` names this machine (loopback, or an address a socket can bind here)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
                return True
        except OSError:
            continue
    return False


def port_in_use(host: str, port: int) -> Optional[str]:
    """Why ``host:port`` cannot be listened on, or ``None`` when it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        return f"cannot resolve {host}: {error.strerror}"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the store will: a port held only by TIME_WAIT connections is usable.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return "already in use"
            return None
    return None


def ensure_master_port_free(host: str, port: int) -> None:
    """Fail with one line, before anything starts, when the master port is taken here."""
    if port == 0 or not is_local_address(host):
        return
    problem = port_in_use(host, port)
    if problem == "already in use":
        raise UsageError(f"master port {port} on {host} is already in use: pick another with "
                         "--master_port PORT, or use --standalone for a free one")
