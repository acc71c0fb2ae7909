"""A worker's process as the event loop drives it, and the factory that starts a real one.

Every worker starts in a session of its own, so it leads a process group that also holds
its children, and teardown signals the group; the orphan guard learns of the group before the
worker's program starts (:meth:`~xlarun.supervision.guard.OrphanGuard.enlist`). :class:`PosixProcess` is the real factory;
unit tests pass stand-ins that follow :class:`WorkerProcess`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

from xlarun.host.procfs import process_stats
from xlarun.structs import Struct
from xlarun.supervision.guard import OrphanGuard
from xlarun.supervision.relay import StreamPlan, StreamRelay, WorkerLogPlan

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import IO, Protocol
else:
    Protocol = object  # the protocols below only type; at run time they are plain classes


class WorkerSpec(Struct, frozen=True):
    local_rank: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    logs: WorkerLogPlan
    cwd: str | None = None


class Usage(Struct, frozen=True):
    """What the kernel counted for a reaped worker (``wait4``'s rusage, its reaped children included)."""

    peak_rss_mib: float
    """The largest resident set of the worker or of any child it reaped (``ru_maxrss``)."""
    cpu_s: float
    """User and system CPU time."""


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (found in /proc), zombies excluded."""
    return [pid for pid, fields in process_stats() if int(fields[5]) == pgid and fields[3] not in (b"Z", b"X")]


def signal_group(pgid: int, number: int) -> bool:
    """Send ``number`` to a process group; False when the group is empty."""
    try:
        os.killpg(pgid, number)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # members this launcher may not signal (they changed user): the group is not empty
    return True


StreamTarget = int | None
"""What a worker's stream is connected to, as :class:`subprocess.Popen` takes it: ``PIPE``,
``DEVNULL``, an open file descriptor, or None for the launcher's own."""


class WorkerProcess(Protocol):
    """A started worker as the event loop drives it. It leads a process group of its own, with
    the group id equal to its pid, so teardown reaches whatever it started."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    usage: Usage | None
    """Set by :meth:`reap` where the kernel says."""

    def open_pidfd(self) -> int:
        """A descriptor that becomes readable once the process has exited; the caller closes it."""

    def reap(self) -> int:
        """The exit, once :meth:`open_pidfd` said it happened: the code, or minus the signal."""

    def signal_group(self, number: int) -> bool:
        """Send ``number`` to the process group; False when nothing is left in it."""

    def open_straggler_pidfds(self) -> list[int]:
        """One :meth:`open_pidfd`-like descriptor per process still in the group after its leader ended."""


ProcessFactory = Callable[[WorkerSpec, StreamTarget, StreamTarget], WorkerProcess]
"""Starts one worker with its stdout and stderr connected as given; raises OSError when it cannot."""


def stream_target(plan: StreamPlan) -> tuple[StreamTarget, StreamRelay | None]:
    """What the process factory gets for one stream (a pipe, a file descriptor the caller closes once
    the worker started, /dev/null or the launcher's own), and the relay that reads the pipe."""
    if plan.relay:
        return subprocess.PIPE, StreamRelay(plan)
    if plan.file is not None:
        return os.open(plan.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644), None
    if plan.console_fd is None:
        return subprocess.DEVNULL, None
    return None, None


class PosixProcess:
    """A real worker: a new session (so a new process group) running the spec's argv, enlisted with
    ``guard`` before its exec."""

    def __init__(self, spec: WorkerSpec, stdout: StreamTarget, stderr: StreamTarget, guard: OrphanGuard | None = None):
        popen = subprocess.Popen(
            spec.argv,
            env=spec.env,
            cwd=spec.cwd,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            preexec_fn=None if guard is None else guard.enlist,
        )
        # Popen must not reap or warn about a child whose status the event loop collects.
        popen.returncode = 0
        self.pid: int = popen.pid
        self.stdout: IO[bytes] | None = popen.stdout
        self.stderr: IO[bytes] | None = popen.stderr
        self.usage: Usage | None = None
        self._reaped = False
        self._group_gone = False
        """Its group emptied after its leader was reaped: the number is free for any new process to take (the
        kernel hands pids out again once they wrap around, by default after 32768), so it is never signalled again."""

    def open_pidfd(self) -> int:
        return os.pidfd_open(self.pid)

    def reap(self) -> int:
        _, status, rusage = os.wait4(self.pid, 0)
        self._reaped = True
        self.signal_group(0)  # an empty group is known gone now, before its number can be taken
        # Linux counts ru_maxrss in KiB.
        self.usage = Usage(
            peak_rss_mib=round(rusage.ru_maxrss / 1024, 1), cpu_s=round(rusage.ru_utime + rusage.ru_stime, 3)
        )
        return os.waitstatus_to_exitcode(status)

    def signal_group(self, number: int) -> bool:
        if self._group_gone:
            return False
        # While the leader is not reaped, even as a zombie, it holds the group's number: nobody else can have it.
        delivered = signal_group(self.pid, number)
        self._group_gone = not delivered and self._reaped
        return delivered

    def open_straggler_pidfds(self) -> list[int]:
        if not self.signal_group(0):
            return []  # the group is empty: no need to look through /proc
        pidfds = []
        for pid in group_members(self.pid):
            try:
                pidfds.append(os.pidfd_open(pid))
            except OSError:
                continue  # it ended meanwhile
        return pidfds
