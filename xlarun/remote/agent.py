"""A host's agent (``python -m xlarun --agent-stdin``): the remote end of the launcher's transport.

It reads its plan from standard input (:mod:`xlarun.remote.protocol`), moves to the plan's
directory, checks the host (:func:`xlarun.remote.checks.check_host`) and says ``ready`` (or
``refused`` and why); on ``go`` it starts this host's xlarun as a child, a node of the job (its
failure records name the host as the plan does: ``XLARUN_REPORT_HOST``), and watches its standard input.

The agent and the launcher watch each other. A remote program is not told when its ssh client dies:
without a terminal no SIGHUP comes, and a silent program runs on, reparented to pid 1. So the agent
stops its node when its standard input closes (the launcher or the connection is gone), when no
heartbeat came for ``host_timeout`` seconds (a frozen launcher, a half-open connection), or when told
``stop``: SIGTERM to the node's xlarun, which tears its workers down as on Ctrl-C (the stop signal, the
grace, SIGKILL). A second reason sends SIGKILL; the node's orphan guard then kills the workers.
Only the agent's own child is ever signalled, by its pid: nothing is killed by name. The other way,
the agent says something on its standard output at least every ``host_timeout / 3`` seconds (the
node's output, else a heartbeat), so a launcher hears a frozen or killed agent fall silent.

The node's standard output passes through the agent (:class:`Voice`): the agent is the one writer of
its standard output, so its reports always start a line of their own, and never wait on a launcher
that stopped reading (they queue, as the node's output then does). The node's stderr is the agent's.

A node outlives an agent killed with SIGKILL by nothing: it is started with ``PR_SET_PDEATHSIG``
(SIGTERM), so the kernel stops it the moment the agent dies, however it dies. That needs nothing of
the node (which watches no input of its own, and whose workers may read theirs), where a lifeline
pipe would need the node to watch it; and it holds where the agent is killed between two turns of
its loop. The agent starts no thread, so the thread that forked the node (the one the kernel
watches) is the agent itself.

When the node ends, the agent sends ``end`` with its exit code and its summary (the failure report is
made from it: the node leaves the report to the launcher, :data:`~xlarun.supervision.report.SHOWN_BY_LAUNCHER_VARIABLE`),
and exits with that code.
"""

from __future__ import annotations

import ctypes
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
from xlarun.remote.protocol import (
    ALIVE,
    END,
    GO,
    HEARTBEATS_PER_TIMEOUT,
    READY,
    REFUSED,
    SIGNAL,
    STOP,
    AgentReport,
    read_order,
)
from xlarun.supervision.report import REPORT_HOST_VARIABLE, SHOWN_BY_LAUNCHER_VARIABLE
from xlarun.supervision.signals import RELAYED_SIGNALS

SUMMARY_NAME = "summary.json"
PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal the calling process gets when the thread that forked it ends."""
PAUSE_BYTES = 1 << 20
"""Queued output at which the agent stops reading the node's stdout until the launcher takes some."""


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


class Voice:
    """The agent's standard output: its reports, and the node's stdout passed through whole.

    Written without blocking (a launcher that stopped reading must not stop the agent from watching
    it): what the pipe does not take waits in :attr:`outbox`. A report goes out at a line's start (a
    node's line cut short is ended first), and a heartbeat whenever nothing went out for ``interval``
    seconds.
    """

    def __init__(self, interval: float, fd: int = 1):
        self.fd = fd
        self.interval = interval
        self.outbox = bytearray()
        self.line_start = True
        self.said_at = time.monotonic()
        self.gone = False
        os.set_blocking(fd, False)

    def relay(self, data: bytes) -> None:
        """The node's output, as it came."""
        if data:
            self.line_start = data.endswith(b"\n")
            self.queue(data)

    def report(self, kind: str, **data: Any) -> None:
        """One marker line, at a line's start."""
        self.queue((b"" if self.line_start else b"\n") + AgentReport(kind, data).line())
        self.line_start = True

    def beat(self) -> None:
        """A heartbeat, where nothing went out for :attr:`interval` seconds."""
        if time.monotonic() - self.said_at >= self.interval:
            self.report(ALIVE)

    def beat_due_in(self) -> float:
        return max(0.0, self.said_at + self.interval - time.monotonic())

    @property
    def full(self) -> bool:
        return len(self.outbox) >= PAUSE_BYTES

    def queue(self, data: bytes) -> None:
        self.said_at = time.monotonic()
        if not self.gone:
            self.outbox += data
            self.write()

    def write(self) -> None:
        """What the pipe takes now; a launcher gone drops the rest."""
        try:
            written = os.write(self.fd, self.outbox) if self.outbox else 0
        except BlockingIOError:
            return
        except OSError:
            self.gone = True
            self.outbox.clear()
            return
        del self.outbox[:written]

    def flush(self) -> None:
        """Everything queued, blocking: the agent's last words."""
        os.set_blocking(self.fd, True)
        self.write()


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
    voice = Voice(interval=15.0 / HEARTBEATS_PER_TIMEOUT)
    try:
        plan = HostPlan.from_json(line)
    except (ValueError, TypeError, KeyError) as error:
        voice.report(REFUSED, reason=f"cannot read the launcher's plan ({error}): is the launcher's xlarun this one?")
        voice.flush()
        return 1
    voice.interval = plan.host_timeout / HEARTBEATS_PER_TIMEOUT
    problem = check_host(plan)  # the release first, then the directory, the command, the device
    if problem is None:
        try:
            os.chdir(plan.cwd)
        except OSError as error:  # there, but not this user's to enter
            problem = f"{plan.cwd}: {error.strerror}; pass --remote-cwd"
    if problem is not None:
        voice.report(REFUSED, reason=problem)
        voice.flush()
        return 1
    port = free_port("0.0.0.0") if plan.node_rank == 0 and plan.master_port is None else plan.master_port
    voice.report(READY, address=reached_address(), port=port)
    watch = Watch(stdin, plan.host_timeout)
    order = wait_for_go(watch, voice)
    if order is None:
        voice.report(END, exit_code=1, summary=None, started=False)
        voice.flush()
        return 1
    exit_code = run_node(plan, order, watch, voice)
    voice.flush()
    return exit_code


class Watch:
    """The launcher as the agent hears it: orders, heartbeats, the end of its input."""

    def __init__(self, stdin: Stdin, host_timeout: float):
        self.stdin = stdin
        self.host_timeout = host_timeout
        self.heard = time.monotonic()
        self.go: dict[str, Any] = {}
        self.signals: list[int] = []
        """The signals the launcher passed on, for the node, in order."""
        self.stop_reason: str | None = None
        """Why the first stop came, where the launcher did not ask for it: its end report says so."""

    def read(self) -> list[str]:
        """Orders that arrived (call when standard input is readable): ``go`` (its data kept in :attr:`go`),
        ``signal`` (its number in :attr:`signals`), ``stop``, and ``stop`` for an input that closed."""
        orders = []
        for line in self.stdin.read_lines():
            self.heard = time.monotonic()
            word, data = read_order(line)
            if word == GO:
                self.go = data
            elif word == SIGNAL:
                self.signals.append(data["number"])
            if word:
                orders.append(self.stop("") if word == STOP else word)
        if self.stdin.closed:
            orders.append(self.stop("the launcher's connection closed"))
        return orders

    def silence(self) -> list[str]:
        """``stop`` where no heartbeat came for ``host_timeout`` seconds (once per such silence)."""
        if self.stdin.closed or time.monotonic() - self.heard <= self.host_timeout:
            return []
        self.heard = time.monotonic()
        return [self.stop(f"no heartbeat from the launcher for {self.host_timeout:g} s")]

    def silence_due_in(self) -> float:
        return float("inf") if self.stdin.closed else max(0.0, self.heard + self.host_timeout - time.monotonic())

    def stop(self, reason: str) -> str:
        """A stop order; ``reason`` (empty where the launcher asked) is kept if it is the first."""
        if self.stop_reason is None:
            self.stop_reason = reason
        return STOP


def wait_for_go(watch: Watch, voice: Voice) -> dict[str, Any] | None:
    """The ``go`` order's data; None when told to stop (or the launcher is gone) first."""
    selector = selectors.DefaultSelector()
    selector.register(watch.stdin.fd, selectors.EVENT_READ)
    try:
        while True:
            ready = selector.select(min(voice.beat_due_in(), watch.silence_due_in()))
            orders = (watch.read() if ready else []) + watch.silence()
            if GO in orders:
                return watch.go
            if STOP in orders:
                return None
            voice.beat()
    finally:
        selector.close()


def die_with_agent(agent_pid: int, deathsig: Any) -> None:
    """In the node, between its fork and its exec: SIGTERM when the agent dies (see the module docstring)."""
    deathsig(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != agent_pid:  # the agent died before the wish was made
        os.kill(os.getpid(), signal.SIGTERM)


def run_node(plan: HostPlan, go: dict[str, Any], watch: Watch, voice: Voice) -> int:
    """Run this host's xlarun as a node until it ends, stopping it when the launcher says or is gone, and
    passing its stdout on."""
    private = tempfile.mkdtemp(prefix="xlarun-agent-")
    summary_path = os.path.join(private, SUMMARY_NAME)
    argv = [
        sys.executable,
        "-m",
        "xlarun",
        f"--summary-file={summary_path}",
        *plan.node_argv(go["master_addr"], go.get("master_port")),
    ]
    # The report names the host as the user named it, as the console's prefixes do; the launcher shows it,
    # made from the summary that ``end`` carries.
    env = {**os.environ, **plan.env, REPORT_HOST_VARIABLE: plan.host, SHOWN_BY_LAUNCHER_VARIABLE: "1"}
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork: the child only calls it
    agent_pid = os.getpid()
    try:
        node = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            preexec_fn=lambda: die_with_agent(agent_pid, prctl),
        )
    except OSError as error:
        shutil.rmtree(private, ignore_errors=True)
        sys.stderr.write(f"xlarun: cannot start the node: {error}\n")
        voice.report(END, exit_code=1, summary=None, started=False)
        return 1
    assert node.stdout is not None
    output = node.stdout.fileno()
    os.set_blocking(output, False)
    selector = selectors.DefaultSelector()
    selector.register(watch.stdin.fd, selectors.EVENT_READ, "orders")
    selector.register(output, selectors.EVENT_READ, "output")
    exited = os.pidfd_open(node.pid)
    selector.register(exited, selectors.EVENT_READ, "exited")
    stops = 0
    ended = False
    while not ended:
        follow(selector, output, reading=True, key="output", wanted=not voice.full)
        follow(selector, voice.fd, reading=False, key="voice", wanted=bool(voice.outbox) and not voice.gone)
        orders = watch.silence()
        for key, _ in selector.select(min(voice.beat_due_in(), watch.silence_due_in())):
            if key.data == "orders":
                orders += watch.read()
                if watch.stdin.closed:
                    selector.unregister(watch.stdin.fd)
            elif key.data == "output" and not relay_output(output, voice):
                selector.unregister(output)
                output = -1  # at its end
            elif key.data == "exited":
                ended = True
        for order in orders:
            if order == STOP:
                stops += 1
                node.send_signal(signal.SIGTERM if stops == 1 else signal.SIGKILL)
            elif order == SIGNAL:
                for number in watch.signals:
                    if number in RELAYED_SIGNALS:  # the node passes them to its workers
                        node.send_signal(number)
                watch.signals.clear()
        voice.write()
        voice.beat()
    while output >= 0 and relay_output(output, voice, until_empty=True):  # what the node wrote last
        pass
    selector.close()
    os.close(exited)
    node.stdout.close()
    node.wait()
    summary = None
    try:
        with open(summary_path) as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        pass  # a node killed before it wrote one
    shutil.rmtree(private, ignore_errors=True)
    exit_code = node.returncode if node.returncode >= 0 else 128 - node.returncode
    voice.report(END, exit_code=exit_code, summary=summary, started=True, stopped_because=watch.stop_reason or None)
    return exit_code


def follow(selector: selectors.BaseSelector, fd: int, reading: bool, key: str, wanted: bool = True) -> None:
    """Keep ``fd`` registered for reading (or, not ``reading``, writing) exactly while ``wanted``; a
    negative ``fd`` (a stream at its end) stays out."""
    if fd < 0:
        return
    registered = fd in selector.get_map()
    if wanted and not registered:
        selector.register(fd, selectors.EVENT_READ if reading else selectors.EVENT_WRITE, key)
    elif registered and not wanted:
        selector.unregister(fd)


def relay_output(fd: int, voice: Voice, until_empty: bool = False) -> bool:
    """Pass on what the node's stdout holds; False at its end (or, ``until_empty``, once it holds nothing
    more: the node is gone, and its orphan guard may hold the pipe open)."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return not until_empty
    except OSError:
        data = b""
    voice.relay(data)
    return bool(data)
