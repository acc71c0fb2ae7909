"""The launcher's side of a multi-host job: one transport per host, one loop over all of them.

Every host's agent is started at once and sent its plan; only once every host said ``ready`` do
they all get ``go`` (with node 0's address and store port), so a host that cannot run the job (no
interpreter, a refused key, a busy device, a missing directory) costs no worker anywhere: one line
per failing host, every other one told to stop, exit 1.

Then the loop relays each host's output line by line, stdout to stdout and stderr to stderr (each
line whole, as the host's node wrote it: with ``--tee`` its workers' lines carry their
``host:rank`` prefix), sends heartbeats, and waits for every host's ``end``. Every node learns the
job's root cause through the rendezvous; no node prints the failure report (its agent tells it not to),
and the launcher prints it once, made from the ``end`` of the node that holds the root cause, else
node 0's. Each node's ``end`` is read once, where it
arrives, into the values a node's run ends with (:class:`NodeEnd`). A worker failing on any host stops
every host through the rendezvous; a stop signal (``--signals-to-handle``) sends ``stop`` to every host
and exits 128+N once every host reported its workers gone; a second one closes every agent's input
(each kills its node); SIGUSR1 and SIGUSR2 go to every node, which passes them to its workers.

Every stage has a deadline. A host not ``ready`` within :data:`READY_TIMEOUTS` host timeouts, or whose
agent said nothing (its node's output, its heartbeat) for a host timeout once ready, is given up: one
line naming it and why, its transport's process group killed, every other host stopped, exit 1. A
transport that exits without its agent's ``end`` is a lost host the same way, its line naming the
transport's exit status.

The exit code is otherwise the root cause's: the first non-zero node exit code in node-rank order
(node 0's first: its node holds the job's root cause).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from xlarun.console import console, say
from xlarun.failures import FailureRecord
from xlarun.flags import flag
from xlarun.remote.checks import host_command
from xlarun.remote.plan import HostPlan
from xlarun.remote.protocol import (
    END,
    HEARTBEAT,
    HEARTBEATS_PER_TIMEOUT,
    READY,
    REFUSED,
    go_line,
    read_report,
    signal_line,
    stop_line,
)
from xlarun.remote.transport import with_own_log
from xlarun.structs import Struct, field
from xlarun.supervision.end import RunEnd
from xlarun.supervision.report import print_failure_report, read_run_end, write_summary_file
from xlarun.supervision.signals import RELAYED_SIGNALS, SignalInbox

STDERR_LINES_KEPT = 5
"""The transport's last stderr lines kept per host: where ssh says why it could not connect."""
LOST_EXIT_CODE = 1
READY_TIMEOUTS = 4
"""How many ``--host-timeout`` a host gets to say ``ready`` (60 s by default): the connection, the remote
interpreter's start and the host's checks. Until then no heartbeat can come, and an interpreter stuck on a
dead mount would otherwise hold the launch for good."""
STOPPED_AFTER_FAILURE_S = 10.0
"""How long the other hosts get to end by themselves (the rendezvous tells them) after one host's node
failed, before they are told to stop."""


class NodeEnd(Struct, frozen=True):
    """A host's ``end`` report, read once where it arrives: the node's exit code, how its run ended (its
    summary read back: :func:`~xlarun.supervision.report.read_run_end`) and the summary's record as the
    node wrote it, which the fan-out's summary carries whole."""

    exit_code: int
    run: RunEnd | None
    """None where the node wrote no summary (killed before it could, or never started)."""
    record: dict[str, Any] | None
    stopped_because: str | None
    """Why the agent stopped its node on its own (the launcher frozen, its input closed), else None."""

    @classmethod
    def from_report(cls, data: dict[str, Any]) -> NodeEnd:
        record = data.get("summary")
        try:
            run = read_run_end(record) if isinstance(record, dict) else None
        except ValueError:
            run = None
        code = data.get("exit_code")
        reason = data.get("stopped_because")
        return cls(
            exit_code=code if isinstance(code, int) else LOST_EXIT_CODE,
            run=run,
            record=record if isinstance(record, dict) else None,
            stopped_because=reason if isinstance(reason, str) and reason else None,
        )

    @property
    def failure(self) -> FailureRecord | None:
        """The failed worker at the root of the job's end, as this node learnt it through the rendezvous."""
        return None if self.run is None else self.run.failure


class Host(Struct):
    """One host's transport and what it said so far."""

    plan: HostPlan
    argv: list[str]
    remote_python: str
    process: subprocess.Popen[bytes] | None = None
    outbox: bytearray = field(default_factory=bytearray)
    partial: dict[int, bytes] = field(default_factory=dict)
    open_streams: int = 2
    stderr_tail: list[str] = field(default_factory=list)
    ssh_log: str | None = None
    """Where ssh writes its own messages (:func:`~xlarun.remote.transport.with_own_log`); None for another transport."""
    ssh_log_read: int = 0
    """How much of it was read: its lines before ``ready`` say why a host could not be reached, and are not shown."""
    ready: dict[str, Any] | None = None
    refused: str | None = None
    end: NodeEnd | None = None
    exit_status: int | None = None
    stop_sent: bool = False
    started_at: float = 0.0
    heard_at: float = 0.0
    """When the agent last said anything on its stdout (every byte there comes through it)."""
    lost: str | None = None
    """Why the launcher gave the host up and killed its transport (no heartbeat, not ready in time)."""
    unstarted: bool = False
    """Its transport was killed before the host was ready, the launcher being stopped: not a lost host."""

    @property
    def holds_root_cause(self) -> bool:
        """Its node's summary says the root cause failed on this node."""
        failure = self.end.failure if self.end else None
        return failure is not None and failure.node_rank == self.plan.node_rank

    @property
    def gone(self) -> bool:
        """The transport exited and both its streams reached their end."""
        return self.exit_status is not None and self.open_streams == 0

    def kill(self) -> None:
        """SIGKILL to the transport's process group (it leads a session of its own): ssh and whatever it started
        here (a ``ProxyCommand``), or a local ``--rsh`` wrapper with everything under it."""
        if self.process is not None and self.exit_status is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass  # gone already: its exit is on its way

    def send(self, data: bytes) -> None:
        if self.process is not None and self.process.stdin is not None and not self.process.stdin.closed:
            self.outbox += data

    def ssh_said(self) -> list[str]:
        """ssh's own lines since the last call (all of them, the first time)."""
        if self.ssh_log is None:
            return []
        try:
            with open(self.ssh_log, "rb") as handle:
                handle.seek(self.ssh_log_read)
                data = handle.read()
        except OSError:
            return []
        self.ssh_log_read += len(data)
        return [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]

    def cause(self) -> str:
        """Why the host ended without its agent's end: the agent's refusal, else what its transport left
        on stderr before the agent was ready (ssh's ``Permission denied (publickey).``), else a lost connection."""
        if self.refused is not None:
            return self.refused
        if self.lost is not None:
            return self.lost
        said = self.stderr_tail[-1] if self.stderr_tail else (self.ssh_said() or [""])[-1]
        if self.ready is None and (
            self.exit_status == 127 or said.endswith(("not found", "No such file or directory"))
        ):
            return f"{self.remote_python} not found; pass {flag('remote_python')}"
        if self.ready is None and said:
            return said
        return f"connection lost ({os.path.basename(self.argv[0])} exit {self.exit_status})"


class FanOut:
    """The loop over every host's transport; :meth:`run` returns the job's exit code."""

    def __init__(
        self,
        plans: Sequence[HostPlan],
        argvs: Sequence[list[str]],
        remote_python: str,
        *,
        master_addr: str | None = None,
        reached_addresses: bool = True,
        summary_file: str | None = None,
        stop_signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT),
        on_started: Callable[[], None] | None = None,
    ):
        """``master_addr``: the user's ``--master-addr``; without it node 0 is found where ssh reached the
        first host (its ``ready``; ``reached_addresses`` False for another transport, whose agents may inherit
        an unrelated ``SSH_CONNECTION``), else by the first host's name. ``stop_signals``: ``--signals-to-handle``,
        which stop every host as they stop one host's workers; SIGUSR1 and SIGUSR2 go to every host's workers.
        ``on_started``: called once, when every host is ready and told to start (``--detach`` returns then)."""
        self.hosts = [Host(plan, argv, remote_python) for plan, argv in zip(plans, argvs, strict=True)]
        self.master_addr = master_addr
        self.reached_addresses = reached_addresses
        self.stop_signals = tuple(stop_signals)
        self.summary_file = summary_file
        self.on_started = on_started
        self.selector = selectors.DefaultSelector()
        self.signal_code: int | None = None
        self.failed: list[str] = []
        self.go_sent = False
        self.first_failure_at: float | None = None
        self.report_shown = False
        self.turned_at = time.monotonic()
        """When the loop last looked at the agents' deadlines (at least every heartbeat interval)."""

    def run(self) -> int:
        with tempfile.TemporaryDirectory(prefix="xlarun-hosts-") as ssh_logs, SignalInbox(self.stop_signals) as inbox:
            self.stop_signals = inbox.stop_signals
            self.selector.register(inbox.fd, selectors.EVENT_READ, ("signals", None))
            for host in self.hosts:
                self.start(host, ssh_logs)
            interval = min(host.plan.host_timeout for host in self.hosts) / HEARTBEATS_PER_TIMEOUT
            next_beat = time.monotonic() + interval
            while not all(host.gone for host in self.hosts):
                self.watch_outboxes()
                for key, _ in self.selector.select(max(0.0, min(next_beat - time.monotonic(), 0.5))):
                    if self.selector.get_map().get(key.fd) is not key:
                        continue  # closed by an earlier event of this batch: its transport's exit drained it
                    kind, host = key.data
                    if kind == "signals":
                        for number in inbox.drain():
                            self.on_signal(number)
                    elif kind == "stdin":
                        self.write_stdin(host)
                    elif kind == "exit":
                        self.on_exit(host)
                    else:
                        self.read_stream(host, key.fd)
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + interval
                    for host in self.hosts:
                        if not host.gone:
                            host.send(HEARTBEAT)
                self.advance()
            for host in self.hosts:
                self.close_stdin(host)
        return self.finish()

    # -- starting and feeding the transports

    def start(self, host: Host, ssh_logs: str) -> None:
        host.started_at = host.heard_at = time.monotonic()
        log = os.path.join(ssh_logs, f"{host.plan.index}.log")
        argv = with_own_log(host.argv, log)
        host.ssh_log = log if argv is not host.argv else None
        try:
            # A session of its own: a Ctrl-C on the launcher's terminal reaches the launcher only, which then
            # stops every host in order, rather than killing the ssh clients (every host lost at once).
            host.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
        except OSError as error:
            host.refused = f"cannot start {host.argv[0]}: {error.strerror}"
            host.exit_status, host.open_streams = 127, 0
            return
        assert host.process.stdin and host.process.stdout and host.process.stderr
        for stream in (host.process.stdin, host.process.stdout, host.process.stderr):
            os.set_blocking(stream.fileno(), False)
        self.selector.register(host.process.stdout, selectors.EVENT_READ, ("out", host))
        self.selector.register(host.process.stderr, selectors.EVENT_READ, ("err", host))
        pidfd = os.pidfd_open(host.process.pid)
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", host))
        host.send(host.plan.to_json().encode() + b"\n")

    def watch_outboxes(self) -> None:
        for host in self.hosts:
            stdin = host.process.stdin if host.process else None
            if stdin is None or stdin.closed:
                continue
            wanted = bool(host.outbox)
            registered = stdin.fileno() in self.selector.get_map()
            if wanted and not registered:
                self.selector.register(stdin, selectors.EVENT_WRITE, ("stdin", host))
            elif registered and not wanted:
                self.selector.unregister(stdin)

    def write_stdin(self, host: Host) -> None:
        assert host.process and host.process.stdin
        try:
            written = os.write(host.process.stdin.fileno(), host.outbox)
        except BlockingIOError:
            return
        except OSError:
            self.close_stdin(host)  # the transport is gone; its exit tells the rest
            return
        del host.outbox[:written]

    def close_stdin(self, host: Host) -> None:
        stdin = host.process.stdin if host.process else None
        if stdin is None or stdin.closed:
            return
        if stdin.fileno() in self.selector.get_map():
            self.selector.unregister(stdin)
        host.outbox.clear()
        try:
            stdin.close()
        except OSError:
            pass

    # -- what the hosts say

    def read_stream(self, host: Host, fd: int, draining: bool = False) -> None:
        """Relay what ``fd`` holds; at its end (or, ``draining``, once it holds nothing more) close it."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            if not draining:
                return
            data = b""
        except OSError:
            data = b""
        target = 1 if host.process and host.process.stdout and fd == host.process.stdout.fileno() else 2
        if target == 1:
            host.heard_at = time.monotonic()
        if not data:
            rest = host.partial.pop(fd, b"")
            if rest:
                self.line(host, target, rest + b"\n")
            self.selector.unregister(fd)
            host.open_streams -= 1
            return
        *lines, host.partial[fd] = (host.partial.get(fd, b"") + data).split(b"\n")
        for line in lines:
            self.line(host, target, line + b"\n")

    def line(self, host: Host, target: int, line: bytes) -> None:
        report = read_report(line) if target == 1 else None
        if report is None:
            if target == 2 and host.ready is None:
                # The transport's or the agent's own words before the node runs: kept for the host's one line.
                host.stderr_tail = [*host.stderr_tail, line.decode(errors="replace").strip()][-STDERR_LINES_KEPT:]
            else:
                console(target).write(host_line(host.plan.host, line))
        elif report.kind == READY:
            host.ready = report.data
            host.ssh_said()  # how it connected (a warning about a known host): not the job's business
        elif report.kind == REFUSED:
            host.refused = str(report.data.get("reason", "refused"))
        elif report.kind == END:
            host.end = NodeEnd.from_report(report.data)
            self.show_report(host)
            if host.end.stopped_because:
                # The agent stopped its node on its own: the launcher was frozen, or its input closed.
                say(f"host {host.plan.host}: {host.end.stopped_because}: its workers were stopped")

    def show_report(self, host: Host, fallback: bool = False) -> None:
        """Show the job's failure report, made from ``host``'s end, where none was shown yet and its node holds
        the root cause (or, ``fallback``, at the job's end: any node's)."""
        run = host.end.run if host.end else None
        if self.report_shown or run is None or not (host.holds_root_cause or fallback):
            return
        command = host_command(host.plan)
        self.report_shown = print_failure_report(run, command.script if command else "")

    def on_exit(self, host: Host) -> None:
        assert host.process
        for key in list(self.selector.get_map().values()):
            if key.data == ("exit", host):
                self.selector.unregister(key.fd)
                os.close(key.fd)
        host.exit_status = host.process.wait()
        if host.exit_status < 0:
            host.exit_status = 128 - host.exit_status
        # What the transport wrote is all in its pipes now; a process it left behind (a local wrapper's
        # child) may hold them open, and is no longer the host's voice.
        for stream in (host.process.stdout, host.process.stderr):
            assert stream is not None
            while not stream.closed and stream.fileno() in self.selector.get_map():
                self.read_stream(host, stream.fileno(), draining=True)
        if host.ready is not None:
            for line in host.ssh_said():  # ssh's words on the connection's end
                say(f"host {host.plan.host}: {line}")

    def on_signal(self, number: int) -> None:
        """A stop signal stops every host as it stops one host's workers (a second one: each agent kills its
        node); a host not ready yet has no node, and its transport goes at once. SIGUSR1 and SIGUSR2 go to every
        node's workers. Ctrl-Z suspends nothing: the agents would take the launcher's silence for its loss."""
        if number in RELAYED_SIGNALS:
            for host in self.hosts:
                if self.go_sent and not host.gone:
                    host.send(signal_line(number))
            return
        if number not in self.stop_signals:
            return
        for host in self.hosts:
            if host.ready is None and not host.gone:
                host.unstarted = True
                host.kill()
        if self.signal_code is None:
            self.signal_code = 128 + number
            self.stop_all()
        else:
            for host in self.hosts:
                self.close_stdin(host)  # each agent kills its node

    # -- the job's course

    def stop_all(self) -> None:
        for host in self.hosts:
            if not host.stop_sent and not host.gone:
                host.stop_sent = True
                host.send(stop_line())

    def watch_agents(self) -> None:
        """Give up a host whose agent is silent past its deadline: not ready within :data:`READY_TIMEOUTS`
        host timeouts, or no word (its node's output, its heartbeat) for a host timeout once ready."""
        now, stood_still = time.monotonic(), time.monotonic() - self.turned_at
        self.turned_at = now
        for host in self.hosts:
            if host.gone or host.end is not None or host.lost is not None or host.unstarted:
                continue
            timeout = host.plan.host_timeout
            if stood_still > timeout / 2:  # the launcher itself was stopped or starved: the silence was its own
                host.heard_at, host.started_at = now, host.started_at + stood_still
            if host.ready is None and host.refused is None and now - host.started_at > READY_TIMEOUTS * timeout:
                host.lost = (
                    f"not ready within {READY_TIMEOUTS * timeout:g} s (the connection, the remote interpreter's start "
                    f"or the host's checks hang); its transport was stopped"
                )
            elif host.ready is not None and now - host.heard_at > timeout:
                host.lost = (
                    f"no heartbeat from its agent for {timeout:g} s (the agent is frozen, killed or cut off); "
                    "its transport was stopped"
                )
            if host.lost is not None:
                host.kill()

    def advance(self) -> None:
        """Act on what the hosts said: refusals and lost hosts stop the job; all ready starts it."""
        self.watch_agents()
        for host in self.hosts:
            if host.gone and host.end is None and not host.unstarted and host.plan.host not in self.failed:
                self.failed.append(host.plan.host)
                say(f"host {host.plan.host}: {host.cause()}")
                self.close_stdin(host)  # an agent still there, behind a transport that died, stops its node
                self.stop_all()
        if self.failed or self.signal_code is not None:
            return
        if not self.go_sent and all(host.ready is not None for host in self.hosts):
            self.go_sent = True
            first = self.hosts[0]
            assert first.ready is not None
            # Empty where the hosts read node 0 themselves (--cluster tpu-vm).
            reached = first.ready.get("address") if self.reached_addresses else None
            address = first.plan.master_addr and (self.master_addr or reached or first.plan.host)
            port = first.plan.master_port or first.ready.get("port")
            for host in self.hosts:
                host.send(go_line(address, port))
            if self.on_started is not None:
                self.on_started()
        ended = [host for host in self.hosts if host.end is not None and host.end.exit_code]
        if ended and self.first_failure_at is None:
            self.first_failure_at = time.monotonic()
        if self.first_failure_at is not None and time.monotonic() - self.first_failure_at > STOPPED_AFTER_FAILURE_S:
            self.stop_all()

    def finish(self) -> int:
        if self.signal_code is not None:
            code = self.signal_code
        elif self.failed:
            code = LOST_EXIT_CODE
        else:
            code = next((host.end.exit_code for host in self.hosts if host.end and host.end.exit_code), 0)
        for host in self.hosts:  # no node said it holds the root cause: node 0's report, else the first
            self.show_report(host, fallback=True)
        root = self.root_cause() if code and self.signal_code is None and not self.failed else None
        if root is not None:
            say(f"root cause: host {root.host}, rank {root.rank} (exit status {root.exit_status})")
        self.write_summary(code, root)
        return code

    def root_cause(self) -> FailureRecord | None:
        """The failing worker as the first host's node that names one learnt it (every node learns the root
        cause through the rendezvous): its host is as the user named it, as each node's records say."""
        return next((host.end.failure for host in self.hosts if host.end and host.end.failure), None)

    def write_summary(self, code: int, root: FailureRecord | None) -> None:
        if not self.summary_file:
            return
        result = (
            "signaled"
            if self.signal_code is not None
            else "host_failed"
            if self.failed
            else "succeeded"
            if code == 0
            else "failed"
        )
        record = {
            "result": result,
            "exit_code": code,
            "root_cause": None if root is None else {"host": root.host, "node_rank": root.node_rank, "rank": root.rank},
            "hosts": [
                {
                    "host": host.plan.host,
                    "node_rank": host.plan.node_rank,
                    "transport_exit_status": host.exit_status,
                    "node_exit_code": None if host.end is None else host.end.exit_code,
                    "lost": host.end is None,
                    "summary": None if host.end is None else host.end.record,
                }
                for host in self.hosts
            ],
        }
        try:
            write_summary_file(self.summary_file, record)
        except OSError as error:
            say(f"cannot write the summary file {self.summary_file}: {error.strerror}")


LAUNCHER_LINE = b"xlarun: "
"""How a node's own launcher begins its lines (:func:`xlarun.console.say`)."""


def host_line(host: str, line: bytes) -> bytes:
    """A line of one host's output as the console shows it: the node's own launcher lines name the host
    as the fan-out's do (``xlarun: host h2: ...``), since every host says the same things; the workers'
    lines carry their host in their prefix already."""
    if line.startswith(LAUNCHER_LINE):
        return b"%shost %s: %s" % (LAUNCHER_LINE, host.encode(errors="replace"), line[len(LAUNCHER_LINE) :])
    return line
