"""Sockets on this host, for the launcher and the worker alike.

A free port (a standalone run's store, a worker's XRT gRPC server), whether an address is this
machine's, a taken master port caught before anything starts, the address this host
shows a peer, and ``host:port`` as sockets and URLs spell it. Imports no torch: the
launcher starts without it and the worker imports this before torch.
"""

from __future__ import annotations

import contextlib
import errno
import socket

IN_USE = "already in use"
"""What :func:`port_in_use` answers when something else holds the port."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now at ``host`` (the kernel's pick), as torchrun's ``localhost:0``.

    ``host`` is an IPv4 or IPv6 address of this machine.
    """
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """``count`` distinct ports nothing listens on now at ``host``, each the kernel's pick.

    Every probe stays bound until the last is picked, so no port comes twice; ``0.0.0.0`` (or ``::``)
    checks every address of the host at once. Nothing holds them afterwards: a port taken before
    its user binds it is lost, as with any pick of a free port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as probes:
        ports = []
        for _ in range(count):
            probe = probes.enter_context(socket.socket(family, socket.SOCK_STREAM))
            probe.bind((host, 0))
            ports.append(probe.getsockname()[1])
        return tuple(ports)


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[fe80::1]:62182``)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def address_facing(host: str, port: int) -> str:
    """This machine's address on the route to ``host``: one that ``host``'s side can reach back.

    Falls back to this machine's fully qualified name when no route is known.
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            # A datagram socket's connect sends nothing; it only picks the route.
            probe.connect(sockaddr)
            return probe.getsockname()[0]
    except OSError:
        return socket.getfqdn()


def resolver_name(host: str) -> str | bytes:
    """``host`` as :func:`socket.getaddrinfo` takes it: the same bytes its IDNA codec would give for an
    ASCII name whose labels the codec accepts (addresses, ``localhost``), so that a launch loads no
    codec (``encodings.idna`` with ``stringprep`` and ``unicodedata``); any other name as it is, for the
    codec to encode or refuse."""
    labels = host.split(".")
    if host.isascii() and all(0 < len(label) < 64 for label in labels[:-1]) and len(labels[-1]) < 64:
        return host.encode("ascii")
    return host


def is_local_address(host: str) -> bool:
    """True when ``host`` names this machine (loopback, or an address a socket can bind here)."""
    try:
        infos = socket.getaddrinfo(resolver_name(host), None, type=socket.SOCK_STREAM)
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


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on here, or ``None`` when it can.

    :data:`IN_USE` when something else holds the port; otherwise the resolver's or the
    kernel's reason (an unknown name, an address not on this machine, a privileged port).
    """
    try:
        infos = socket.getaddrinfo(resolver_name(host), port, type=socket.SOCK_STREAM)
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
                return IN_USE
            return error.strerror or str(error)
    return None


def taken_here(host: str, port: int) -> bool:
    """Whether ``host:port`` names this machine and something already listens there.

    Only a taken port counts: another reason not to bind is left to the store, which
    reports it in its own words. Port 0 (the kernel picks) is never taken.
    """
    return port != 0 and is_local_address(host) and port_in_use(host, port) == IN_USE
