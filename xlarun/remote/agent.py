"""A host's agent (``python -m xlarun --agent-stdin``): the remote end of the launcher's transport.

It reads its plan from standard input (:mod:`xlarun.remote.protocol`), moves to the plan's
directory, checks the host (:func:`xlarun.remote.checks.check_host`) and says ``ready`` (or
``refused`` and why); on ``go`` it starts this host's xlarun as a child, a node of the job (its
failure records name the host as the plan does: ``XLARUN_REPORT_HOST``), and watches its standard input.

A remote program is not told when its ssh client dies: without a terminal no SIGHUP comes, and
a silent program runs on, reparented to pid 1. So the agent stops its node when its standard
input closes (the launcher or the connection is gone), when no heartbeat came for
``host_timeout`` seconds (a frozen launcher, a half-open connection), or when told ``stop``:
SIGTERM to the node's xlarun, which tears its workers down as on Ctrl-C (the stop signal, the
grace, SIGKILL). A second reason sends SIGKILL; the node's orphan guard then kills the workers.
Only the agent's own child is ever signalled, by its pid: nothing is killed by name.

When the node ends, the agent sends ``end`` with its exit code and its summary, and exits with
that code.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from xlarun.host.ports import free_port
from xlarun.remote.checks import check_host
from xlarun.remote.plan import HostPlan
from xlarun.remote.protocol import END, GO, READY, REFUSED, STOP, AgentReport, read_order
from xlarun.supervision.report import REPORT_HOST_VARIABLE

SUMMARY_NAME = "summary.json"


class Stdin:
    """The agent's standard input, read in lines without blocking past what the loop allows."""

    def __init__(self, fd: int = 0):
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def read_lines(self) -> list[bytes]:
        """The whole lines that arrived (call when the fd is readable); sets :attr:`closed` at end of file."""
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line + b"\n" for line in lines]

    def read_plan(self) -> bytes | None:
        """The first line (the plan), read blocking; None if the input ends first."""
        while b"\n" not in self.buffer:
            data = os.read(self.fd, 65536)
            if not data:
                return None
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def report(kind: str, **data: Any) -> None:
    """One marker line on stdout; a launcher gone by now changes nothing."""
    try:
        os.write(1, AgentReport(kind, data).line())
    except OSError:
        pass


def reached_address() -> str | None:
    """This host's address as the launcher's ssh reached it (``SSH_CONNECTION``'s third field): where the
    other hosts find node 0 when the user named the hosts by aliases of their ssh configuration."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else None


def run_agent() -> int:
    """The agent's whole life; returns its exit code (the node's, or 1 when it never started)."""
    stdin = Stdin()
    line = stdin.read_plan()
    if line is None:
        return 1
    try:
        plan = HostPlan.from_json(line)
    except (ValueError, TypeError, KeyError) as error:
        report(REFUSED, reason=f"cannot read the launcher's plan ({error}): is the launcher's xlarun this one?")
        return 1
    problem = check_host(plan)  # the release first, then the directory, the command, the device
    if problem is not None:
        report(REFUSED, reason=problem)
        return 1
    try:
        os.chdir(plan.cwd)
    except OSError as error:  # there, but not this user's to enter
        report(REFUSED, reason=f"{plan.cwd}: {error.strerror}; pass --remote-cwd")
        return 1
    port = free_port("0.0.0.0") if plan.node_rank == 0 and plan.master_port is None else plan.master_port
    report(READY, address=reached_address(), port=port)
    watch = Watch(stdin, plan.host_timeout)
    order = watch.wait_for_go()
    if order is None:
        report(END, exit_code=1, summary=None, started=False)
        return 1
    return run_node(plan, order, watch)


class Watch:
    """The launcher as the agent hears it: orders, heartbeats, the end of its input."""

    def __init__(self, stdin: Stdin, host_timeout: float):
        self.stdin = stdin
        self.host_timeout = host_timeout
        self.heard = time.monotonic()
        self.go: dict[str, Any] = {}
        self.stop_reason: str | None = None
        """Why the first stop came, where the launcher did not ask for it: its end report says so."""
        self.selector = selectors.DefaultSelector()
        self.selector.register(stdin.fd, selectors.EVENT_READ)

    def next_orders(self, timeout: float) -> list[str]:
        """Orders that came within ``timeout`` seconds: ``go`` (its data kept in :attr:`go`), ``stop``, and
        ``stop`` for an input that closed or a heartbeat overdue."""
        if self.stdin.closed:
            time.sleep(timeout)
            return []
        orders = []
        if self.selector.select(timeout):
            for line in self.stdin.read_lines():
                self.heard = time.monotonic()
                word, data = read_order(line)
                if word == GO:
                    self.go = data
                if word:
                    orders.append(self.stop("") if word == STOP else word)
            if self.stdin.closed:
                self.selector.unregister(self.stdin.fd)
                orders.append(self.stop("the launcher's connection closed"))
        elif time.monotonic() - self.heard > self.host_timeout:
            self.heard = time.monotonic()  # one stop per silence of host_timeout
            orders.append(self.stop(f"no heartbeat from the launcher for {self.host_timeout:g} s"))
        return orders

    def stop(self, reason: str) -> str:
        """A stop order; ``reason`` (empty where the launcher asked) is kept if it is the first."""
        if self.stop_reason is None:
            self.stop_reason = reason
        return STOP

    def wait_for_go(self) -> dict[str, Any] | None:
        """The ``go`` order's data; None when told to stop (or the launcher is gone) first."""
        while True:
            for order in self.next_orders(self.host_timeout / 3):
                if order == GO:
                    return self.go
                if order == STOP:
                    return None


def run_node(plan: HostPlan, go: dict[str, Any], watch: Watch) -> int:
    """Run this host's xlarun as a node until it ends, stopping it when the launcher says or is gone."""
    private = tempfile.mkdtemp(prefix="xlarun-agent-")
    summary_path = os.path.join(private, SUMMARY_NAME)
    argv = [
        sys.executable,
        "-m",
        "xlarun",
        f"--summary-file={summary_path}",
        *plan.node_argv(go["master_addr"], go.get("master_port")),
    ]
    # The report names the host as the user named it, as the console's prefixes do.
    env = {**os.environ, **plan.env, REPORT_HOST_VARIABLE: plan.host}
    node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env)
    stops = 0
    while node.poll() is None:
        for order in watch.next_orders(0.1):
            if order == STOP:
                stops += 1
                node.send_signal(signal.SIGTERM if stops == 1 else signal.SIGKILL)
    summary = None
    try:
        with open(summary_path) as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        pass  # a node killed before it wrote one
    shutil.rmtree(private, ignore_errors=True)
    exit_code = node.returncode if node.returncode >= 0 else 128 - node.returncode
    report(END, exit_code=exit_code, summary=summary, started=True, stopped_because=watch.stop_reason or None)
    return exit_code
