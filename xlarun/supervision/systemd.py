"""systemd's readiness protocol: ``READY=1`` once the workers run, ``STATUS=`` at each change.

Usage::

    sink = SystemdNotify.from_environ(environ, nproc_per_node=2)   # None without NOTIFY_SOCKET
    EventBus([sink])

Under a ``Type=notify`` unit systemd sets ``NOTIFY_SOCKET`` to an ``AF_UNIX`` datagram socket, a
path or an abstract name written with a leading ``@`` (sd_notify(3)); each datagram holds
newline-separated ``KEY=VALUE`` assignments. ``READY=1`` goes once, when this node's workers of
the first attempt all started (the unit is then "active"); ``STATUS=`` lines say the attempt,
rendezvous rounds, workers running, restarts and the end (``systemctl status`` shows the last);
``STOPPING=1`` goes with the end. A datagram the socket does not take is dropped by the bus.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import cast

from xlarun.structs import Struct, field
from xlarun.supervision.events import Event


def socket_address(value: str) -> str:
    """The address ``NOTIFY_SOCKET`` names: ``@name`` is the abstract name ``\\0name``."""
    return "\0" + value[1:] if value.startswith("@") else value


class SystemdNotify(Struct):
    """Tells systemd the launch's state; see the module docstring."""

    address: str
    nproc_per_node: int
    _socket: socket.socket | None = None
    _ready: bool = False
    _running: set[int] = field(default_factory=set)

    @staticmethod
    def from_environ(environ: Mapping[str, str], nproc_per_node: int) -> SystemdNotify | None:
        value = environ.get("NOTIFY_SOCKET", "")
        if not value.startswith(("/", "@")):
            return None  # unset, or not an AF_UNIX address (systemd's vsock form is not spoken here)
        return SystemdNotify(socket_address(value), nproc_per_node)

    def handle(self, event: Event) -> None:
        attributes = event.attributes
        status = None
        ready = False
        if event.name == "rendezvous.started":
            status = f"attempt {event.attempt}: rendezvous round {attributes.get('round')}"
        elif event.name == "worker.started":
            self._running.add(cast(int, attributes["rank"]))
            status = f"attempt {event.attempt}: {len(self._running)} of {self.nproc_per_node} workers running"
            ready = not self._ready and len(self._running) >= self.nproc_per_node
        elif event.name == "worker.exited":
            self._running.discard(cast(int, attributes["rank"]))
            status = (
                f"attempt {event.attempt}: worker {attributes['rank']} exited with "
                f"{attributes.get('process.exit.code')}, {len(self._running)} running"
            )
        elif event.name == "restart":
            self._running.clear()
            status = f"restarting the workers ({attributes.get('restarts_left')} restarts left)"
        elif event.name == "node.lost":
            status = f"node {attributes.get('node_rank')} lost: {attributes.get('reason')}"
        elif event.name == "hang.suspected":
            status = f"workers hung: {attributes.get('reason')}"
        elif event.name == "launch.finished":
            self._send(
                f"STOPPING=1\nSTATUS=finished: {attributes.get('result')}, "
                f"exit code {attributes.get('process.exit.code')}"
            )
            return
        if status is None:
            return
        self._send(("READY=1\n" if ready else "") + f"STATUS={status}")
        self._ready = self._ready or ready

    def __str__(self) -> str:
        return "systemd's NOTIFY_SOCKET"

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()

    def _send(self, message: str) -> None:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.sendto(message.encode(), self.address)
