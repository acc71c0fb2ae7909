"""The failure report (torchrun's "Root Cause" block) and the JSON summary file.

The report keeps torchrun's layout so people and log parsers recognise it, without the
launcher traceback torchrun prints before it. The root cause is the first failure the
launcher observed; :class:`~xlarun.failures.FailureRecord` says where each traceback comes from.

What a worker wrote (its error file, its stderr) is untrusted input: a record quotes at most the
last :data:`MAX_QUOTED_BYTES` of it, the report shows its control characters escaped, and the
summary file goes through a temporary name nobody can predict.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from xlarun.console import say
from xlarun.contract import read_error_file
from xlarun.failures import NOT_AVAILABLE, FailureRecord, signal_name
from xlarun.supervision.group import WorkerResult

HUNG_EXIT_CODE = 124
"""The launcher's exit code when the workers were found hung (``--hang-timeout``), as timeout(1)'s."""
MAX_WIDTH = 60
MAX_QUOTED_BYTES = 64 * 1024
"""The most of a worker's text (traceback, message, stderr tail) a record keeps: its end, where the
error is. Records are printed, written to the summary and published to the other nodes through the
store, whose connection a record of some megabytes breaks."""
_CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""What the report shows escaped: C0 and C1 controls but newline and tab (an escape sequence would
reach the terminal and could rewrite it), and lone surrogates, which JSON can carry but no terminal shows."""


def failure_of(result: WorkerResult, node_rank: int = 0, nnodes: int = 1) -> FailureRecord:
    """A failed worker's record. The traceback is the worker's error file (``@record``), else the signal that killed
    it, else the last lines it wrote to stderr: whatever best says why it failed."""
    recorded = read_error_file(result.error_file)
    returncode = result.returncode if result.returncode is not None else 1
    reason = "oom_killed" if result.oom_killed else "signal" if returncode < 0 else "exited"
    if recorded is not None:
        text = recorded.traceback
    elif returncode < 0:
        text = f"Signal {-returncode} ({signal_name(-returncode)}) received by PID {result.pid}"
        if result.oom_killed:
            text += f": the kernel's OOM killer{peak_rss_note(result.peak_rss_mib)}"
    else:
        text = "\n".join(result.stderr_tail) or NOT_AVAILABLE
    return FailureRecord(rank=result.rank, local_rank=result.local_rank, returncode=returncode, pid=result.pid,
                         time=recorded.timestamp if recorded and recorded.timestamp else (result.ended_at or 0.0),
                         host=socket.getfqdn(), error_file=result.error_file if recorded else NOT_AVAILABLE,
                         traceback=keep_end(text.rstrip("\n")), node_rank=node_rank, nnodes=nnodes, reason=reason,
                         peak_rss_mib=result.peak_rss_mib)


def peak_rss_note(peak_rss_mib: float | None) -> str:
    return "" if peak_rss_mib is None else f" (peak RSS {peak_rss_mib:.0f} MiB)"


def keep_end(text: str, limit: int = MAX_QUOTED_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` (UTF-8), under a first line that says how many were cut."""
    # surrogatepass: a lone surrogate from a JSON escape is kept as it came, not an error.
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[-limit:]
    while kept[0] & 0xC0 == 0x80:  # a character cut in the middle is dropped whole
        kept = kept[1:]
    return f"[... {len(data) - len(kept)} bytes cut ...]\n" + kept.decode("utf-8", "surrogatepass")


def escape_controls(text: str) -> str:
    """``text`` with every character of :data:`_CONTROL_CHARACTERS` written as Python would (``\\x1b``)."""
    return _CONTROL_CHARACTERS.sub(lambda found: ascii(found.group())[1:-1], text)


def format_failure(index: int, failure: FailureRecord) -> str:
    stamp = datetime.fromtimestamp(int(failure.time)).isoformat(sep="_")
    traceback = escape_controls(failure.traceback).replace("\n", "\n  ")
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
             "start_time": r.started_at, "end_time": r.ended_at,
             "peak_rss_mib": r.peak_rss_mib, "cpu_s": r.cpu_s, "steps": r.steps,
             **({"oom_killed": True} if r.oom_killed else {}),
             **({"stack": r.position} if r.position is not None else {})}
            for r in results], **(nodes or {})})

    def write(self, path: str) -> None:
        """Write the record whole (a reader sees the old file or the new one); a path that cannot take it
        costs one line, not the run's exit code.

        The record is written to a temporary file beside ``path``, then renamed over it. The temporary's
        name is random and it is created only if nothing is there (``O_EXCL``, which refuses a link too):
        in a shared directory, a link planted at a name the launcher would use could otherwise have it,
        perhaps as root, overwrite the file the link points to. Its mode is what ``open`` would give.
        """
        directory, name = os.path.split(os.path.abspath(path))
        temporary = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o666)
            try:
                with os.fdopen(descriptor, "w") as handle:
                    json.dump(asdict(self), handle, indent=2)
                    handle.write("\n")
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError as error:
            say(f"cannot write the summary file {path}: {error.strerror}")


def failure_as_dict(failure: FailureRecord) -> dict[str, Any]:
    """The summary's ``root_cause``: the record, its exit status and, for a signal, the signal's name."""
    data = asdict(failure)
    data["exit_status"] = failure.exit_status
    if failure.returncode < 0:
        data["signal"] = signal_name(-failure.returncode)
    return data
