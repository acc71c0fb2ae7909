"""Process supervision: one event loop over worker exits, worker output, signals and stop requests.

Usage::

    with SignalInbox(config.signals_to_handle.signals) as inbox:
        group = WorkerGroup(specs, kill_timeout=30.0)
        outcome = group.run(inbox)
    if outcome.failures: ...

Every worker starts in its own session, so it leads a process group that also holds its
children. Exits are seen through pidfds the moment they happen (no polling). The first
failure, a stop signal or a stop request tears the whole group down: the signal to every
process group (including groups whose leader already exited but whose children live on; never one
that emptied, whose number another process may have taken since), ``kill_timeout`` seconds of
grace, then SIGKILL. How far a teardown has gone is one value,
:class:`Stopping`, which the loop replaces whole at each step. SIGUSR1 and SIGUSR2 are passed to every
worker and the run goes on; Ctrl-Z (SIGTSTP) stops the workers with the launcher until it is
continued. An :class:`~xlarun.supervision.guard.OrphanGuard` kills the groups if the launcher
itself is killed before it could; an exception that breaks the loop tears the group down the
same way before it goes on (no worker outlives the loop). Stop requests come from other threads
through a pipe of their own (:class:`~xlarun.supervision.signals.StopRequests`).

What watches the workers around the loop is a set of objects of their own (:mod:`xlarun.supervision.watches`),
each asked the same things: with ``hang_timeout``, :class:`~xlarun.supervision.watches.Hangs` (output
the loop relays counts as progress; a hung group's stacks are taken, handed on through ``on_hang`` and
``on_stacks``, then it is torn down as for a failure; another node's hang reaches it as
``request_stop(reason, hung=True)``); the OOM killer's witness, which names a SIGKILL the kernel's
evidence lays at its door; and whatever the run adds (``watches``). Each reaped worker's peak memory
and CPU time come from the kernel's rusage.

Worker output reaches the console through writers that never block the loop
(:mod:`xlarun.console`); while a console is too far behind, the pipes that feed it are left
unread (:class:`~xlarun.supervision.relay.PipeReaders`), so the workers wait in their writes and
exits, signals and stops are still seen at once. That wait is not silence to the hang watch.

The loop keeps one :class:`Worker` per worker: its spec, its process (and so its process
group), the pidfd it waits on, its pipes and relays, and its result. Processes come from a
factory (:class:`PosixProcess`, enlisted with the guard, unless told otherwise), so the loop runs
against stand-ins in unit tests.
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import resource
import select
import selectors
import signal
import time
from collections.abc import Callable, Sequence

from xlarun.structs import Struct, field, replace
from xlarun.supervision.guard import OrphanGuard
from xlarun.supervision.process import PosixProcess, ProcessFactory, WorkerProcess, WorkerSpec, stream_target
from xlarun.supervision.relay import Pipe, PipeReaders, StreamRelay, drain, read_tail
from xlarun.supervision.signals import RELAYED_SIGNALS, SUSPEND_SIGNAL, SignalInbox, StopRequests, suspend_self
from xlarun.supervision.watches import Hang, Hangs, OomWatch, Watch


class WorkerResult(Struct):
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
    """It died of SIGKILL and the kernel's evidence points at the OOM killer (:mod:`xlarun.host.oom`)."""

    @property
    def signal_number(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


class GroupOutcome(Struct):
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


class Cause(enum.Enum):
    """What began a group's teardown (a hang is told by its :class:`Hang`)."""

    ENDED = "ended"
    """A worker failed, or every worker ended."""
    START_FAILED = "start failed"
    """The launcher could not start a worker."""
    REQUESTED = "requested"
    """:meth:`WorkerGroup.request_stop` (a rendezvous watcher: another node failed or left)."""
    SIGNALLED = "signalled"
    """The launcher was sent a stop signal."""


class Stopping(Struct, frozen=True):
    """How a worker group is being torn down: one value, which the group replaces whole.

    Every process group got :attr:`signal`; SIGKILL follows at :attr:`deadline`. A stop signal sent
    to the launcher during a teardown that began otherwise is passed on and starts the grace anew;
    a second one ends the grace at once. A reason given later does not replace the first.
    """

    cause: Cause | Hang
    """What began it: a hung attempt's teardown holds its :class:`Hang`."""
    deadline: float | None
    """When the groups get SIGKILL (``time.monotonic()``); None once they have."""
    reason: str | None = None
    """Why, in words, where the workers did not end it themselves: a failed start, a hang, a request."""
    launcher_signal: int | None = None
    """The first stop signal the launcher was sent, whenever it came."""

    @property
    def signal(self) -> int:
        """What every process group was sent: the launcher's stop signal, or else SIGTERM."""
        return signal.SIGTERM if self.launcher_signal is None else self.launcher_signal

    @property
    def hang(self) -> Hang | None:
        return self.cause if isinstance(self.cause, Hang) else None

    def seconds_left(self, now: float) -> float | None:
        """Until SIGKILL is due (0 once it is); None once it went out."""
        return None if self.deadline is None else max(0.0, self.deadline - now)

    def due(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def killed(self) -> Stopping:
        return replace(self, deadline=None)

    def hurried(self, now: float) -> Stopping:
        """A second stop signal: SIGKILL now."""
        return replace(self, deadline=now)

    def signalled(self, number: int, deadline: float) -> Stopping:
        """The launcher's first stop signal, during a teardown that began otherwise."""
        return replace(self, launcher_signal=number, deadline=deadline)

    def asked(self, reason: str) -> Stopping:
        """A stop requested during the teardown: its reason, unless one is known already."""
        return self if self.reason is not None else replace(self, reason=reason)


class Worker(Struct, eq=False):
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

    @classmethod
    def started(
        cls,
        spec: WorkerSpec,
        process: WorkerProcess,
        pidfd: int,
        stdout_relay: StreamRelay | None,
        stderr_relay: StreamRelay | None,
    ) -> Worker:
        """A worker whose process just started, with the relays of its pipes."""
        result = WorkerResult(spec.local_rank, spec.rank, process.pid, time.time(), error_file=spec.logs.error_file)
        return cls(spec, process, result, pidfd, stdout_relay, stderr_relay)

    @property
    def pgid(self) -> int:
        return self.process.pid

    @property
    def still_waited_on(self) -> bool:
        return self.pidfd is not None or bool(self.stragglers)

    def ended(self, returncode: int) -> None:
        """Record the reaped worker's end: its exit, when, and what the kernel counted."""
        self.result.returncode = returncode
        self.result.ended_at = time.time()
        usage = self.process.usage
        if usage is not None:
            self.result.peak_rss_mib, self.result.cpu_s = usage.peak_rss_mib, usage.cpu_s

    def finish(self) -> None:
        """After the loop: the steps its step log counted; its dump file gone where no dump went to it."""
        relay = self.stderr_relay
        if relay is not None and relay.step_log is not None:
            self.result.steps = relay.step_log.steps
        remove_if_empty(self.spec.logs.stacks_file)

    def stderr_tail(self) -> list[str]:
        if self.stderr_relay is not None:
            return [line.decode(errors="replace") for line in self.stderr_relay.tail]
        return read_tail(self.spec.logs.stderr.file)

    def close(self) -> None:
        """Close its relays and the descriptors still open on its processes."""
        for relay in (self.stdout_relay, self.stderr_relay):
            if relay is not None:
                relay.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        for pidfd in self.stragglers:
            os.close(pidfd)


class WorkerGroup:
    """Starts a list of workers and supervises them until all are gone. See the module docstring."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        kill_timeout: float = 30.0,
        guard: OrphanGuard | None = None,
        on_failure: Callable[[WorkerResult], None] | None = None,
        start_process: ProcessFactory | None = None,
        hang_timeout: float | None = None,
        on_hang: Callable[[str], None] | None = None,
        on_stacks: Callable[[Hang], None] | None = None,
        on_start: Callable[[WorkerResult], None] | None = None,
        on_exit: Callable[[WorkerResult, bool], None] | None = None,
        watches: Sequence[Watch] = (),
    ):
        self._specs = specs
        self._kill_timeout = kill_timeout
        self._guard = guard
        self._on_failure = on_failure
        self._start_process = start_process or functools.partial(PosixProcess, guard=guard)
        self._on_start = on_start
        self._on_exit = on_exit
        """Told of each worker started, and of each exit with whether it failed (a teardown's are not failures)."""
        self._hangs = Hangs(hang_timeout, on_hang, on_stacks)
        self._watches: tuple[Watch, ...] = (self._hangs, OomWatch(), *watches)
        self._selector = selectors.DefaultSelector()
        self._readers = PipeReaders(self._selector, self._hangs.progress)
        self._stop_requests = StopRequests()
        self._workers: list[Worker] = []
        self._failures: list[WorkerResult] = []
        self._stopping: Stopping | None = None
        """None until the teardown begins."""

    def request_stop(self, reason: str, hung: bool = False) -> None:
        """Ask the loop to tear the group down (safe from any thread, e.g. a rendezvous watcher;
        a no-op once the group is gone); ``hung``: another node found the job hung, so the
        workers' stacks are taken first."""
        self._stop_requests.send(reason, hung)

    def run(self, inbox: SignalInbox) -> GroupOutcome:
        self._selector.register(inbox.fd, selectors.EVENT_READ, lambda: self._on_signals(inbox.drain()))
        self._selector.register(self._stop_requests.fd, selectors.EVENT_READ, self._on_stop_request)
        try:
            for watch in self._watches:
                watch.start(self)
            # Only now, once the watches are set, does the first worker need the guard: it got ready meanwhile.
            if self._guard is not None:
                self._guard.wait_ready()
            for spec in self._specs:
                self._start(spec)
                if self._stopping is not None:
                    break
            for watch in self._watches:
                watch.started()
            self._loop()
            self._release_from_guard()
        except BaseException:
            # Whatever broke the loop, no worker may outlive it.
            self._tear_down_after_fault()
            raise
        finally:
            self._close()
        for worker in self._workers:
            worker.finish()
        ordered = sorted((worker.result for worker in self._workers), key=lambda result: result.local_rank)
        end = self._stopping or Stopping(Cause.ENDED, deadline=None)
        return GroupOutcome(
            results=ordered,
            failures=self._failures,
            launcher_signal=end.launcher_signal,
            stop_reason=end.reason,
            start_failed=end.cause is Cause.START_FAILED,
            hang=end.hang,
        )

    # What a watch sees of the group and may do to it (xlarun.supervision.watches.WatchedGroup).

    @property
    def size(self) -> int:
        return len(self._specs)

    @property
    def stopping(self) -> bool:
        return self._stopping is not None

    def live(self) -> list[Worker]:
        return [worker for worker in self._workers if worker.result.returncode is None]

    def held_back(self) -> list[int]:
        return self._readers.held_back()

    def listen(self, fd: int, callback: Callable[[], None]) -> None:
        self._selector.register(fd, selectors.EVENT_READ, callback)

    def unlisten(self, fd: int) -> None:
        self._selector.unregister(fd)

    def signal_workers(self, number: int) -> None:
        for worker in self._workers:
            worker.process.signal_group(number)

    def stop_hung(self, hang: Hang) -> None:
        if self._stopping is None:
            self._begin_stop(Stopping(hang, self._grace_end(), hang.reason))

    def _start(self, spec: WorkerSpec) -> None:
        try:
            self._start_worker(spec)
        except OSError as error:
            if self._guard is not None:
                self._guard.prune()  # a worker whose exec failed had enlisted
            # The workers already started must not run on alone.
            reason = f"cannot start local rank {spec.local_rank}: {start_failure(spec, error)}"
            self._begin_stop(Stopping(Cause.START_FAILED, self._grace_end(), reason))

    def _start_worker(self, spec: WorkerSpec) -> None:
        stdout = stderr = None
        try:
            stdout, stdout_relay = stream_target(spec.logs.stdout)
            stderr, stderr_relay = stream_target(spec.logs.stderr)
            process = self._start_process(spec, stdout, stderr)
        finally:
            for handle in (stdout, stderr):
                if isinstance(handle, int) and handle > 2:
                    os.close(handle)
        try:
            pidfd = process.open_pidfd()
        except OSError:
            process.signal_group(signal.SIGKILL)  # started, but it could never be watched
            raise
        worker = Worker.started(spec, process, pidfd, stdout_relay, stderr_relay)
        self._workers.append(worker)
        for pipe, relay in ((process.stdout, stdout_relay), (process.stderr, stderr_relay)):
            if pipe is not None and relay is not None:
                worker.pipes.append((pipe, self._readers.add(pipe, relay)))
        self._selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_worker_exit(worker))
        if self._on_start is not None:
            self._on_start(worker.result)

    def _loop(self) -> None:
        while any(worker.still_waited_on for worker in self._workers):
            for key, _ in self._selector.select(bounded_wait(self._wait_time())):
                # An earlier callback of the same batch may have closed it (a worker's exit drains its pipes).
                if self._selector.get_map().get(key.fd) is key:
                    key.data()
            for watch in self._watches:
                if self._stopping is None and watch.seconds_left() == 0:
                    watch.look()
            if self._stopping is not None and self._stopping.due(time.monotonic()):
                self._stopping = self._stopping.killed()
                self.signal_workers(signal.SIGKILL)
        for worker in self._workers:
            drain(worker.pipes)  # everything the workers wrote before they died reaches the logs and the console

    def _wait_time(self) -> float | None:
        """How long the loop may wait for an event: until the kill deadline or the first watch's look."""
        if self._stopping is not None:
            return self._stopping.seconds_left(time.monotonic())
        return min((left for watch in self._watches if (left := watch.seconds_left()) is not None), default=None)

    def _on_worker_exit(self, worker: Worker) -> None:
        assert worker.pidfd is not None
        self._unwatch(worker.pidfd)
        worker.pidfd = None
        worker.ended(worker.process.reap())
        self._release_from_guard()
        result = worker.result
        failed = result.returncode != 0 and self._stopping is None
        if result.returncode != 0:
            # Kept of a worker that failed while the group was stopping too: not a failure of the report,
            # but what it wrote can say why the attempt failed (the split CPU world, xlarun.launching.node).
            drain(worker.pipes)
            result.stderr_tail = worker.stderr_tail()
        if failed:
            for watch in self._watches:
                watch.failed(result)
            self._failures.append(result)
        if self._stopping is None and (self._failures or not self.live()):
            self._begin_stop(Stopping(Cause.ENDED, self._grace_end()))
        elif self._stopping is not None:
            self._wait_for_stragglers(worker)
        # The peers are told to stop first; reporting the failure (error file, host name) can wait.
        if failed and self._on_failure is not None:
            self._on_failure(result)
        if self._on_exit is not None:
            self._on_exit(result, failed)

    def _tear_down_after_fault(self) -> None:
        """The loop failed: SIGTERM every group, wait out the grace for the exits, SIGKILL, reap.

        No output is relayed any more (the relay may be what failed); the pidfds alone are waited on.
        Whatever fails in the wait, SIGKILL still goes out: the caller releases the guard next.
        """
        pending = [worker for worker in self._workers if worker.pidfd is not None]
        try:
            self.signal_workers(signal.SIGTERM)
            deadline = self._grace_end()
            with selectors.DefaultSelector() as exits:
                for worker in pending:
                    assert worker.pidfd is not None
                    exits.register(worker.pidfd, selectors.EVENT_READ)
                while exits.get_map() and (left := deadline - time.monotonic()) > 0:
                    for key, _ in exits.select(bounded_wait(left)):
                        exits.unregister(key.fileobj)
        finally:
            self.signal_workers(signal.SIGKILL)
        for worker in pending:
            assert worker.pidfd is not None
            self._unwatch(worker.pidfd)
            worker.pidfd = None
            worker.ended(worker.process.reap())

    def _grace_end(self) -> float:
        """When a teardown that begins now sends SIGKILL."""
        return time.monotonic() + self._kill_timeout

    def _begin_stop(self, stopping: Stopping) -> None:
        """Send the stop's signal to every group, then wait for every member, SIGKILL at its deadline."""
        self._stopping = stopping
        self.signal_workers(stopping.signal)
        for worker in self._workers:
            if worker.result.returncode is not None:
                self._wait_for_stragglers(worker)

    def _wait_for_stragglers(self, worker: Worker) -> None:
        """Children a worker left behind in its group are waited for like workers."""
        for pidfd in worker.process.open_straggler_pidfds():
            worker.stragglers.add(pidfd)
            self._selector.register(pidfd, selectors.EVENT_READ, lambda fd=pidfd: self._straggler_ended(worker, fd))

    def _straggler_ended(self, worker: Worker, pidfd: int) -> None:
        self._unwatch(pidfd)
        worker.stragglers.discard(pidfd)
        if not worker.stragglers and not worker.process.signal_group(0):
            self._release_from_guard()

    def _unwatch(self, pidfd: int) -> None:
        self._selector.unregister(pidfd)
        os.close(pidfd)

    def _on_signals(self, numbers: list[int]) -> None:
        for number in numbers:
            if number in RELAYED_SIGNALS:
                self.signal_workers(number)
            elif number == SUSPEND_SIGNAL:
                # Ctrl-Z: the workers stop with the launcher and continue with it (see SUSPEND_SIGNAL).
                self.signal_workers(signal.SIGSTOP)
                suspend_self()
                self.signal_workers(signal.SIGCONT)
            elif self._stopping is None:
                self._begin_stop(Stopping(Cause.SIGNALLED, self._grace_end(), launcher_signal=number))
            elif self._stopping.launcher_signal is None:
                self._begin_stop(self._stopping.signalled(number, self._grace_end()))
            else:
                # A second stop signal means "now": skip the grace period.
                self._stopping = self._stopping.hurried(time.monotonic())

    def _on_stop_request(self) -> None:
        requests = self._stop_requests.receive()
        if not requests:
            return
        # A worker that ended before the stop was asked failed on its own, whichever event the batch holds first.
        waiting = {worker.pidfd: worker for worker in self._workers if worker.pidfd is not None}
        for pidfd in readable_now(list(waiting)):
            self._on_worker_exit(waiting[pidfd])
        hung = next((request.reason for request in requests if request.hung), None)
        if hung is not None and self._stopping is None:
            self._hangs.found_elsewhere(hung)
            return  # the teardown follows the stacks
        reason = requests[0].reason if requests[0].reason.strip() else "stop requested"
        if self._stopping is None:
            self._begin_stop(Stopping(Cause.REQUESTED, self._grace_end(), reason))
        else:
            self._stopping = self._stopping.asked(reason)

    def _release_from_guard(self) -> None:
        """Groups that are gone leave the guard's list, as each worker's does and again at the end: their numbers may
        now be reused by unrelated processes, which a guard acting later on must not kill."""
        if self._guard is not None:
            self._guard.prune()

    def _close(self) -> None:
        for watch in self._watches:
            watch.close()
        for key in list(self._selector.get_map().values()):
            if hasattr(key.fileobj, "close"):
                key.fileobj.close()
        self._readers.close()
        for worker in self._workers:
            worker.close()
        self._selector.close()
        self._stop_requests.close()


MAX_WAIT_S = 3600.0
"""The longest one wait of the loop lasts: a longer one (a grace or a hang timeout of years, or
infinite) ends in as many waits as it takes, as ``select`` takes no more than about 24 days."""


def readable_now(fds: Sequence[int]) -> list[int]:
    """Those of ``fds`` readable at this instant (a pidfd is once its process has ended)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(0)]


def bounded_wait(seconds: float | None) -> float | None:
    """A wait for ``select``: at most :data:`MAX_WAIT_S` (None, for ever, stays so)."""
    return None if seconds is None else min(seconds, MAX_WAIT_S)


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
