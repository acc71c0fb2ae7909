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
import os
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


@dataclass(frozen=True)
class ErrorRecord:
    message: str
    traceback: str
    timestamp: float | None


def read_error_file(path: str | None) -> ErrorRecord | None:
    """The worker's recorded error, or ``None`` when it left no readable error file."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
        message = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(message, dict):
        # torchrun's own writer puts a dict or a string here; anything else is shown as it is.
        text = message if isinstance(message, str) else json.dumps(message)
        return ErrorRecord(message=text, traceback=text, timestamp=_mtime(path))
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    text = str(message.get("message", "<N/A>"))
    stamp = extra.get("timestamp")
    try:
        timestamp = float(stamp) if stamp is not None else _mtime(path)
    except (TypeError, ValueError):
        timestamp = _mtime(path)
    return ErrorRecord(message=text, traceback=str(extra.get("py_callstack", text)), timestamp=timestamp)


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None
