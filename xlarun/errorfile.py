"""torchrun's error file: written by a worker's ``@record`` main, read by the failure report.

Usage in a training script::

    import xlarun

    @xlarun.record
    def main():
        ...

    if __name__ == "__main__":
        main()

On an uncaught exception the decorator writes ``TORCHELASTIC_ERROR_FILE`` in torchrun's
JSON format (so torchrun reads it too) and re-raises. torch's own
``torch.distributed.elastic.multiprocessing.errors.record`` writes the same file and
xlarun reads either.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"


def record(fn: F) -> F:
    """Decorate a worker's main so an uncaught exception leaves an error file for the launcher."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SystemExit as exit_request:
            if exit_request.code in (None, 0):
                return None
            raise
        except Exception as error:
            import traceback  # only on the failure path: the launcher imports this module too

            write_error_file(error, traceback.format_exc())
            raise

    return wrapper  # type: ignore[return-value]


def write_error_file(error: BaseException, callstack: str, path: str | None = None) -> None:
    path = path or os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return
    payload = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    with open(path, "w") as handle:
        json.dump(payload, handle)


MAX_ERROR_FILE_BYTES = 8 * 1024 * 1024
"""The largest error file the launcher reads: 128 times what a report quotes of it. A larger one
is no record (the report quotes the worker's stderr instead), so a runaway traceback costs the
launcher neither its memory nor its time."""
EARLIEST_TIMESTAMP = 946684800.0
"""2000-01-01 UTC: no worker failed before it, so an earlier timestamp is garbage."""
FUTURE_TOLERANCE_S = 86400.0
"""How far past the launcher's clock a timestamp may lie (another host's clock, a time zone slip)."""


@dataclass(frozen=True)
class ErrorRecord:
    message: str
    traceback: str
    timestamp: float | None
    """Unix seconds of the failure, or ``None`` where the file gave no plausible time."""


def read_error_file(path: str | None) -> ErrorRecord | None:
    """The worker's recorded error, or ``None`` when it left no readable record.

    The file is the worker's to write, so anything may be in it, and the launcher (perhaps
    root) reads it: see :func:`_read_regular_file` for what is opened, and any JSON, of any
    shape or depth, is read or refused without failing. A timestamp that is not plausible
    (:func:`plausible_time`) is dropped, so the report keeps the worker's exit time.
    """
    found = _read_regular_file(path) if path else None
    if found is None:
        return None
    content, mtime = found
    try:
        # Bytes that are not UTF-8 still show, replaced; nesting too deep for the parser is no record.
        data = json.loads(content.decode("utf-8", "replace"))
        message = data["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(message, dict):
        # torchrun's own writer puts a dict or a string here; anything else is shown as it is.
        text = message if isinstance(message, str) else json.dumps(message)
        return ErrorRecord(message=text, traceback=text, timestamp=plausible_time(mtime))
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    text = str(message.get("message", "<N/A>"))
    stamp = extra.get("timestamp")
    try:
        timestamp = float(stamp) if stamp is not None else mtime
    except OverflowError:  # a whole number too large for a float: out of range all the same
        timestamp = math.inf
    except (TypeError, ValueError):
        timestamp = mtime
    return ErrorRecord(message=text, traceback=str(extra.get("py_callstack", text)),
                       timestamp=plausible_time(timestamp))


def plausible_time(timestamp: float) -> float | None:
    """``timestamp`` if a failure could have happened then (from 2000 to a day ahead of this clock), else ``None``.

    Not finite, or out of range (``1e20``, ``-5e15``), it would fail the report's date formatting.
    """
    return timestamp if EARLIEST_TIMESTAMP <= timestamp <= time.time() + FUTURE_TOLERANCE_S else None


def _read_regular_file(path: str) -> tuple[bytes, float] | None:
    """The content and modification time of the regular file at ``path``, at most :data:`MAX_ERROR_FILE_BYTES`.

    Opened without following a link (one planted there would have the launcher read and
    quote any file it can read) and without blocking (a FIFO would never answer); anything
    but a regular file, or a larger one, is ``None``.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_ERROR_FILE_BYTES:
                return None
            # One byte more than the limit tells a file that grew since fstat.
            content = handle.read(MAX_ERROR_FILE_BYTES + 1)
        except OSError:
            return None
    return (content, status.st_mtime) if len(content) <= MAX_ERROR_FILE_BYTES else None
