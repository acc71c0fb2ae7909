"""``--event-log PATH``: the launch's events as JSON lines, one object a line, written as they happen.

Usage::

    sink = JsonLinesSink.open(path)      # "-": the launcher's stderr; raises OSError for a path it can never take
    EventBus([sink], ...)                # the bus calls sink.handle(event) on the sink's own thread

Each line is one :func:`record` (schema :data:`~xlarun.supervision.events.SCHEMA_VERSION`),
written whole or not at all (:func:`~xlarun.supervision.sinkfiles.write_whole`) to a file opened
``O_APPEND``: lines from one launcher never interleave, and a line is either all there or, where
the disk filled up part-way, taken back (the file is cut to where it was), so no torn line stands
before a good one. The file is opened ``O_NONBLOCK``: a FIFO nobody reads (opening it fails with
``ENXIO``: tried again at each event) or whose reader stopped with no room for a line of up to
``PIPE_BUF`` bytes (``EAGAIN``) costs that event; a longer line waits for the reader to empty the pipe.
``-`` queues the lines on the launcher's stderr writer (:mod:`xlarun.console`), between its own lines.
"""

from __future__ import annotations

import errno
import json
import os
from datetime import datetime, timezone

from xlarun.console import console
from xlarun.supervision.events import SCHEMA_VERSION, Event
from xlarun.supervision.sinkfiles import open_without_waiting, write_whole

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
            self._fd = open_without_waiting(self.path, os.O_APPEND | os.O_CREAT)
        return self._fd

    def handle(self, event: Event) -> None:
        line = line_of(event)
        if self.path == STDERR:
            console(2).write(line)
            return
        write_whole(self._try_open(), line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
