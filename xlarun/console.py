"""The launcher's own stdout and stderr: writers that never make the launcher wait for a reader.

Usage::

    say("restarting the worker group")          # one "xlarun: ..." line on stderr
    console(1).write(b"[default0]:hello\\n")     # worker output relayed to the launcher's stdout
    flush_consoles()                             # at exit: what is queued, while the reader takes it

A reader that stops (a paused terminal, ``| less``, a stalled log shipper or ssh channel) must
not stop the launcher: it watches the workers, the signals and the other nodes in one loop.
So each stream has a :class:`ConsoleWriter` whose thread does the blocking writes; the launcher
only queues. While more than :data:`PAUSE_BYTES` wait, :attr:`ConsoleWriter.full` asks the
relays to stop reading the workers' pipes (a worker then waits in its own write, as under a
slow terminal) and :attr:`ConsoleWriter.space_fd` turns readable once half has been taken.
What is offered past :data:`DROP_BYTES` is dropped and counted in one line.

The launcher's lines are best-effort: a closed, broken or hung-up stream loses them, and
never changes the exit code or the summary file.
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections import deque

PAUSE_BYTES = 1 << 20
"""Queued bytes at which the relays stop reading the workers' pipes until half is written."""
DROP_BYTES = 8 << 20
"""Queued bytes past which more output is dropped (and counted) rather than queued."""
FLUSH_PATIENCE_S = 5.0
"""How long :func:`flush_consoles` waits for a reader that takes nothing before it gives up."""


class ConsoleWriter:
    """Writes one of the launcher's streams from a thread of its own; see the module docstring."""

    def __init__(self, fd: int):
        self.fd = fd
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._dropped = 0
        self._gone = False
        self._failed: OSError | None = None
        self._progress = time.monotonic()
        self._paused = False
        self._ready = threading.Condition()
        self._space_read, self._space_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None

    @property
    def space_fd(self) -> int:
        """Readable once a full queue has been half written; read it empty with :meth:`take_space`."""
        return self._space_read

    @property
    def full(self) -> bool:
        with self._ready:
            if self._queued >= PAUSE_BYTES and not self._gone:
                self._paused = True
                return True
            return False

    def take_space(self) -> None:
        try:
            os.read(self._space_read, 512)
        except BlockingIOError:
            pass

    def write(self, data: bytes) -> None:
        """Queue ``data``; never blocks. Dropped once the reader is gone or too far behind."""
        if not data:
            return
        with self._ready:
            if self._gone:
                return
            if self._queued + len(data) > DROP_BYTES:
                self._dropped += len(data)
                return
            self._chunks.append(data)
            self._queued += len(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"xlarun-console-{self.fd}", daemon=True)
                self._thread.start()
            self._ready.notify()

    def flush(self, patience: float = FLUSH_PATIENCE_S) -> bool:
        """Wait until everything queued is written, or the reader took nothing for ``patience`` seconds."""
        waiting_since = time.monotonic()
        with self._ready:
            while self._queued and not self._gone:
                # Patience counts from the last write or the start of this wait, whichever is later.
                if time.monotonic() - max(self._progress, waiting_since) > patience:
                    return False
                self._ready.wait(min(patience, 0.5))
            return not self._queued

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._chunks:
                    self._ready.wait()
                chunk = self._chunks[0]
            written = self._write_all(chunk)
            with self._ready:
                self._chunks.popleft()
                self._queued -= len(chunk)
                self._progress = time.monotonic()
                if not written:
                    self._gone = True
                    self._chunks.clear()
                    self._queued = 0
                if self._dropped and not self._chunks and not self._gone:
                    self._chunks.append(
                        f"xlarun: {self._dropped} bytes of output were dropped while this stream "
                        "was not read\n".encode()
                    )
                    self._queued += len(self._chunks[0])
                    self._dropped = 0
                if self._paused and self._queued <= PAUSE_BYTES // 2:
                    self._paused = False
                    try:
                        os.write(self._space_write, b"x")
                    except BlockingIOError:
                        pass  # a byte already waits there
                self._ready.notify_all()

    def _write_all(self, data: bytes) -> bool:
        """Write ``data`` whole; False once nothing can reach the reader any more.

        The stream's file description is shared with whatever started the launcher and may be
        non-blocking: a full pipe or terminal is waited for, never spun on. A closed reader, a
        hang-up or a descriptor that is not open ends the stream; another error (a full disk
        under a redirected stream) costs this chunk and one notice on stderr.
        """
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                poller = select.poll()
                poller.register(self.fd, select.POLLOUT)
                poller.poll()
            except (BrokenPipeError, ConnectionResetError):
                return False
            except OSError as error:
                if error.errno in (errno.EIO, errno.EBADF):
                    return False
                self._report(error)
                return True
        return True

    def _report(self, error: OSError) -> None:
        if self._failed is not None:
            return
        self._failed = error
        if self.fd != 2:
            name = {1: "stdout"}.get(self.fd, f"fd {self.fd}")
            say(f"cannot write worker output to {name}: {error.strerror or error}; output it refuses is lost")


_writers: dict[int, ConsoleWriter] = {}
_writers_lock = threading.Lock()


def console(fd: int) -> ConsoleWriter:
    """The one writer of the launcher's stream ``fd`` (1 or 2)."""
    with _writers_lock:
        if fd not in _writers:
            _writers[fd] = ConsoleWriter(fd)
        return _writers[fd]


def flush_consoles(patience: float = FLUSH_PATIENCE_S) -> None:
    """Write out what the launcher queued, as long as each reader keeps taking it."""
    for writer in list(_writers.values()):
        writer.flush(patience)


def say(message: str) -> None:
    """One line from the launcher on stderr."""
    console(2).write(f"xlarun: {message}\n".encode(errors="replace"))


def is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class StatusLine:
    """One line on a terminal that rewrites itself while the agent waits; silent otherwise."""

    def __init__(self) -> None:
        self._shown = False
        self.tty = is_terminal(2)

    def update(self, text: str) -> None:
        if self.tty:
            console(2).write(f"\rxlarun: {text}\033[K".encode(errors="replace"))
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            console(2).write(b"\r\033[K")
            self._shown = False

    def say(self, message: str) -> None:
        """One line that stays, in place of the status line."""
        self.clear()
        say(message)
