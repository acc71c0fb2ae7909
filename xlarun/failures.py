"""One failed worker as the launcher reports it: :class:`FailureRecord`, with what its stderr says of
the failure (:func:`stderr_excerpt`); and how an end is told, the one place a signal is named and an
exit status worked out (:func:`signal_name`, :func:`exit_status`).

Kept apart from the report and the supervisor so the rendezvous, which passes records
between nodes, needs neither of them; :func:`xlarun.supervision.report.failure_of` makes one
from a worker's result.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from xlarun.structs import Struct

NOT_AVAILABLE = "<N/A>"
HUNG_EXIT_CODE = 124
"""The launcher's exit code when the workers were found hung (``--hang-timeout``), as timeout(1)'s."""
QUOTED_STDERR_LINES = 20
"""How many of its last stderr lines a failed worker's record quotes where they hold no Python traceback."""
_TRACEBACK_START = r"Traceback \(most recent call last\):|  \+ Exception Group Traceback \(most recent call last\):"
"""The first line of a traceback Python prints for an uncaught exception, or exception group (3.11)."""
_CHAINING_LINES = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
"""The line between two tracebacks of one chain: the one above belongs to the exception below."""


class FailureRecord(Struct, frozen=True):
    """One failed worker, as it appears in the report; JSON-ready so other nodes can share it."""

    rank: int
    local_rank: int
    returncode: int
    pid: int
    time: float
    host: str
    error_file: str = NOT_AVAILABLE
    traceback: str = NOT_AVAILABLE
    node_rank: int = 0
    nnodes: int = 1
    reason: str = "exited"
    """How the worker ended: ``exited`` (its own exit code), ``signal``, or ``oom_killed`` (the
    kernel's OOM killer's SIGKILL)."""
    peak_rss_mib: float | None = None

    @property
    def exit_status(self) -> int:
        return exit_status(self.returncode)

    @property
    def signal(self) -> str | None:
        """The name of the signal that ended the worker, if one did."""
        return signal_name(-self.returncode) if self.returncode < 0 else None


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15; ``signal 64`` for a number the platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def event_returncode(code: object, name: object) -> int:
    """A worker's returncode (``-N`` for signal N) from its ``worker.exited`` event's ``process.exit.code``
    and ``signal`` (a name, or ``signal 64`` for one the platform does not name)."""
    if not isinstance(name, str):
        return code if isinstance(code, int) else 0
    number = int(name.split()[1]) if name.startswith("signal ") else signal.Signals[name].value
    return -number


def exit_status(returncode: int) -> int:
    """A shell's status for a process that ended with ``returncode`` (subprocess's, ``-N`` for signal N):
    its own exit code, or 128+N."""
    return signal_exit_status(-returncode) if returncode < 0 else returncode


def signal_exit_status(number: int) -> int:
    """A shell's status for a process ended by signal ``number``, and the launcher's when it stops on one."""
    return 128 + number


def stderr_excerpt(tail: Sequence[str]) -> str:
    """What the last lines a worker wrote to stderr say of its failure.

    The last Python traceback among them, whole from its ``Traceback (most recent call last):``
    line with the exceptions chained before it (``During handling of the above exception...``)
    as far as the tail reaches, down to the tail's end; without one, the last
    :data:`QUOTED_STDERR_LINES` lines. A warning or a message printed before the traceback is
    left out, so the report's traceback field starts where the failure's story does.
    """
    starts = [index for index, line in enumerate(tail) if re.fullmatch(_TRACEBACK_START, line.rstrip())]
    if not starts:
        return "\n".join(tail[-QUOTED_STDERR_LINES:])
    start = starts.pop()
    while starts and _chained_above(tail[starts[-1] : start]):
        start = starts.pop()
    return "\n".join(tail[start:])


def _chained_above(lines: Sequence[str]) -> bool:
    """Whether ``lines`` (a traceback and what follows it, up to the next one) end in a chaining line."""
    written = [line.strip() for line in lines if line.strip()]
    return bool(written) and written[-1] in _CHAINING_LINES
