"""The launcher↔worker contract: what the launcher hands a worker and what either side reads back.

Both sides import this module: the launcher (:mod:`xlarun.planning.environment`,
:mod:`xlarun.runtimes`, :mod:`xlarun.supervision`) to write a worker's environment and read what it
left, the worker (:mod:`xlarun.worker`, :func:`xlarun.record`) to read that environment and leave
its records. It imports nothing else of xlarun, so a worker pays for none of the launcher's code.
Its parts, each a section below:

**Markers.** :data:`LAUNCHED_MARKER` and :data:`SPMD_MARKER` tell a worker that xlarun started it
and what for; :data:`STEP_LOG_VARIABLE` switches torch_xla's step log on, which the launcher reads.

**The ``--run-path`` bootstrap.** :data:`RUN_PATH_BOOTSTRAP`, the file a ``--run-path`` worker's
Python runs before the script (:mod:`xlarun.worker.run_path`).

**The stack-dump hook.** Every worker's Python arms :mod:`faulthandler` for :data:`STACKS_SIGNAL`
before the script runs, without a change to the script: the launcher puts :data:`HOOK_DIRECTORY`,
which holds only a ``sitecustomize`` module, first on the worker's ``PYTHONPATH`` and names the
dump file in :data:`STACKS_VARIABLE`. The hook then

- registers ``faulthandler`` for the signal with ``all_threads=True``: on the signal, the C-level
  handler writes every thread's Python stack to the file, without the GIL and while the main
  thread is blocked in a C call (a collective, a lock, a read), and the process goes on; the file
  is held at a descriptor number of its own, :data:`STACKS_DESCRIPTOR`;
- gives the worker its environment and ``sys.path`` back as they were (``PYTHONPATH`` restored,
  the variable removed, so the worker's own children do not arm), and hands over to the
  ``sitecustomize`` it shadows, if there is one.

A real-time signal keeps clear of SIGUSR1 and SIGUSR2, which the launcher forwards to the
workers. Its default action ends a process, so the launcher sends it only to a process whose
``/proc/<pid>/status`` says it catches it and whose descriptor :data:`STACKS_DESCRIPTOR` is still
the dump file (:func:`xlarun.supervision.stacks.is_armed`); a worker that did not arm
(``--no-python``, ``python -I`` or ``-S``), or closed the file, is never sent it.

**The error file**, torchrun's: written by a worker's ``@record`` main, read by the failure report.
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

**XRT's names** (torch_xla 2.0 and older), which the launcher and the worker must spell alike:
the launcher (:mod:`xlarun.runtimes.xrt`) gives each worker its own task and device; the worker
(:mod:`xlarun.worker.xrt`) builds the lists naming every task and device. Both halves describe
one cluster, so they read their names from here.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import stat
import time
from collections.abc import Callable, Mapping

from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

PACKAGE_DIRECTORY = os.path.dirname(os.path.abspath(__file__))

# --- markers ---------------------------------------------------------------------------------------

LAUNCHED_MARKER = "XLARUN_LAUNCHED"
"""Set to ``1`` in every worker xlarun starts; :func:`xlarun.is_launched` reads it."""

SPMD_MARKER = "XLARUN_SPMD"
"""Set to ``1`` where the launch asked for SPMD (:mod:`xlarun.runtimes.pjrt`); the worker's
:func:`xlarun.init_process_group` then switches SPMD on if the program has not."""

STEP_LOG_VARIABLE = "XLA_EMIT_STEPLOG"
"""torch_xla's own switch for its step log: the launcher sets it for a watched launch where the
user did not, and reads the worker's stderr for the log's lines where it is on."""

# --- the --run-path bootstrap ----------------------------------------------------------------------

RUN_PATH_BOOTSTRAP = os.path.join(PACKAGE_DIRECTORY, "worker", "run_path.py")
"""What a ``--run-path`` worker's Python runs, the script and its arguments after it
(:class:`xlarun.config.WorkerCommand`); it imports nothing of xlarun, as the worker's Python may
be another than the launcher's."""

# --- the stack-dump hook ---------------------------------------------------------------------------

STACKS_VARIABLE = "XLARUN_STACKS"
"""``<signal number>:<path of the dump file>``, read by the hook once, at interpreter start."""
STACKS_SIGNAL = signal.SIGRTMIN + 6
STACKS_FILE = "stacks.txt"
"""The dump file's name in the worker's log directory (``attempt_<n>/<local_rank>/``)."""
STACKS_DESCRIPTOR = 1000
"""The descriptor number the hook holds the dump file at, so the launcher can tell it is still that file.

The signal handler writes to a number, not a file: a worker that closes descriptors
(``os.closerange(3, 256)``, a daemonizing library) and opens its own file under the same number
would get the dump in that file. The launcher therefore signals only a worker whose descriptor
:data:`STACKS_DESCRIPTOR` is its dump file (``/proc/<pid>/fd/1000``), and reads back only from
that file. The number is high, so a program's own files reach it only after a thousand open ones,
and below 1024, the usual limit on open files; where it is taken or over the limit, the hook does
not arm.
"""
HOOK_DIRECTORY = os.path.join(PACKAGE_DIRECTORY, "worker", "startup")
"""Holds only the hook, ``sitecustomize.py``: anything beside it would be importable by every worker."""


def stacks_file(worker_log_directory: str) -> str:
    """Where a worker's dump goes: beside its error file, in its log directory."""
    return os.path.join(worker_log_directory, STACKS_FILE)


def hook_variables(stacks_file: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker gets so that its Python arms the dump to ``stacks_file`` (``environ``: the
    launcher's own, whose ``PYTHONPATH`` comes after the hook's directory and is restored by it).

    An empty ``PYTHONPATH`` is an unset one, as Python reads it: a separator after the hook's
    directory would add an empty entry, which Python reads as the working directory, and put it
    before the standard library (a ``json.py`` there would replace the real one). The user's own
    empty entries (``a::b``, ``a:``) stay, as plain Python reads them.
    """
    inherited = environ.get("PYTHONPATH")
    path = HOOK_DIRECTORY + os.pathsep + inherited if inherited else HOOK_DIRECTORY
    return {STACKS_VARIABLE: f"{int(STACKS_SIGNAL)}:{stacks_file}", "PYTHONPATH": path}


# --- the error file --------------------------------------------------------------------------------

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
    import json  # only what reads or writes a record loads json

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


class ErrorRecord(Struct, frozen=True):
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
    import json

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
    return ErrorRecord(
        message=text, traceback=str(extra.get("py_callstack", text)), timestamp=plausible_time(timestamp)
    )


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


# --- XRT's names ----------------------------------------------------------------------------------

XRT_TASK_JOB = "localservice"
"""The job every XRT task belongs to, as torch_xla's own launcher names it."""

XRT_DEVICE_KINDS = {"cuda": "GPU", "cpu": "CPU"}
"""XRT's device kind for each xlarun device that runs under XRT.

torch_xla 2.0's own torchrun support covered GPU; XRT on CPU uses the same per-process
variables. These kinds are the ones ``XRT_WORKERS`` and ``XRT_DEVICE_MAP`` describe;
TPU and Neuron use ``XRT_TPU_CONFIG`` instead.
"""
