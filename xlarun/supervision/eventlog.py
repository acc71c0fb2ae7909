"""``--event-log PATH``: the launch's events as JSON lines, one object a line, written as they happen.

Usage::

    sink = JsonLinesSink.open(path)      # "-": the launcher's stderr; raises OSError for a path it can never take
    EventBus([sink], ...)                # the bus calls sink.handle(event) on the sink's own thread

Each line is one :func:`record` (schema :data:`~xlarun.supervision.events.SCHEMA_VERSION`),
written with one ``os.write`` to a file opened ``O_APPEND``: lines from one launcher never
interleave, and a line is either all there or, where the disk filled up part-way, taken back
(the file is cut to where it was), so no torn line stands before a good one. The file is opened
``O_NONBLOCK``: a FIFO nobody reads (opening it fails with ``ENXIO``: tried again at each event)
or that stopped reading (``EAGAIN``) costs that event, never a wait. ``-`` queues the lines on the
launcher's stderr writer (:mod:`xlarun.console`), between its own lines.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from datetime import datetime, timezone

from xlarun.console import console
from xlarun.supervision.events import SCHEMA_VERSION, Event

STDERR = "-"


def record(event: Event) -> dict[str, object]:
    """One event as its line's object; the keys are the manual's schema (docs/events.md)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "seq": event.seq,
        "time": datetime.fromtimestamp(event.time, timezone.utc)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z"),
        "run_id": event.run_id,
        "node_rank": event.node_rank,
        "host": event.host,
        "attempt": event.attempt,
        "name": event.name,
        "trace_id": event.trace_id,
        "attributes": dict(event.attributes),
    }


def line_of(event: Event) -> bytes:
    # ensure_ascii: a line is plain ASCII whatever a host or path holds; default=str for a stray value.
    return (json.dumps(record(event), separators=(",", ":"), default=str) + "\n").encode()


class JsonLinesSink:
    """The ``--event-log`` sink; see the module docstring."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._regular = False

    def __str__(self) -> str:
        return "the event log on stderr" if self.path == STDERR else f"the event log {self.path}"

    @classmethod
    def open(cls, path: str) -> JsonLinesSink:
        """The sink, its file opened (created) now; a FIFO without a reader yet is opened at a later event.

        Raises :class:`OSError` where the path can never take the log (no such directory, no permission).
        """
        sink = cls(path)
        if path != STDERR:
            try:
                sink._try_open()
            except OSError as error:
                if error.errno != errno.ENXIO:
                    raise
        return sink

    def _try_open(self) -> int:
        if self._fd is None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            except OSError as error:
                if error.errno == errno.ENXIO:  # a FIFO nobody reads: not yet
                    raise OSError(errno.ENXIO, "a FIFO with no reader") from None
                raise
            self._fd, self._regular = fd, stat.S_ISREG(os.fstat(fd).st_mode)
        return self._fd

    def handle(self, event: Event) -> None:
        line = line_of(event)
        if self.path == STDERR:
            console(2).write(line)
            return
        fd = self._try_open()
        before = os.fstat(fd).st_size if self._regular else 0
        written = os.write(fd, line)
        if written < len(line):
            if self._regular:  # a full disk took part of it: take it back, so the next line starts a line
                os.ftruncate(fd, before)
            else:  # a pipe takes at most PIPE_BUF bytes all or nothing; a longer line is finished here
                self._write_rest(fd, line[written:])
                return
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @staticmethod
    def _write_rest(fd: int, rest: bytes) -> None:
        import select

        while rest:
            select.select([], [fd], [], 1.0)
            rest = rest[os.write(fd, rest) :]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
