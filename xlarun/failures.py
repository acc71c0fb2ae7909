"""One failed worker as the launcher reports it: :class:`FailureRecord`; and how an end is told,
the one place a signal is named and an exit status worked out (:func:`signal_name`, :func:`exit_status`).

Kept apart from the report and the supervisor so the rendezvous, which passes records
between nodes, needs neither of them; :func:`xlarun.supervision.report.failure_of` makes one
from a worker's result.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

NOT_AVAILABLE = "<N/A>"
HUNG_EXIT_CODE = 124
"""The launcher's exit code when the workers were found hung (``--hang-timeout``), as timeout(1)'s."""


@dataclass(frozen=True)
class FailureRecord:
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


def exit_status(returncode: int) -> int:
    """A shell's status for a process that ended with ``returncode`` (subprocess's, ``-N`` for signal N):
    its own exit code, or 128+N."""
    return signal_exit_status(-returncode) if returncode < 0 else returncode


def signal_exit_status(number: int) -> int:
    """A shell's status for a process ended by signal ``number``, and the launcher's when it stops on one."""
    return 128 + number
