"""Process supervision: one event loop over worker exits, worker output, signals and stop requests.

Usage::

    with SignalInbox(config.signals_to_handle.signals) as inbox:
        group = WorkerGroup(specs, kill_timeout=30.0)
        outcome = group.run(inbox)
    if outcome.failures: ...

Every worker starts in its own session, so it leads a process group that also holds its
children. Exits are seen through pidfds the moment they happen (no polling). The first
failure, a stop signal or a stop request tears the whole group down: the signal to every
process group (including groups whose leader already exited but whose children live on),
``kill_timeout`` seconds of grace, then SIGKILL. SIGUSR1 and SIGUSR2 are passed to every
worker and the run goes on; Ctrl-Z (SIGTSTP) stops the workers with the launcher until it is
continued. An :class:`~xlarun.supervision.guard.OrphanGuard` kills the groups if the launcher
itself is killed before it could; an exception that breaks the loop tears the group down the
same way before it goes on (no worker outlives the loop).

With ``hang_timeout`` the loop also watches for a hang (:mod:`xlarun.supervision.hangs`): output
it relays counts as progress, and once the timeout passes in silence it reads the workers' CPU
time. A hung group is told of first (``on_hang``, so that the other nodes take their stacks
too), then every running worker's stacks are taken (:mod:`xlarun.supervision.stacks`) and handed
on (``on_stacks``), then the group is torn down as for a failure. Another node's hang reaches it
as ``request_stop(reason, hung=True)``. Each reaped worker's peak memory and CPU time come from
the kernel's rusage, and a SIGKILL while the kernel's OOM kills rose is named so
(:mod:`xlarun.host.oom`).

Worker output reaches the console through writers that never block the loop
(:mod:`xlarun.console`); while a console is too far behind, the pipes that feed it are left
unread, so the workers wait in their writes and exits, signals and stops are still seen at once.

The loop keeps one :class:`Worker` per worker: its spec, its process (and so its process
group), the pidfd it waits on, its pipes and relays, and its result. Processes come from a
factory (:class:`PosixProcess` unless told otherwise), so the loop runs against stand-ins in
unit tests.
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from xlarun.console import ConsoleWriter, say
from xlarun.host.oom import oom_kills
from xlarun.supervision.guard import OrphanGuard
from xlarun.supervision.process import PosixProcess, ProcessFactory, StreamTarget, WorkerProcess, WorkerSpec
from xlarun.supervision.relay import StreamPlan, StreamRelay, read_tail
from xlarun.supervision.signals import RELAYED_SIGNALS, SUSPEND_SIGNAL, SignalInbox, suspend_self

if TYPE_CHECKING:
    # Loaded when a run watches for hangs (hangs) or takes stacks (stacks), not by every launch.
    from xlarun.supervision.hangs import HangWatch

READ_CHUNK = 64 * 1024


@dataclass
class WorkerResult:
    local_rank: int
    rank: int
    pid: int
    started_at: float
    returncode: int | None = None
    ended_at: float | None = None
    error_file: str = ""
    stderr_tail: list[str] = field(default_factory=list)
    peak_rss_mib: float | None = None
    cpu_s: float | None = None
    steps: int | None = None
    """torch_xla's steps, counted in its step log (None: the step log was off)."""
    position: str | None = None
    """Where the worker stood when its node was found hung (:func:`~xlarun.supervision.stacks.where`)."""
    oom_killed: bool = False
    """It died of SIGKILL while the kernel's count of OOM kills rose (:mod:`xlarun.host.oom`)."""

    @property
    def signal_number(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


@dataclass(frozen=True)
class Hang:
    """A hung attempt as one node saw it: the stacks it took, and where each rank stood."""

    reason: str
    positions: dict[int, str]
    """Every rank of this node that was still running, by global rank."""
    stacks_files: dict[int, str]
    """The dump file of each rank whose stacks were taken."""
    found_here: bool
    """This node found the hang; otherwise another node said so."""


@dataclass
class GroupOutcome:
    results: list[WorkerResult]
    failures: list[WorkerResult]
    launcher_signal: int | None = None
    stop_reason: str | None = None
    start_failed: bool = False
    """The launcher could not start a worker (``stop_reason`` says why): its fault, not the workers'."""
    hang: Hang | None = None

    @property
    def succeeded(self) -> bool:
        return not self.failures and self.launcher_signal is None and self.stop_reason is None


Pipe = tuple[IO[bytes], Callable[[], bool]]
"""A worker's output pipe and the reader that copies what it holds to the stream's relay."""


@dataclass(eq=False)
class Worker:
    """One worker from start to end, as the event loop tracks it."""

    spec: WorkerSpec
    process: WorkerProcess
    result: WorkerResult
    pidfd: int | None
    """Open until the worker's exit is collected."""
    stdout_relay: StreamRelay | None = None
    stderr_relay: StreamRelay | None = None
    pipes: list[Pipe] = field(default_factory=list)
    stragglers: set[int] = field(default_factory=set)
    """Pidfds of processes left in the worker's group after it ended, waited for at teardown."""

    @property
    def pgid(self) -> int:
        return self.process.pid

    @property
    def still_waited_on(self) -> bool:
        return self.pidfd is not None or bool(self.stragglers)


class WorkerGroup:
    """Starts a list of workers and supervises them until all are gone. See the module docstring."""

    def __init__(self, specs: list[WorkerSpec], kill_timeout: float = 30.0,
                 guard: OrphanGuard | None = None,
                 on_failure: Callable[[WorkerResult], None] | None = None,
                 start_process: ProcessFactory = PosixProcess, hang_timeout: float | None = None,
                 on_hang: Callable[[str], None] | None = None,
                 on_stacks: Callable[[Hang], None] | None = None):
        self._specs = specs
        self._hang_timeout = hang_timeout
        self._hang_watch: HangWatch | None = None
        self._on_hang = on_hang
        self._on_stacks = on_stacks
        self._hang: Hang | None = None
        self._busy_said = False
        self._oom_kills = 0
        self._kill_timeout = kill_timeout
        self._guard = guard
        self._on_failure = on_failure
        self._start_process = start_process
        self._selector = selectors.DefaultSelector()
        self._workers: list[Worker] = []
        self._failures: list[WorkerResult] = []
        self._stop_signal: int | None = None
        self._deadline: float | None = None
        self._launcher_signal: int | None = None
        self._stop_reason: str | None = None
        self._start_failed = False
        self._paused: dict[IO[bytes], Callable[[], bool]] = {}
        """Pipes left unread while their console catches up, with their readers."""
        self._space_watched: set[int] = set()
        self._stop_read, self._stop_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # A watcher thread may ask for a stop after the group is gone: the pipe's descriptor
        # numbers may by then belong to another file, so closing and writing exclude each other.
        self._stop_lock = threading.Lock()

    def request_stop(self, reason: str, hung: bool = False) -> None:
        """Ask the loop to tear the group down (safe from any thread, e.g. a rendezvous watcher;
        a no-op once the group is gone); ``hung``: another node found the job hung, so the
        workers' stacks are taken first."""
        with self._stop_lock:
            if self._stop_write >= 0:
                os.write(self._stop_write, (b"H" if hung else b"S") + reason.encode()[:512] + b"\n")

    def run(self, inbox: SignalInbox) -> GroupOutcome:
        self._selector.register(inbox.fd, selectors.EVENT_READ, lambda: self._on_signals(inbox.drain()))
        self._selector.register(self._stop_read, selectors.EVENT_READ, self._on_stop_request)
        try:
            if self._guard is not None:
                self._guard.wait_ready()
            self._oom_kills = oom_kills()
            for spec in self._specs:
                self._start(spec)
                if self._stop_signal is not None:
                    break
            if self._hang_timeout is not None:
                from xlarun.supervision.hangs import HangWatch

                self._hang_watch = HangWatch(self._hang_timeout, self._cpu_by_rank)
            self._loop()
            self._release_from_guard()
        except BaseException:
            # Whatever broke the loop, no worker may outlive it.
            self._tear_down_after_fault()
            raise
        finally:
            self._close()
        for worker in self._workers:
            relay = worker.stderr_relay
            if relay is not None and relay.step_log is not None:
                worker.result.steps = relay.step_log.steps
            remove_if_empty(worker.spec.logs.stacks_file)
        ordered = sorted((worker.result for worker in self._workers), key=lambda result: result.local_rank)
        return GroupOutcome(results=ordered, failures=self._failures, launcher_signal=self._launcher_signal,
                            stop_reason=self._stop_reason, start_failed=self._start_failed, hang=self._hang)

    def _start(self, spec: WorkerSpec) -> None:
        try:
            self._start_worker(spec)
        except OSError as error:
            # The workers already started must not run on alone.
            self._stop_reason = f"cannot start local rank {spec.local_rank}: {start_failure(spec, error)}"
            self._start_failed = True
            self._begin_stop(signal.SIGTERM)

    def _start_worker(self, spec: WorkerSpec) -> None:
        stdout = stderr = None
        try:
            stdout, stdout_relay = self._stream_target(spec.logs.stdout)
            stderr, stderr_relay = self._stream_target(spec.logs.stderr)
            process = self._start_process(spec, stdout, stderr)
        finally:
            for handle in (stdout, stderr):
                if isinstance(handle, int) and handle > 2:
                    os.close(handle)
        if self._guard is not None:
            self._guard.watch(process.pid)
        try:
            pidfd = process.open_pidfd()
        except OSError:
            process.signal_group(signal.SIGKILL)  # started, but it could never be watched
            raise
        worker = Worker(spec=spec, process=process, pidfd=pidfd,
                        result=WorkerResult(local_rank=spec.local_rank, rank=spec.rank, pid=process.pid,
                                            started_at=time.time(), error_file=spec.logs.error_file),
                        stdout_relay=stdout_relay, stderr_relay=stderr_relay)
        self._workers.append(worker)
        for pipe, relay in ((process.stdout, stdout_relay), (process.stderr, stderr_relay)):
            if pipe is not None and relay is not None:
                os.set_blocking(pipe.fileno(), False)
                reader = self._reader(pipe, relay)
                worker.pipes.append((pipe, reader))
                self._selector.register(pipe, selectors.EVENT_READ, reader)
        self._selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_worker_exit(worker))

    def _stream_target(self, plan: StreamPlan) -> tuple[StreamTarget, StreamRelay | None]:
        """What the process factory gets for one stream (a pipe, a file descriptor, /dev/null or the console)."""
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
            """Copy what the pipe holds now; False once it is empty for the moment or closed.

            While the console is too far behind, the pipe leaves the selector: the worker then
            waits in its own write, and the loop goes on watching exits, signals and stops.
            """
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return False
            if data:
                if self._hang_watch is not None:
                    self._hang_watch.saw_progress()
                relay.feed(data)
                if relay.paused and pipe not in self._paused:
                    self._pause(pipe, read, relay)
                return True
            if pipe in self._paused:
                del self._paused[pipe]
            else:
                self._selector.unregister(pipe)
            pipe.close()
            relay.close()
            return False

        return read

    def _pause(self, pipe: IO[bytes], read: Callable[[], bool], relay: StreamRelay) -> None:
        self._selector.unregister(pipe)
        self._paused[pipe] = read
        writer = relay.console_writer
        assert writer is not None
        if writer.space_fd not in self._space_watched:
            self._space_watched.add(writer.space_fd)
            self._selector.register(writer.space_fd, selectors.EVENT_READ, lambda: self._resume(writer))

    def _resume(self, writer: ConsoleWriter) -> None:
        """The console caught up: its paused pipes are read again."""
        writer.take_space()
        if writer.full:
            return
        for pipe, read in list(self._paused.items()):
            del self._paused[pipe]
            self._selector.register(pipe, selectors.EVENT_READ, read)

    def _loop(self) -> None:
        while any(worker.still_waited_on for worker in self._workers):
            events = self._selector.select(self._wait_time())
            for key, _ in events:
                key.data()
            watch = self._hang_watch if self._stop_signal is None else None
            if watch is not None and watch.seconds_left() == 0:
                self._check_hang(watch)
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._deadline = None
                for worker in self._workers:
                    worker.process.signal_group(signal.SIGKILL)
        self._drain_output()

    def _wait_time(self) -> float | None:
        """How long the loop may wait for an event: until the kill deadline or the next hang check."""
        waits = [] if self._deadline is None else [max(0.0, self._deadline - time.monotonic())]
        if self._hang_watch is not None and self._stop_signal is None:
            waits.append(self._hang_watch.seconds_left())
        return min(waits) if waits else None

    def _cpu_by_rank(self) -> dict[int, float]:
        from xlarun.supervision.hangs import group_cpu_seconds

        live = [worker for worker in self._workers if worker.result.returncode is None]
        seconds = group_cpu_seconds(worker.pgid for worker in live)
        return {worker.spec.local_rank: seconds[worker.pgid] for worker in live}

    def _check_hang(self, watch: HangWatch) -> None:
        from xlarun.supervision.hangs import Verdict
        from xlarun.supervision.stacks import rank_ranges

        verdict = watch.check()
        if verdict is Verdict.BUSY and not self._busy_said:
            self._busy_said = True
            ranks = watch.busy_ranks
            say(f"local rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} made no progress for "
                f"{watch.timeout:g} s but {'use' if len(ranks) > 1 else 'uses'} the CPU (an XLA compile?): "
                "not hung; the run goes on")
        elif verdict is Verdict.HUNG:
            self._stacks_then_stop(f"no output for {watch.quiet_for:.0f} s and no CPU use", found_here=True)

    def _stacks_then_stop(self, reason: str, found_here: bool) -> None:
        """The attempt is hung: tell the other nodes (when found here), take every running worker's
        stacks, then tear the group down as for a failure."""
        from xlarun.supervision.stacks import UNKNOWN, StackTarget, append_native, dump_stacks, native_stacks, where

        if self._stop_signal is not None:
            return
        if found_here and self._on_hang is not None:
            self._on_hang(reason)  # first, so that the other nodes take their stacks while every rank still waits
        live = [worker for worker in self._workers if worker.result.returncode is None]
        dumps = dump_stacks(StackTarget(worker.result.rank, worker.pgid, worker.spec.logs.stacks_file)
                            for worker in live)
        for worker in live:
            dump = dumps.get(worker.result.rank)
            worker.result.position = where(dump) if dump is not None else UNKNOWN
        self._hang = Hang(reason, {worker.result.rank: worker.result.position for worker in live
                                   if worker.result.position is not None},
                          {rank: worker.spec.logs.stacks_file for worker in live
                           if (rank := worker.result.rank) in dumps}, found_here)
        self._stop_reason = reason
        if self._on_stacks is not None:
            self._on_stacks(self._hang)  # before the teardown, which can take the grace period
        # Native frames where py-spy is installed and may trace the workers, after the Python ones.
        natives = native_stacks(worker.pgid for worker in live)
        for worker in live:
            if worker.pgid in natives:
                append_native(worker.spec.logs.stacks_file, natives[worker.pgid])
        self._begin_stop(signal.SIGTERM)

    def _on_worker_exit(self, worker: Worker) -> None:
        assert worker.pidfd is not None
        self._unwatch(worker.pidfd)
        worker.pidfd = None
        result = worker.result
        result.returncode = worker.process.reap()
        result.ended_at = time.time()
        record_usage(worker)
        failed = result.returncode != 0 and self._stop_signal is None
        if failed:
            if result.returncode == -signal.SIGKILL and oom_kills() > self._oom_kills:
                self._oom_kills += 1  # one kill accounts for one worker
                result.oom_killed = True
            self._drain_pipes(worker.pipes)
            result.stderr_tail = self._stderr_tail(worker)
            self._failures.append(result)
        if self._stop_signal is None and (self._failures or not self._live_workers()):
            self._begin_stop(signal.SIGTERM)
        elif self._stop_signal is not None:
            self._wait_for_stragglers(worker)
        # The peers are told to stop first; reporting the failure (error file, host name) can wait.
        if failed and self._on_failure is not None:
            self._on_failure(result)

    def _tear_down_after_fault(self) -> None:
        """The loop failed: SIGTERM every group, wait out the grace for the exits, SIGKILL, reap.

        No output is relayed any more (the relay may be what failed); the pidfds alone are waited on.
        """
        for worker in self._workers:
            worker.process.signal_group(signal.SIGTERM)
        pending = [worker for worker in self._workers if worker.pidfd is not None]
        deadline = time.monotonic() + self._kill_timeout
        with selectors.DefaultSelector() as exits:
            for worker in pending:
                assert worker.pidfd is not None
                exits.register(worker.pidfd, selectors.EVENT_READ)
            while exits.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in exits.select(left):
                    exits.unregister(key.fileobj)
        for worker in self._workers:
            worker.process.signal_group(signal.SIGKILL)
        for worker in pending:
            assert worker.pidfd is not None
            self._unwatch(worker.pidfd)
            worker.pidfd = None
            worker.result.returncode = worker.process.reap()
            worker.result.ended_at = time.time()
            record_usage(worker)

    def _live_workers(self) -> bool:
        return any(worker.result.returncode is None for worker in self._workers)

    def _begin_stop(self, number: int) -> None:
        """Send ``number`` to every group, then wait for every member, SIGKILL at the deadline."""
        self._stop_signal = number
        self._deadline = time.monotonic() + self._kill_timeout
        for worker in self._workers:
            worker.process.signal_group(number)
        for worker in self._workers:
            if worker.result.returncode is not None:
                self._wait_for_stragglers(worker)

    def _wait_for_stragglers(self, worker: Worker) -> None:
        """Children a worker left behind in its group are waited for like workers."""
        for pidfd in worker.process.open_straggler_pidfds():
            worker.stragglers.add(pidfd)
            self._selector.register(pidfd, selectors.EVENT_READ,
                                    lambda fd=pidfd: self._straggler_ended(worker, fd))

    def _straggler_ended(self, worker: Worker, pidfd: int) -> None:
        self._unwatch(pidfd)
        worker.stragglers.discard(pidfd)

    def _unwatch(self, pidfd: int) -> None:
        self._selector.unregister(pidfd)
        os.close(pidfd)

    def _on_signals(self, numbers: list[int]) -> None:
        for number in numbers:
            if number in RELAYED_SIGNALS:
                for worker in self._workers:
                    worker.process.signal_group(number)
            elif number == SUSPEND_SIGNAL:
                self._suspend()
            elif self._launcher_signal is None:
                self._launcher_signal = number
                self._begin_stop(number)
            else:
                # A second stop signal means "now": skip the grace period.
                self._deadline = time.monotonic()

    def _suspend(self) -> None:
        """Ctrl-Z: the workers stop with the launcher and continue with it (see :data:`SUSPEND_SIGNAL`)."""
        for worker in self._workers:
            worker.process.signal_group(signal.SIGSTOP)
        suspend_self()
        for worker in self._workers:
            worker.process.signal_group(signal.SIGCONT)

    def _on_stop_request(self) -> None:
        try:
            data = os.read(self._stop_read, 4096)
        except BlockingIOError:
            return
        requests = data.decode(errors="replace").splitlines()
        hung = next((line[1:] for line in requests if line.startswith("H")), None)
        if hung is not None:
            self._stacks_then_stop(hung, found_here=False)
        if self._stop_reason is None:
            self._stop_reason = (requests[0][1:] if requests and requests[0][1:].strip() else "stop requested")
        if self._stop_signal is None:
            self._begin_stop(signal.SIGTERM)

    def _release_from_guard(self) -> None:
        """Groups that are gone leave the guard's list: their numbers may now be reused by
        unrelated processes, which a guard acting later on must not kill."""
        if self._guard is None:
            return
        for worker in self._workers:
            if not worker.process.signal_group(0):
                self._guard.forget(worker.pgid)

    def _drain_output(self) -> None:
        """Everything the workers wrote before they died reaches the logs and the console."""
        for worker in self._workers:
            self._drain_pipes(worker.pipes)

    def _drain_pipes(self, pipes: list[Pipe]) -> None:
        for pipe, read in pipes:
            while not pipe.closed and read():
                pass

    def _close(self) -> None:
        for key in list(self._selector.get_map().values()):
            if hasattr(key.fileobj, "close"):
                key.fileobj.close()
        for pipe in self._paused:
            pipe.close()
        for worker in self._workers:
            for relay in (worker.stdout_relay, worker.stderr_relay):
                if relay is not None:
                    relay.close()
        self._selector.close()
        for worker in self._workers:
            if worker.pidfd is not None:
                os.close(worker.pidfd)
            for pidfd in worker.stragglers:
                os.close(pidfd)
        with self._stop_lock:
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._stop_write = -1

    def _stderr_tail(self, worker: Worker) -> list[str]:
        if worker.stderr_relay is not None:
            return [line.decode(errors="replace") for line in worker.stderr_relay.tail]
        return read_tail(worker.spec.logs.stderr.file)


def record_usage(worker: Worker) -> None:
    usage = worker.process.usage
    if usage is not None:
        worker.result.peak_rss_mib, worker.result.cpu_s = usage.peak_rss_mib, usage.cpu_s


def remove_if_empty(path: str) -> None:
    """A worker's dump file that no dump went to: its Python opened it at start, in case."""
    try:
        if path and os.stat(path).st_size == 0:
            os.unlink(path)
    except OSError:
        pass


def start_failure(spec: WorkerSpec, error: OSError) -> str:
    """Why the launcher could not start a worker, naming the launcher's own limit where it was one."""
    if error.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        whose = "the launcher" if error.errno == errno.EMFILE else "the system"
        return f"{whose} ran out of file descriptors ({error.strerror}; the launcher's limit is {soft}: ulimit -n)"
    if error.errno == errno.EAGAIN:
        return f"the launcher cannot start more processes ({error.strerror}; ulimit -u, or the system's limit)"
    return f"{spec.argv[0]}: {error.strerror}"
