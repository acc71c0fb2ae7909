"""One failed worker as the launcher reports it: :class:`FailureRecord`.

Kept apart from the report and the supervisor so the rendezvous, which passes records
between nodes, needs neither of them.
"""

from __future__ import annotations

import signal
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xlarun.errorfile import read_error_file

if TYPE_CHECKING:
    from xlarun.supervisor import WorkerResult

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

    @property
    def exit_status(self) -> int:
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    @classmethod
    def from_result(cls, result: WorkerResult, node_rank: int = 0, nnodes: int = 1) -> "FailureRecord":
        """The traceback is the worker's error file (``@record``), else the signal that killed
        it, else the last lines it wrote to stderr: whatever best says why it failed."""
        recorded = read_error_file(result.error_file)
        returncode = result.returncode if result.returncode is not None else 1
        if recorded is not None:
            text = recorded.traceback
        elif returncode < 0:
            text = f"Signal {-returncode} ({signal_name(-returncode)}) received by PID {result.pid}"
        else:
            text = "\n".join(result.stderr_tail) or NOT_AVAILABLE
        return cls(rank=result.rank, local_rank=result.local_rank, returncode=returncode, pid=result.pid,
                   time=recorded.timestamp if recorded and recorded.timestamp else (result.ended_at or 0.0),
                   host=socket.getfqdn(), error_file=result.error_file if recorded else NOT_AVAILABLE,
                   traceback=text.rstrip("\n"), node_rank=node_rank, nnodes=nnodes)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
