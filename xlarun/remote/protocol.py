"""The lines the launcher and a host's agent exchange over the transport's standard streams.

Launcher to agent (the agent's stdin):

- the first line: the host's plan, JSON (:class:`~xlarun.remote.plan.HostPlan`);
- an empty line every ``host_timeout / 3`` seconds: the heartbeat;
- ``go {"master_addr": ..., "master_port": ...}``: every host is ready, start the workers with node 0's
  store there;
- ``signal {"number": N}``: pass SIGUSR1 or SIGUSR2 to the node, which passes it to its workers;
- ``stop``: stop the workers (the usual teardown);
- end of file: the launcher or the connection is gone, so the agent stops its workers too.

Agent to launcher (its stdout): marker lines, each starting with :data:`MARKER` (ASCII's record
separator, which no worker prints at the start of a line by chance), that the launcher keeps out of
the relayed output: ``ready``, ``refused``, ``end`` (:class:`AgentReport`) and ``alive``, the
heartbeat, sent whenever the agent said nothing for ``host_timeout / 3`` seconds: every byte on the
agent's stdout comes through the agent, so the launcher takes any of them for a sign of its life.
Every other line on the agent's stdout and stderr is the node's own output, relayed as it is.
"""

from __future__ import annotations

import json
from typing import Any

from xlarun.structs import Struct

MARKER = b"\x1exlarun-agent "
READY, REFUSED, END, ALIVE = "ready", "refused", "end", "alive"
GO, SIGNAL, STOP = "go", "signal", "stop"
HEARTBEAT = b"\n"
HEARTBEATS_PER_TIMEOUT = 3
"""Heartbeats the launcher sends per ``--host-timeout``: two may be lost or late before an agent gives up."""


class AgentReport(Struct, frozen=True):
    """A marker line from an agent: ``kind`` is :data:`READY`, :data:`REFUSED`, :data:`END` or :data:`ALIVE`.

        ``ready``: ``{"address": the host's address as the launcher reached it, or null; "port": a port free
        there, or null}``;
        ``refused``: ``{"reason": one line}``; ``end``: ``{"exit_code": N, "summary": the node's summary or null,
    "started": whether the node started, "stopped_because": why the agent stopped it on its own, or null}``;
    ``alive``: ``{}``.
    """

    kind: str
    data: dict[str, Any]

    def line(self) -> bytes:
        return MARKER + f"{self.kind} {json.dumps(self.data, separators=(',', ':'))}\n".encode()


def read_report(line: bytes) -> AgentReport | None:
    """The report a line of an agent's stdout holds, or None for the node's own output."""
    if not line.startswith(MARKER):
        return None
    kind, _, body = line[len(MARKER) :].decode(errors="replace").strip().partition(" ")
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return None
    if kind not in (READY, REFUSED, END, ALIVE) or not isinstance(data, dict):
        return None
    return AgentReport(kind, data)


def go_line(master_addr: str, master_port: int | None) -> bytes:
    return f"{GO} {json.dumps({'master_addr': master_addr, 'master_port': master_port})}\n".encode()


def signal_line(number: int) -> bytes:
    return f"{SIGNAL} {json.dumps({'number': number})}\n".encode()


def stop_line() -> bytes:
    return f"{STOP}\n".encode()


def read_order(line: bytes) -> tuple[str, dict[str, Any]]:
    """A line of the agent's stdin after the plan: ``("", {})`` for a heartbeat, ``("go", {...})``,
    ``("signal", {"number": N})``, ``("stop", {})``; an unknown word reads as ``stop``: a launcher the agent does not understand is
    one it cannot follow."""
    word, _, body = line.decode(errors="replace").strip().partition(" ")
    if not word:
        return "", {}
    try:
        data = json.loads(body) if word in (GO, SIGNAL) else {}
    except ValueError:
        return STOP, {}
    if word == GO and isinstance(data, dict) and isinstance(data.get("master_addr"), str):
        return GO, data
    if word == SIGNAL and isinstance(data, dict) and isinstance(data.get("number"), int):
        return SIGNAL, data
    return STOP, {}
