"""The stream relay: a worker's pipe copied to its log file and the console, whole lines at a time.

The launcher relays a worker's stderr (unchanged) instead of handing it the terminal, so the
failure report can quote the last lines even when the worker never wrote an error file. The
console side goes through the launcher's own writers (:mod:`xlarun.console`), which never block.
:class:`StreamPlan` says where one stream goes (the log plan, :mod:`xlarun.supervision.logs`,
decides it).
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass

from xlarun.console import ConsoleWriter, console, say

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


LINE_END = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")
"""One piece of a prefixed stream as the console shows it: up to a newline, or up to a carriage
return, with which a progress bar redraws its line."""


class StreamRelay:
    """Copies a worker's pipe to its log file and the console.

    The file gets the bytes unchanged. Prefixed console text goes out in whole pieces, each
    ended by a newline or a carriage return and each behind the prefix, so two workers' text
    never shares a line and a progress bar redraws with its prefix at the start of the line;
    unprefixed text passes through at once. The console is a :class:`~xlarun.console.ConsoleWriter`,
    which never blocks: while it is :attr:`paused` the caller stops reading the pipe.
    """

    def __init__(self, plan: StreamPlan, writer: ConsoleWriter | None = None):
        self._path = plan.file
        self._file = open(plan.file, "ab", buffering=0) if plan.file else None
        self._console = writer or (console(plan.console_fd) if plan.console_fd is not None else None)
        self._prefix = plan.prefix
        self._partial = b""
        self._unshown = b""
        self.tail: deque[bytes] = deque(maxlen=TAIL_LINES)

    @property
    def paused(self) -> bool:
        """The console is too far behind: stop reading the pipe until it catches up."""
        return self._console is not None and self._console.full

    @property
    def console_writer(self) -> ConsoleWriter | None:
        return self._console

    def feed(self, data: bytes) -> None:
        self._to_file(data)
        if self._console is not None:
            if self._prefix:
                self._to_console_prefixed(data)
            else:
                self._console.write(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_PARTIAL_LINE:
            lines.append(self._partial)
            self._partial = b""
        self.tail.extend(lines[-TAIL_LINES:])

    def close(self) -> None:
        if self._partial:
            self.tail.append(self._partial)
            self._partial = b""
        if self._unshown and self._console is not None:
            self._console.write(self._prefix + self._unshown + b"\n")
        self._unshown = b""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _to_file(self, data: bytes) -> None:
        """A log file that refuses bytes (a full disk, a quota) costs that file, not the run: one line."""
        if self._file is None:
            return
        try:
            self._file.write(data)
        except OSError as error:
            say(f"cannot write {self._path}: {error.strerror or error}; it stops here, the console and the "
                "run go on")
            try:
                self._file.close()
            except OSError:
                pass  # the same fault; the file is given up either way
            self._file = None

    def _to_console_prefixed(self, data: bytes) -> None:
        assert self._console is not None
        text = self._unshown + data
        # Only up to the last line end: a search from every offset of an unended tail costs its square.
        shown = max(text.rfind(b"\n"), text.rfind(b"\r")) + 1
        pieces = LINE_END.findall(text, 0, shown)
        self._unshown = text[shown:]
        if len(self._unshown) > MAX_PARTIAL_LINE:
            # A worker that never ends a line still gets its text out, in bounded pieces.
            pieces.append(self._unshown + b"\n")
            self._unshown = b""
        # A lone carriage return at the start of a line (where each piece leaves the cursor) moves nothing.
        shown_pieces = [piece for piece in pieces if piece != b"\r"]
        if shown_pieces:
            self._console.write(b"".join(self._prefix + piece for piece in shown_pieces))


def read_tail(path: str | None, limit: int = TAIL_LINES) -> list[str]:
    """The last lines of a log file (for a redirected stream), or nothing."""
    if not path:
        return []
    try:
        # The worker owns the directory: a link it planted there is not followed.
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16 * 1024))
            data = handle.read()
    except OSError:
        return []
    return [line.decode(errors="replace") for line in data.splitlines()[-limit:]]
