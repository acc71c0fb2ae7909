"""The failure report (torchrun's "Root Cause" block) and the JSON summary file.

The report keeps torchrun's layout so people and log parsers recognise it, without the
launcher traceback torchrun prints before it. The root cause is the first failure the
launcher observed; :class:`~xlarun.failures.FailureRecord` says where each traceback comes from.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from xlarun.errorfile import read_error_file
from xlarun.failures import NOT_AVAILABLE, FailureRecord, signal_name
from xlarun.supervision.group import WorkerResult

MAX_WIDTH = 60


def failure_of(result: WorkerResult, node_rank: int = 0, nnodes: int = 1) -> FailureRecord:
    """A failed worker's record. The traceback is the worker's error file (``@record``), else the signal that killed
    it, else the last lines it wrote to stderr: whatever best says why it failed."""
    recorded = read_error_file(result.error_file)
    returncode = result.returncode if result.returncode is not None else 1
    if recorded is not None:
        text = recorded.traceback
    elif returncode < 0:
        text = f"Signal {-returncode} ({signal_name(-returncode)}) received by PID {result.pid}"
    else:
        text = "\n".join(result.stderr_tail) or NOT_AVAILABLE
    return FailureRecord(rank=result.rank, local_rank=result.local_rank, returncode=returncode, pid=result.pid,
                         time=recorded.timestamp if recorded and recorded.timestamp else (result.ended_at or 0.0),
                         host=socket.getfqdn(), error_file=result.error_file if recorded else NOT_AVAILABLE,
                         traceback=text.rstrip("\n"), node_rank=node_rank, nnodes=nnodes)


def format_failure(index: int, failure: FailureRecord) -> str:
    stamp = datetime.fromtimestamp(int(failure.time)).isoformat(sep="_")
    traceback = failure.traceback.replace("\n", "\n  ")
    return (f"[{index}]:\n"
            f"  time      : {stamp}\n"
            f"  host      : {failure.host}{f' (node_rank: {failure.node_rank})' if failure.nnodes > 1 else ''}\n"
            f"  rank      : {failure.rank} (local_rank: {failure.local_rank})\n"
            f"  exitcode  : {failure.returncode} (pid: {failure.pid})\n"
            f"  error_file: {failure.error_file}\n"
            f"  traceback : {traceback}")


def format_report(name: str, failures: list[FailureRecord]) -> str:
    """torchrun's summary block; ``failures[0]`` is the root cause."""
    title = f"{name} FAILED"
    blocks = [format_failure(index, failure) for index, failure in enumerate(failures)]
    width = min(MAX_WIDTH, max([len(title)] + [len(line) for block in blocks for line in block.split("\n")]))
    others = "\n".join(blocks[1:]) or "  <NO_OTHER_FAILURES>"
    return "\n".join(["", "=" * width, title, "-" * width, "Failures:", others, "-" * width,
                      "Root Cause (first observed failure):", blocks[0], "=" * width])


@dataclass
class RunSummary:
    """What the summary file records for CI scripts."""

    run_id: str
    exit_code: int = 0
    result: str = "succeeded"
    restarts: int = 0
    launcher_signal: str | None = None
    error: str | None = None
    root_cause: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def add_attempt(self, number: int, results: list[WorkerResult],
                    nodes: Mapping[str, Any] | None = None) -> None:
        """Record an attempt's workers, and ``nodes``: the rendezvous's world size and nodes."""
        self.attempts.append({"attempt": number, "workers": [
            {"rank": r.rank, "local_rank": r.local_rank, "pid": r.pid,
             "exitcode": r.returncode if r.returncode is None or r.returncode >= 0 else None,
             "signal": signal_name(r.signal_number) if r.signal_number else None,
             "start_time": r.started_at, "end_time": r.ended_at}
            for r in results], **(nodes or {})})

    def write(self, path: str) -> None:
        """Write the record; a path that cannot take it costs one line, not the run's exit code."""
        temporary = f"{path}.tmp{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(temporary, "w") as handle:
                json.dump(asdict(self), handle, indent=2)
                handle.write("\n")
            os.replace(temporary, path)
        except OSError as error:
            sys.stderr.write(f"xlarun: cannot write the summary file {path}: {error.strerror}\n")


def failure_as_dict(failure: FailureRecord) -> dict[str, Any]:
    data = asdict(failure)
    data["exit_status"] = failure.exit_status
    if failure.returncode < 0:
        data["signal"] = signal_name(-failure.returncode)
    return data
