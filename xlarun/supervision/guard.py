"""The orphan guard: a process that kills the workers' process groups when the launcher dies first.

Usage::

    guard = OrphanGuard().start()     # before any worker exists
    guard.wait_ready()                # once, right before the first worker starts
    subprocess.Popen(argv, start_new_session=True, preexec_fn=guard.enlist)  # each worker
    guard.prune()                     # groups that are gone leave the list, so their numbers may be reused
    guard.release()                   # the launcher ends normally: the guard exits, killing nothing

torchrun's workers outlive a launcher killed with SIGKILL. Here a small forked process reads
a pipe whose other end only the launcher holds. The kernel closes that end whatever kills
the launcher, so end-of-file without ``done`` means the launcher is dead, and the guard sends
SIGKILL to every process group it watches: each worker and every descendant that stayed in
the worker's group.

A worker is bound to the guard before its program starts: :meth:`OrphanGuard.enlist` runs in the
new process between its fork and its exec, after it made its own session, and writes its process
group to the pipe itself. The new process holds the pipe's write end until its exec closes it
(``O_CLOEXEC``), so the guard cannot see end-of-file before the group's line: a launcher killed at
any moment of a start leaves no worker behind. Had the launcher told the guard once the start
returned, a launcher killed between the fork and that message left a worker running for good.
The price: with a ``preexec_fn`` Python forks instead of using ``vfork`` and runs its after-fork
hooks in the child, about a millisecond per worker on a quiet host and several on a loaded one,
against the tens of milliseconds a worker's Python takes to start. ``enlist`` is safe
in a launcher that runs threads (the console's, the heartbeat's): it calls only ``getpgrp``,
``signal`` and ``write`` and takes no lock that another thread could have held at the fork.
``PR_SET_PDEATHSIG`` instead would need ``ctypes`` in the child, and kills only the worker, not
children it may have started before the launcher learnt its group.

The guard has to survive what killed the launcher, so before the launcher starts a worker:

- it leaves the launcher's session and process group (``kill -9 -<pgid>``, a shell's job
  control and ``timeout`` all signal the launcher's whole group);
- it replaces its command line and its name with :data:`GUARD_TITLE`, so that neither
  ``pkill -f xlarun`` nor ``pkill xlarun`` nor a pattern from the training command matches it;
- it ignores every signal that can be ignored.
"""

from __future__ import annotations

import os
import signal

from xlarun.host.procfs import stat_fields

GUARD_TITLE = "orphan-guard"
"""The guard's command line is ``orphan-guard <launcher pid>`` and its name ``orphan-guard``."""

_DONE = b"done"
_PRUNE = b"prune"

# Signals the guard keeps as they are: faults it would raise on itself (ignoring them could only
# make it spin), the two that cannot be ignored, and SIGCHLD, which ends nothing.
_KEPT_SIGNALS = {
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGILL,
    signal.SIGFPE,
    signal.SIGTRAP,
    signal.SIGABRT,
    signal.SIGSYS,
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGCHLD,
}


class OrphanGuard:
    """The launcher's end of the guard. See the module docstring."""

    def __init__(self) -> None:
        self._write_fd = -1
        self._ready_fd = -1
        self.pid = 0

    def start(self) -> OrphanGuard:
        read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        self._ready_fd, ready_write = os.pipe2(os.O_CLOEXEC)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self._write_fd)
                os.close(self._ready_fd)
                _guard_main(read_fd, ready_write)
            finally:
                # Whatever happens, the fork never returns into the launcher's code.
                os._exit(0)
        os.close(read_fd)
        os.close(ready_write)
        return self

    def wait_ready(self) -> None:
        """Block until the guard stands outside the launcher's group and name (about a millisecond
        after the fork, usually over by the time the first worker starts)."""
        if self._ready_fd >= 0:
            try:
                os.read(self._ready_fd, 1)
            finally:
                self._close_ready()

    def enlist(self) -> None:
        """Tell the guard of the calling process's group. Runs in a new worker between its fork and
        its exec (``preexec_fn``), once it leads a group of its own; see the module docstring."""
        # A guard killed on its own must not take the worker with it: SIGPIPE (which the child's
        # signals were just reset to) is ignored for the write, then given its default back.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            os.write(self._write_fd, b"+%d\n" % os.getpgrp())
        except OSError:
            pass  # the guard is gone: the worker runs unguarded, as every other one then does
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def prune(self) -> None:
        """Groups without a live member leave the guard's list: their numbers may be reused by
        unrelated processes, which a guard acting later must not kill. This includes the group
        of a worker whose exec failed after it enlisted."""
        self._send(_PRUNE)

    def release(self) -> None:
        if self.pid:
            self._send(_DONE)
            os.close(self._write_fd)
            os.waitpid(self.pid, 0)
            self.pid = 0
        self._close_ready()

    def _close_ready(self) -> None:
        if self._ready_fd >= 0:
            os.close(self._ready_fd)
            self._ready_fd = -1

    def _send(self, line: bytes) -> None:
        try:
            os.write(self._write_fd, line + b"\n")
        except BrokenPipeError:
            pass  # the guard was killed on its own; the run goes on unguarded rather than fail


def _guard_main(read_fd: int, ready_fd: int) -> None:
    launcher = os.getppid()
    # First what the launcher waits for: out of its group and session, and renamed.
    os.setsid()
    try:
        retitle(f"{GUARD_TITLE} {launcher}")
    except OSError:
        pass  # a kernel that refuses: the guard still works, only a name-based kill can reach it
    try:
        os.write(ready_fd, b"x")
    except BrokenPipeError:
        pass  # the launcher is already gone, before any worker started; the pipe says so next
    os.close(ready_fd)
    for number in signal.valid_signals() - _KEPT_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.closerange(3, read_fd)
    os.closerange(read_fd + 1, 4096)
    _watch(read_fd)


def _watch(read_fd: int) -> None:
    """Follow the launcher's messages until ``done``, or until end-of-file: then kill the groups."""
    groups: set[int] = set()
    buffered = b""
    while True:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line == _DONE:
                return
            if line == _PRUNE:
                groups = {pgid for pgid in groups if _has_members(pgid)}
            else:
                groups.add(int(line))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass  # the group ended on its own


def _has_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # members the guard may not signal (they changed user): the group is not empty
    return True


def retitle(title: str) -> None:
    """Replace this process's command line (``/proc/<pid>/cmdline``, what ``pkill -f`` and ``ps``
    read) with ``title``, and its name (``comm``, what ``pkill`` reads) with the title's first word.

    The command line lives in the process's own memory, between the addresses that
    ``/proc/self/stat`` gives as ``arg_start`` and ``arg_end``; it is overwritten in place
    and padded with NUL bytes, so the kernel shows the new text and nothing of the old.
    """
    _, fields = stat_fields("/proc/self/stat")
    start, end = int(fields[48]), int(fields[49])
    text = title.encode()[: end - start - 1]
    with open("/proc/self/mem", "r+b", buffering=0) as memory:
        memory.seek(start)
        memory.write(text.ljust(end - start, b"\0"))
    with open("/proc/self/comm", "wb", buffering=0) as name:
        name.write(title.split()[0].encode()[:15])
