"""One failed worker as the launcher reports it: :class:`FailureRecord`.

Kept apart from the report and the supervisor so the rendezvous, which passes records
between nodes, needs neither of them; :func:`xlarun.supervision.report.failure_of` makes one
from a worker's result.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

NOT_AVAILABLE = "<N/A>"


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
        return 128 - self.returncode if self.returncode < 0 else self.returncode


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
