"""The stream relay: a worker's pipe copied to its log file and the console, whole lines at a time.

The launcher relays a worker's stderr (unchanged) instead of handing it the terminal, so the
failure report can quote the last lines even when the worker never wrote an error file.
:class:`StreamPlan` says where one stream goes (the log plan, :mod:`xlarun.supervision.logs`,
decides it).
"""

from __future__ import annotations

import os
import select
from collections import deque
from dataclasses import dataclass

TAIL_LINES = 20
# A worker that never ends a line (progress bars) still gets its text out in bounded pieces.
MAX_PARTIAL_LINE = 64 * 1024


@dataclass(frozen=True)
class StreamPlan:
    """Where one worker stream goes. ``file`` and ``console_fd`` may both be set (tee)."""

    file: str | None = None
    console_fd: int | None = None
    prefix: bytes = b""
    relay: bool = False


@dataclass(frozen=True)
class WorkerLogPlan:
    directory: str
    error_file: str
    stdout: StreamPlan
    stderr: StreamPlan


# Consoles that already refused worker output, so each failing console costs one notice.
_failed_consoles: set[int] = set()


def write_all(fd: int, data: bytes) -> bool:
    """Write all of ``data``; False when the reader has closed, so nothing more can reach it.

    The console's file description is shared with whatever started the launcher and may be
    non-blocking: a full pipe or terminal is waited for, never spun on and never skipped.
    Any other error is raised.
    """
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll()
        except BrokenPipeError:
            return False
    return True


def _report_console_failure(fd: int, error: OSError) -> None:
    """Say once, on the launcher's stderr, that a console refuses worker output.

    The workers go on: a console that cannot take their text (a full disk, a terminal gone)
    is no reason to end a run, and the error may pass. What it refused is lost there, hence
    the notice; when the failing console is stderr itself, the notice is lost with it.
    """
    if fd in _failed_consoles:
        return
    _failed_consoles.add(fd)
    name = {1: "stdout", 2: "stderr"}.get(fd, f"fd {fd}")
    notice = f"xlarun: cannot write worker output to {name}: {error.strerror or error}; output it refuses is lost\n"
    try:
        os.write(2, notice.encode())
    except OSError:
        pass  # stderr is the only place to say it


class StreamRelay:
    """Copies a worker's pipe to its log file and the console, whole lines at a time.

    Console lines carry the prefix when one is set, and each console write holds only
    complete lines of one worker, so two workers' text never shares a line.
    """

    def __init__(self, plan: StreamPlan):
        self._file = open(plan.file, "ab", buffering=0) if plan.file else None
        self._console_fd = plan.console_fd
        self._prefix = plan.prefix
        self._partial = b""
        self.tail: deque[bytes] = deque(maxlen=TAIL_LINES)

    def feed(self, data: bytes) -> None:
        if self._file is not None:
            self._file.write(data)
        if not self._prefix and self._console_fd is not None:
            # Unprefixed text passes through at once, so progress bars that never end a line stay live.
            self._to_console(self._console_fd, data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_PARTIAL_LINE:
            lines.append(self._partial)
            self._partial = b""
        self._emit(lines)

    def close(self) -> None:
        if self._partial:
            self._emit([self._partial])
            self._partial = b""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _emit(self, lines: list[bytes]) -> None:
        if not lines:
            return
        self.tail.extend(lines[-TAIL_LINES:])
        if self._prefix and self._console_fd is not None:
            prefix = self._prefix
            self._to_console(self._console_fd, b"".join(prefix + line + b"\n" for line in lines))

    def _to_console(self, fd: int, data: bytes) -> None:
        """Only a closed reader ends the copy to the console; other failures are reported and it goes on."""
        try:
            if not write_all(fd, data):
                # The reader is gone (``xlarun ... | head``): nothing this worker writes later could reach it.
                self._console_fd = None
        except OSError as error:
            _report_console_failure(fd, error)


def read_tail(path: str | None, limit: int = TAIL_LINES) -> list[str]:
    """The last lines of a log file (for a redirected stream), or nothing."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16 * 1024))
            data = handle.read()
    except OSError:
        return []
    return [line.decode(errors="replace") for line in data.splitlines()[-limit:]]
