"""Process supervision: one event loop over worker exits, worker output, signals and stop requests.

Usage::

    with SignalInbox() as inbox:
        group = WorkerGroup(specs, kill_timeout=30.0)
        outcome = group.run(inbox)
    if outcome.failures: ...

Every worker starts in its own session, so it leads a process group that also holds its
children. Exits are seen through pidfds the moment they happen (no polling). The first
failure, a stop signal or a stop request tears the whole group down: the signal to every
process group (including groups whose leader already exited but whose children live on),
``kill_timeout`` seconds of grace, then SIGKILL. SIGUSR1 and SIGUSR2 are passed to every
worker and the run goes on. An :class:`OrphanGuard` kills the groups if the launcher itself
is killed before it could.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, Callable, Iterable, Optional

from xlarun.logs import StreamPlan, StreamRelay, WorkerLogPlan, read_tail

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
RELAYED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class WorkerSpec:
    local_rank: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    logs: WorkerLogPlan
    cwd: Optional[str] = None


@dataclass
class WorkerResult:
    local_rank: int
    rank: int
    pid: int
    started_at: float
    returncode: Optional[int] = None
    ended_at: Optional[float] = None
    error_file: str = ""
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def signal_number(self) -> Optional[int]:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


@dataclass
class GroupOutcome:
    results: list[WorkerResult]
    failures: list[WorkerResult]
    launcher_signal: Optional[int] = None
    stop_reason: Optional[str] = None

    @property
    def succeeded(self) -> bool:
        return not self.failures and self.launcher_signal is None and self.stop_reason is None


class SignalInbox:
    """Turns the launcher's signals into bytes on a pipe that the event loop reads.

    The handlers do nothing themselves (no exceptions raised inside a handler): the
    interpreter's wakeup fd carries each signal number to the loop.
    """

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS + RELAYED_SIGNALS):
        self._signals = tuple(signals)
        self._previous: dict[int, object] = {}
        self.fd = -1
        self._write_fd = -1
        self._previous_wakeup = -1

    def __enter__(self) -> "SignalInbox":
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for number in self._signals:
            self._previous[number] = signal.signal(number, _ignore_in_handler)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self.fd)
        os.close(self._write_fd)

    def drain(self) -> list[int]:
        received: list[int] = []
        while True:
            try:
                data = os.read(self.fd, 512)
            except BlockingIOError:
                return received
            if not data:
                return received
            received.extend(number for number in data if number in self._signals)


def _ignore_in_handler(signum: int, frame: object) -> None:
    """The wakeup fd already told the loop; nothing else happens inside the handler."""


class OrphanGuard:
    """A forked watchdog that kills the workers' process groups if the launcher dies first.

    torchrun's workers outlive a launcher killed with SIGKILL. Here a small child process
    holds one end of a pipe: the launcher writes each new process group id to it, and a
    clean exit writes ``done``. End-of-file without ``done`` means the launcher died, and
    the guard sends SIGKILL to every group it was told about.
    """

    def __init__(self) -> None:
        self._write_fd = -1
        self._pid = 0

    def start(self) -> "OrphanGuard":
        read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        self._pid = os.fork()
        if self._pid == 0:
            os.close(self._write_fd)
            _guard_main(read_fd)
        os.close(read_fd)
        return self

    def watch(self, pgid: int) -> None:
        os.write(self._write_fd, f"{pgid}\n".encode())

    def release(self) -> None:
        if self._pid:
            os.write(self._write_fd, b"done\n")
            os.close(self._write_fd)
            os.waitpid(self._pid, 0)
            self._pid = 0


def _guard_main(read_fd: int) -> None:
    for number in STOP_SIGNALS + RELAYED_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.closerange(3, read_fd)
    os.closerange(read_fd + 1, 4096)
    groups: list[int] = []
    buffered = b""
    while True:
        try:
            chunk = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line == b"done":
                os._exit(0)
            groups.append(int(line))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (found in /proc), zombies excluded."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.getpgid(pid) != pgid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            members.append(pid)
    return members


def signal_group(pgid: int, number: int) -> None:
    try:
        os.killpg(pgid, number)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group that this launcher may signal


class WorkerGroup:
    """Starts a list of workers and supervises them until all are gone. See the module docstring."""

    def __init__(self, specs: list[WorkerSpec], kill_timeout: float = 30.0,
                 guard: Optional[OrphanGuard] = None,
                 on_failure: Optional[Callable[[WorkerResult], None]] = None):
        self._specs = specs
        self._kill_timeout = kill_timeout
        self._guard = guard
        self._on_failure = on_failure
        self._selector = selectors.DefaultSelector()
        self._results: dict[int, WorkerResult] = {}
        self._relays: list[StreamRelay] = []
        self._stderr_relays: dict[int, StreamRelay] = {}
        self._pipes: dict[int, list[tuple[IO[bytes], Callable[[], bool]]]] = {}
        self._pgids: list[int] = []
        self._waiting: set[int] = set()
        self._failures: list[WorkerResult] = []
        self._stop_signal: Optional[int] = None
        self._deadline: Optional[float] = None
        self._launcher_signal: Optional[int] = None
        self._stop_reason: Optional[str] = None
        self._stop_read, self._stop_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def request_stop(self, reason: str) -> None:
        """Ask the loop to tear the group down (safe from any thread, e.g. a rendezvous watcher)."""
        os.write(self._stop_write, reason.encode()[:512] + b"\n")

    def run(self, inbox: SignalInbox) -> GroupOutcome:
        self._selector.register(inbox.fd, selectors.EVENT_READ, lambda: self._on_signals(inbox.drain()))
        self._selector.register(self._stop_read, selectors.EVENT_READ, self._on_stop_request)
        try:
            for spec in self._specs:
                self._start(spec)
                if self._stop_signal is not None:
                    break
            self._loop()
        finally:
            self._close()
        ordered = sorted(self._results.values(), key=lambda result: result.local_rank)
        return GroupOutcome(results=ordered, failures=self._failures,
                            launcher_signal=self._launcher_signal, stop_reason=self._stop_reason)

    def _start(self, spec: WorkerSpec) -> None:
        stdout, stdout_relay = self._stream_target(spec.logs.stdout)
        stderr, stderr_relay = self._stream_target(spec.logs.stderr)
        try:
            process = subprocess.Popen(spec.argv, env=spec.env, cwd=spec.cwd, stdout=stdout, stderr=stderr,
                                       start_new_session=True, close_fds=True)
        except OSError as error:
            # The workers already started must not run on alone.
            self._stop_reason = (f"cannot start local rank {spec.local_rank}: "
                                 f"{spec.argv[0]}: {error.strerror}")
            self._begin_stop(signal.SIGTERM)
            return
        finally:
            for handle in (stdout, stderr):
                if isinstance(handle, int) and handle > 2:
                    os.close(handle)
        pid = process.pid
        # Popen must not reap or warn about a child whose status this loop collects.
        process.returncode = 0
        self._pgids.append(pid)
        if self._guard is not None:
            self._guard.watch(pid)
        self._results[pid] = WorkerResult(local_rank=spec.local_rank, rank=spec.rank, pid=pid,
                                          started_at=time.time(), error_file=spec.logs.error_file)
        if stderr_relay is not None:
            self._stderr_relays[pid] = stderr_relay
        for pipe, relay in ((process.stdout, stdout_relay), (process.stderr, stderr_relay)):
            if pipe is not None and relay is not None:
                os.set_blocking(pipe.fileno(), False)
                self._relays.append(relay)
                reader = self._reader(pipe, relay)
                self._pipes.setdefault(pid, []).append((pipe, reader))
                self._selector.register(pipe, selectors.EVENT_READ, reader)
        pidfd = os.pidfd_open(pid)
        self._waiting.add(pidfd)
        self._selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_worker_exit(pidfd, pid))

    def _stream_target(self, plan: StreamPlan) -> tuple[Optional[int], Optional[StreamRelay]]:
        """What Popen gets for one stream (a pipe, a file descriptor, /dev/null or the console)."""
        if plan.relay:
            return subprocess.PIPE, StreamRelay(plan)
        if plan.file is not None:
            return os.open(plan.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644), None
        if plan.console_fd is None:
            return subprocess.DEVNULL, None
        return None, None

    def _reader(self, pipe: IO[bytes], relay: StreamRelay) -> Callable[[], bool]:
        fd = pipe.fileno()

        def read() -> bool:
            """Copy what the pipe holds now; False once it is empty for the moment or closed."""
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return False
            if data:
                relay.feed(data)
                return True
            self._selector.unregister(pipe)
            pipe.close()
            relay.close()
            return False

        return read

    def _loop(self) -> None:
        while self._waiting:
            timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            events = self._selector.select(timeout)
            for key, _ in events:
                key.data()
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._deadline = None
                for pgid in self._pgids:
                    signal_group(pgid, signal.SIGKILL)
        self._drain_output()

    def _on_worker_exit(self, pidfd: int, pid: int) -> None:
        self._forget(pidfd)
        _, status = os.waitpid(pid, 0)
        result = self._results[pid]
        result.returncode = os.waitstatus_to_exitcode(status)
        result.ended_at = time.time()
        failed = result.returncode != 0 and self._stop_signal is None
        if failed:
            self._drain_pipes(self._pipes.get(pid, []))
            result.stderr_tail = self._stderr_tail(result)
            self._failures.append(result)
        if self._stop_signal is None and (self._failures or not self._live_workers()):
            self._begin_stop(signal.SIGTERM)
        elif self._stop_signal is not None:
            self._wait_for_stragglers(pid)
        # The peers are told to stop first; reporting the failure (error file, host name) can wait.
        if failed and self._on_failure is not None:
            self._on_failure(result)

    def _live_workers(self) -> bool:
        return any(result.returncode is None for result in self._results.values())

    def _begin_stop(self, number: int) -> None:
        """Send ``number`` to every group, then wait for every member, SIGKILL at the deadline."""
        self._stop_signal = number
        self._deadline = time.monotonic() + self._kill_timeout
        for pgid in self._pgids:
            signal_group(pgid, number)
        for pid, result in self._results.items():
            if result.returncode is not None:
                self._wait_for_stragglers(pid)

    def _wait_for_stragglers(self, pgid: int) -> None:
        """Children a worker left behind in its group are waited for like workers."""
        try:
            os.killpg(pgid, 0)
        except OSError:
            return  # the group is empty: no need to look through /proc
        for pid in group_members(pgid):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            self._waiting.add(pidfd)
            self._selector.register(pidfd, selectors.EVENT_READ, lambda fd=pidfd: self._forget(fd))

    def _forget(self, pidfd: int) -> None:
        self._selector.unregister(pidfd)
        os.close(pidfd)
        self._waiting.discard(pidfd)

    def _on_signals(self, numbers: list[int]) -> None:
        for number in numbers:
            if number in RELAYED_SIGNALS:
                for pgid in self._pgids:
                    signal_group(pgid, number)
            elif self._launcher_signal is None:
                self._launcher_signal = number
                self._begin_stop(number)
            else:
                # A second stop signal means "now": skip the grace period.
                self._deadline = time.monotonic()

    def _on_stop_request(self) -> None:
        try:
            data = os.read(self._stop_read, 4096)
        except BlockingIOError:
            return
        if self._stop_reason is None:
            self._stop_reason = data.decode(errors="replace").splitlines()[0] if data.strip() else "stop requested"
        if self._stop_signal is None:
            self._begin_stop(signal.SIGTERM)

    def _drain_output(self) -> None:
        """Everything the workers wrote before they died reaches the logs and the console."""
        for pipes in self._pipes.values():
            self._drain_pipes(pipes)

    def _drain_pipes(self, pipes: list[tuple[IO[bytes], Callable[[], bool]]]) -> None:
        for pipe, read in pipes:
            while not pipe.closed and read():
                pass

    def _close(self) -> None:
        for key in list(self._selector.get_map().values()):
            if hasattr(key.fileobj, "close"):
                key.fileobj.close()
        for relay in self._relays:
            relay.close()
        self._selector.close()
        for fd in self._waiting:
            os.close(fd)
        os.close(self._stop_read)
        os.close(self._stop_write)

    def _stderr_tail(self, result: WorkerResult) -> list[str]:
        relay = self._stderr_relays.get(result.pid)
        if relay is not None:
            return [line.decode(errors="replace") for line in relay.tail]
        spec = next(s for s in self._specs if s.local_rank == result.local_rank)
        return read_tail(spec.logs.stderr.file)
