"""The failure report (torchrun's "Root Cause" block) and the JSON summary file, both of a run's
:class:`~xlarun.supervision.end.RunEnd`.

The report keeps torchrun's layout so people and log parsers recognise it, without the
launcher traceback torchrun prints before it. The root cause is the first failure the
launcher observed; :class:`~xlarun.failures.FailureRecord` says where each traceback comes from.
A hung run's report says where the ranks stood instead (:func:`print_root_cause`).

What a worker wrote (its error file, its stderr) is untrusted input: a record quotes at most the
last :data:`MAX_QUOTED_BYTES` of it, the report shows its control characters escaped, and the
summary file goes through a temporary name nobody can predict.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
from collections.abc import Mapping

from xlarun.console import console, say
from xlarun.contract import STACKS_FILE, read_error_file
from xlarun.failures import NOT_AVAILABLE, FailureRecord, signal_name, stderr_excerpt
from xlarun.rendezvous import LostNode
from xlarun.structs import Struct, asdict, field, fields
from xlarun.supervision.end import HangCause, RootCause, RunEnd
from xlarun.supervision.group import WorkerResult

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any

MAX_WIDTH = 60
MAX_QUOTED_BYTES = 64 * 1024
"""The most of a worker's text (traceback, message, stderr tail) a record keeps: its end, where the
error is. Records are printed, written to the summary and published to the other nodes through the
store, whose connection a record of some megabytes breaks."""
_CONTROL_CHARACTERS = "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]"
"""What the report shows escaped: C0 and C1 controls but newline and tab (an escape sequence would
reach the terminal and could rewrite it), and lone surrogates, which JSON can carry but no terminal shows."""


REPORT_HOST_VARIABLE = "XLARUN_REPORT_HOST"
"""The name a failure record gives this node's host, where set: a job on several hosts sets it to the host
as the user named it (several hosts may report one hostname); else the host's fully qualified name."""


def host_name() -> str:
    """This node's host as its failure records and stacks name it (see :data:`REPORT_HOST_VARIABLE`)."""
    return os.environ.get(REPORT_HOST_VARIABLE) or socket.getfqdn()


RULE = "="
"""The character of the report's first and last lines: a line of nothing else opens or closes a report."""


def failure_of(result: WorkerResult, node_rank: int = 0, nnodes: int = 1) -> FailureRecord:
    """A failed worker's record. The traceback is the worker's error file (``@record``), else the signal that killed
    it, else the last Python traceback it wrote to stderr, else its last stderr lines (:func:`stderr_excerpt`):
    whatever best says why it failed."""
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
        text = stderr_excerpt(result.stderr_tail) or NOT_AVAILABLE
    return FailureRecord(
        rank=result.rank,
        local_rank=result.local_rank,
        returncode=returncode,
        pid=result.pid,
        time=recorded.timestamp if recorded and recorded.timestamp else (result.ended_at or 0.0),
        host=host_name(),
        error_file=result.error_file if recorded else NOT_AVAILABLE,
        traceback=keep_end(text.rstrip("\n")),
        node_rank=node_rank,
        nnodes=nnodes,
        reason=reason,
        peak_rss_mib=result.peak_rss_mib,
    )


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
    return re.sub(_CONTROL_CHARACTERS, lambda found: ascii(found.group())[1:-1], text)


def format_failure(index: int, failure: FailureRecord) -> str:
    from datetime import datetime  # only a failure's report needs it: its import costs every launch 2 ms

    stamp = datetime.fromtimestamp(int(failure.time)).isoformat(sep="_")
    traceback = escape_controls(failure.traceback).replace("\n", "\n  ")
    return (
        f"[{index}]:\n"
        f"  time      : {stamp}\n"
        f"  host      : {failure.host}{f' (node_rank: {failure.node_rank})' if failure.nnodes > 1 else ''}\n"
        f"  rank      : {failure.rank} (local_rank: {failure.local_rank})\n"
        f"  exitcode  : {failure.returncode} (pid: {failure.pid})\n"
        f"  error_file: {failure.error_file}\n"
        f"  traceback : {traceback}"
    )


def format_report(name: str, failures: list[FailureRecord], lost: LostNode | None = None) -> str:
    """torchrun's summary block; ``failures[0]`` is the root cause, unless a node was ``lost``: then
    that is, and every failure is listed under it."""
    title = f"{name} FAILED"
    blocks = [format_failure(index, failure) for index, failure in enumerate(failures)]
    if lost is not None:
        blocks.insert(0, f"  {lost.message}")
    width = min(MAX_WIDTH, max([len(title)] + [len(line) for block in blocks for line in block.split("\n")]))
    others = "\n".join(blocks[1:]) or "  <NO_OTHER_FAILURES>"
    return "\n".join(
        [
            "",
            RULE * width,
            title,
            "-" * width,
            "Failures:",
            others,
            "-" * width,
            "Root Cause (first observed failure):",
            blocks[0],
            RULE * width,
        ]
    )


SHOWN_BY_LAUNCHER_VARIABLE = "XLARUN_REPORT_SHOWN_BY_LAUNCHER"
"""Set (by a host's agent, for its node) where the launcher of a job on several hosts shows the failure report
once, made from the nodes' summaries: the node prints its other lines, not the report."""


def failure_report(end: RunEnd, script: str) -> str | None:
    """torchrun's report of ``end``: a worker's failure, or a node lost above the failures it caused; else None."""
    cause = end.root_cause
    if isinstance(cause, FailureRecord):
        return format_report(script, [cause, *end.other_failures])
    if isinstance(cause, LostNode) and end.other_failures:
        return format_report(script, list(end.other_failures), cause)
    return None


def print_failure_report(end: RunEnd, script: str) -> bool:
    """Print :func:`failure_report` on stderr; whether ``end`` has one."""
    report = failure_report(end, script)
    if report is not None:
        console(2).write((report + "\n").encode(errors="replace"))
    return report is not None


def print_root_cause(end: RunEnd, script: str) -> None:
    """Print on stderr why the run ended, where a worker failed or the workers hung: torchrun's report
    (and the OOM killer named, where it killed the root cause); or where the ranks stood and where
    every thread's stack was written; or the node lost, under the failures it caused, and in one line.
    The report itself is left to the launcher where :data:`SHOWN_BY_LAUNCHER_VARIABLE` says so."""
    if not os.environ.get(SHOWN_BY_LAUNCHER_VARIABLE):
        print_failure_report(end, script)
    cause = end.root_cause
    if isinstance(cause, FailureRecord):
        if cause.reason == "oom_killed":
            where = f" on node {cause.node_rank}" if cause.nnodes > 1 else ""
            say(f"rank {cause.rank}{where} was killed by the kernel's OOM killer{peak_rss_note(cause.peak_rss_mib)}")
    elif isinstance(cause, LostNode):
        say(cause.message)
    elif isinstance(cause, HangCause):
        from xlarun.supervision.stacks import describe_positions, rank_ranges  # loaded only when a run hangs

        say(f"the workers are hung: {cause.message}")
        if cause.positions:
            say(f"where the ranks stand: {describe_positions(cause.positions)}")
        for stacks in cause.nodes:
            if stacks.stacks_files:
                on = f" on node {stacks.node_rank} ({stacks.host})" if cause.nnodes > 1 else ""
                attempt_dir = os.path.dirname(os.path.dirname(next(iter(stacks.stacks_files.values()))))
                say(f"every thread's stack{on}: {os.path.join(attempt_dir, '<local_rank>', STACKS_FILE)}")
        if cause.missing:
            say(f"no stacks came from rank{'s' if len(cause.missing) > 1 else ''} {rank_ranges(cause.missing)}")


class RunSummary(Struct):
    """What the summary file records for CI scripts: the run's attempts as they end, and then its end."""

    run_id: str
    restarts: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def add_attempt(self, number: int, results: list[WorkerResult], nodes: Mapping[str, Any] | None = None) -> None:
        """Record an attempt's workers, and ``nodes``: the rendezvous's world size and nodes."""
        self.attempts.append(
            {
                "attempt": number,
                "workers": [
                    {
                        "rank": r.rank,
                        "local_rank": r.local_rank,
                        "pid": r.pid,
                        "exitcode": r.returncode if r.returncode is None or r.returncode >= 0 else None,
                        "signal": signal_name(r.signal_number) if r.signal_number else None,
                        "start_time": r.started_at,
                        "end_time": r.ended_at,
                        "peak_rss_mib": r.peak_rss_mib,
                        "cpu_s": r.cpu_s,
                        "steps": r.steps,
                        **({"oom_killed": True} if r.oom_killed else {}),
                        **({"stack": r.position} if r.position is not None else {}),
                    }
                    for r in results
                ],
                **(nodes or {}),
            }
        )

    def record(
        self, end: RunEnd, events_dropped: int | None = None, facts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The file's JSON object: the run, how it ended (with the failures the report lists after the root
        cause: a job on several hosts gathers every node's), its attempts; with an event sink
        (``--event-log``), ``events_dropped``: the events a sink never took; and ``facts``, what the
        launch adds at its end (``compile_cache``: the directory, its entries before and after the run)."""
        return {
            "run_id": self.run_id,
            "exit_code": end.exit_code,
            "result": end.result,
            "restarts": self.restarts,
            "launcher_signal": None if end.launcher_signal is None else signal_name(end.launcher_signal),
            "error": end.error,
            "root_cause": None if end.root_cause is None else root_cause_record(end.root_cause),
            "other_failures": [root_cause_record(failure) for failure in end.other_failures],
            "attempts": self.attempts,
            **({} if events_dropped is None else {"events_dropped": events_dropped}),
            **(facts or {}),
        }

    def write(
        self, path: str, end: RunEnd, events_dropped: int | None = None, facts: Mapping[str, Any] | None = None
    ) -> None:
        """Write the record of the run that ended (:func:`write_summary_file`); a path that cannot take it
        costs one line, not the run's exit code."""
        try:
            write_summary_file(path, self.record(end, events_dropped, facts))
        except OSError as error:
            say(f"cannot write the summary file {path}: {error.strerror}")


def write_summary_file(path: str, record: Mapping[str, Any]) -> None:
    """Make ``record`` (as JSON) what ``path`` holds, so whole that a reader sees the old file or the new one.

    A regular file (or nothing yet) is replaced: the record goes to a temporary file beside it, renamed over
    it. The temporary's name is random and it is created only if nothing is there (``O_EXCL``, which refuses
    a link too): in a shared directory, a link planted at a name the launcher would use could otherwise have
    it, perhaps as root, overwrite the file the link points to. Its mode is what ``open`` would give. Through
    a symbolic link the file it names is replaced and the link stays; a FIFO or a device node (``/dev/null``)
    is written in place, whole, never replaced by a file (:mod:`xlarun.supervision.sinkfiles`).
    """
    import json  # only what reads or writes a record loads json

    data = (json.dumps(record, indent=2) + "\n").encode()
    from xlarun.supervision.sinkfiles import written_in_place  # a FIFO's or a device's ways, seldom wanted

    if written_in_place(path, data):
        return
    target = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    directory, name = os.path.split(target)
    temporary = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
    os.makedirs(directory, exist_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def root_cause_record(cause: RootCause) -> dict[str, Any]:
    """The summary's ``root_cause``: a failure's record with its exit status and, for a signal, the
    signal's name; or a hang's ``reason``, ``message``, ``exit_status``, ``positions`` and ``stacks_files``;
    or a lost node's ``reason`` (``node_lost``), ``node_rank``, ``host``, ``silent_for``, ``message`` and
    ``exit_status``. :func:`read_root_cause` reads it back."""
    if isinstance(cause, LostNode):
        return {
            "reason": "node_lost",
            "node_rank": cause.node_rank,
            "host": cause.host,
            "silent_for": cause.silent_for,
            "message": cause.message,
            "exit_status": cause.exit_status,
        }
    if isinstance(cause, HangCause):
        return {
            "reason": "hung",
            "message": cause.message,
            "exit_status": cause.exit_status,
            "positions": {str(rank): where for rank, where in cause.positions.items()},
            "stacks_files": {str(rank): path for rank, path in cause.stacks_files.items()},
        }
    return {**asdict(cause), "exit_status": cause.exit_status, **({"signal": cause.signal} if cause.signal else {})}


def read_root_cause(record: Mapping[str, Any]) -> RootCause:
    """The root cause :func:`root_cause_record` wrote (another node's, in its summary), as the value it was
    made from; a hang's comes back with its message only (where each rank stood stays in the record).
    Raises ``ValueError`` for a record xlarun did not write."""
    try:
        if record["reason"] == "node_lost":
            return LostNode(int(record["node_rank"]), str(record["host"]), float(record["silent_for"]))
        if record["reason"] == "hung":
            return HangCause(str(record["message"]), nodes=())
        return FailureRecord(**{item.name: record[item.name] for item in fields(FailureRecord)})
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a root cause xlarun recorded ({error!r})") from None


def read_run_end(record: Mapping[str, Any]) -> RunEnd:
    """The end that :meth:`RunSummary.record` wrote (another node's summary), as the value it was made from.
    Raises ``ValueError`` for a record xlarun did not write."""
    try:
        cause = record["root_cause"]
        launcher_signal = record["launcher_signal"]
        return RunEnd(
            result=record["result"],
            exit_code=int(record["exit_code"]),
            root_cause=None if cause is None else read_root_cause(cause),
            launcher_signal=None if launcher_signal is None else signal.Signals[launcher_signal].value,
            error=record["error"],
            other_failures=tuple(
                failure
                for failure in map(read_root_cause, record["other_failures"])
                if isinstance(failure, FailureRecord)
            ),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a summary xlarun recorded ({error!r})") from None
