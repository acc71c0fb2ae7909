"""Worker logs: torchrun's directory layout, redirects, tee with line prefixes, and output tails.

Layout (as torchrun)::

    <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log, stderr.log, error.json}

A stream is *redirected* to its file, *tee'd* to the file and to the launcher's console
with a ``[{role}{local_rank}]:`` prefix, or left to the console. The launcher relays a
worker's stderr (unchanged) instead of handing it the terminal, so the failure report
can quote the last lines even when the worker never wrote an error file.
"""

from __future__ import annotations

import os
import select
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass
from string import Template
from typing import Optional

from xlarun.config import LaunchConfig
from xlarun.exceptions import UsageError
from xlarun.options import STDERR, STDOUT, flag

TAIL_LINES = 20
# A worker that never ends a line (progress bars) still gets its text out in bounded pieces.
MAX_PARTIAL_LINE = 64 * 1024


@dataclass(frozen=True)
class StreamPlan:
    """Where one worker stream goes. ``file`` and ``console_fd`` may both be set (tee)."""

    file: Optional[str] = None
    console_fd: Optional[int] = None
    prefix: bytes = b""
    relay: bool = False


@dataclass(frozen=True)
class WorkerLogPlan:
    directory: str
    error_file: str
    stdout: StreamPlan
    stderr: StreamPlan


def make_run_log_dir(base: Optional[str], run_id: str) -> str:
    """The run's directory: ``<base>/<run_id>_<random>``, ``base`` a fresh temp dir when not given."""
    try:
        if base is None:
            base = tempfile.mkdtemp(prefix="xlarun_")
        elif os.path.isfile(base):
            raise UsageError(f"{flag('log_dir')} {base} is a file: give a directory (it is created when missing)")
        os.makedirs(base, exist_ok=True)
        return tempfile.mkdtemp(prefix=f"{run_id}_", dir=base)
    except OSError as error:
        raise UsageError(f"{flag('log_dir')} {base} cannot hold the logs ({error.strerror}): "
                         "give a writable directory") from None


def line_prefix(config: LaunchConfig, rank: int, local_rank: int) -> bytes:
    if config.log_line_prefix_template:
        text = Template(config.log_line_prefix_template).safe_substitute(
            role_name=config.role, rank=rank, local_rank=local_rank)
    else:
        text = f"[{config.role}{local_rank}]:"
    return text.encode()


def plan_worker_logs(config: LaunchConfig, run_dir: str, attempt: int, local_rank: int, rank: int,
                     ) -> WorkerLogPlan:
    """torchrun's stream rules for one worker; creates its attempt directory."""
    directory = os.path.join(run_dir, f"attempt_{attempt}", str(local_rank))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    shown = config.local_ranks_filter is None or local_rank in config.local_ranks_filter
    redirects = config.redirects.for_rank(local_rank)
    tee = config.tee.for_rank(local_rank)
    prefix = line_prefix(config, rank, local_rank)

    def stream(bit: int, name: str, console_fd: int) -> StreamPlan:
        to_file = bool((redirects | tee) & bit)
        file = os.path.join(directory, f"{name}.log") if to_file else None
        if tee & bit:
            return StreamPlan(file=file, console_fd=console_fd if shown else None, prefix=prefix, relay=True)
        if file is not None:
            return StreamPlan(file=file)
        if bit == STDERR:
            return StreamPlan(console_fd=console_fd if shown else None, relay=True)
        return StreamPlan(console_fd=console_fd if shown else None)

    return WorkerLogPlan(
        directory=directory,
        error_file=os.path.join(directory, "error.json"),
        stdout=stream(STDOUT, "stdout", 1),
        stderr=stream(STDERR, "stderr", 2),
    )


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


def read_tail(path: Optional[str], limit: int = TAIL_LINES) -> list[str]:
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
