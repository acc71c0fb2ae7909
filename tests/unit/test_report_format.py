"""Unit layer: the failure report, the end of a run and the summary record, formatted in-process."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from xlarun.console import flush_consoles
from xlarun.failures import HUNG_EXIT_CODE, NOT_AVAILABLE, FailureRecord, exit_status, signal_name
from xlarun.rendezvous import LostNode, NodeStacks
from xlarun.supervision.end import HangCause, RunEnd
from xlarun.supervision.group import WorkerResult
from xlarun.supervision.report import (
    RunSummary,
    format_report,
    print_root_cause,
    read_run_end,
    root_cause_record,
)


def failure(rank: int, returncode: int, node_rank: int = 0, nnodes: int = 1) -> FailureRecord:
    return FailureRecord(
        rank=rank,
        local_rank=rank,
        returncode=returncode,
        pid=1000 + rank,
        time=0.0,
        host="host-a",
        node_rank=node_rank,
        nnodes=nnodes,
    )


def hang_cause(nnodes: int = 2, missing: tuple[int, ...] = ()) -> HangCause:
    # Node 1's report came first; node 0 lists them by node rank.
    nodes = (
        NodeStacks(
            node_rank=0,
            host="host-a",
            positions={1: "all_reduce (t.py:9)", 0: "all_reduce (t.py:9)"},
            stacks_files={1: "/logs/a/attempt_0/1/stacks.txt", 0: "/logs/a/attempt_0/0/stacks.txt"},
        ),
        NodeStacks(
            node_rank=1,
            host="host-b",
            positions={2: "load (t.py:4)"},
            stacks_files={2: "/logs/b/attempt_0/0/stacks.txt"},
        ),
    )
    return HangCause("no output for 600 s and no CPU use", nodes[:nnodes], nnodes, missing)


def test_the_first_failure_is_the_root_cause_and_the_rest_are_listed() -> None:
    text = format_report("train.py", [failure(1, 3), failure(0, -9)])
    lines = text.split("\n")
    assert lines[2] == "train.py FAILED"
    root = lines.index("Root Cause (first observed failure):")
    assert "  rank      : 1 (local_rank: 1)" in lines[root:]
    assert "  exitcode  : -9 (pid: 1000)" in lines[:root]
    assert lines[1] == lines[-1] and set(lines[1]) == {"="}


def test_a_single_failure_says_there_are_no_others() -> None:
    assert "  <NO_OTHER_FAILURES>" in format_report("train.py", [failure(0, 1)]).split("\n")


def test_the_node_is_named_only_in_a_multi_node_job() -> None:
    assert "(node_rank: 2)" in format_report("t", [failure(0, 1, node_rank=2, nnodes=3)])
    assert "node_rank" not in format_report("t", [failure(0, 1)])


def test_a_signal_death_maps_to_shells_exit_status_and_names_the_signal() -> None:
    record = root_cause_record(failure(0, -15))
    assert (record["exit_status"], record["signal"]) == (143, "SIGTERM")
    assert record["traceback"] == NOT_AVAILABLE
    assert "signal" not in root_cause_record(failure(0, 3))


@pytest.mark.parametrize(("returncode", "status"), [(3, 3), (1, 1), (-9, 137), (-15, 143)])
def test_an_exit_status_is_the_code_or_128_plus_the_signal(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status == failure(0, returncode).exit_status


def test_a_signal_without_a_name_is_still_named() -> None:
    assert (signal_name(signal.SIGKILL), signal_name(99)) == ("SIGKILL", "signal 99")


def test_each_end_has_its_exit_code() -> None:
    assert (RunEnd.succeeded().exit_code, RunEnd.not_needed().exit_code) == (0, 0)
    assert RunEnd.signalled(signal.SIGTERM).exit_code == 143
    assert RunEnd.hung(hang_cause()).exit_code == HUNG_EXIT_CODE == 124
    assert RunEnd.failed([failure(1, 3), failure(0, -9)]).exit_code == 3
    assert RunEnd.failed([failure(0, -9)]).exit_code == 137
    assert RunEnd.failed([]).exit_code == 1 and RunEnd.failed([]).root_cause is None
    assert RunEnd.launcher_error("cannot start").exit_code == 1


def test_a_failed_end_keeps_the_root_cause_apart_from_the_rest() -> None:
    end = RunEnd.failed([failure(1, 3), failure(0, -9)])
    assert end.root_cause == end.failure == failure(1, 3)
    assert end.other_failures == (failure(0, -9),)
    assert RunEnd.hung(hang_cause()).failure is None


def test_a_hang_lists_every_nodes_ranks_in_order() -> None:
    cause = hang_cause()
    assert list(cause.positions) == [0, 1, 2]
    assert list(cause.stacks_files) == [0, 1, 2]
    record = root_cause_record(cause)
    assert list(record) == ["reason", "message", "exit_status", "positions", "stacks_files"]
    assert (record["reason"], record["exit_status"]) == ("hung", 124)
    assert record["positions"] == {"0": "all_reduce (t.py:9)", "1": "all_reduce (t.py:9)", "2": "load (t.py:4)"}


def test_the_record_names_the_launchers_signal_and_keeps_the_documented_order() -> None:
    summary = RunSummary(run_id="job", restarts=1)
    summary.add_attempt(0, [WorkerResult(local_rank=0, rank=0, pid=1, started_at=0.0, returncode=-15)])
    record = summary.record(RunEnd.signalled(signal.SIGTERM))
    assert list(record) == [
        "run_id",
        "exit_code",
        "result",
        "restarts",
        "launcher_signal",
        "error",
        "root_cause",
        "other_failures",
        "attempts",
    ]
    assert (record["exit_code"], record["result"], record["launcher_signal"], record["root_cause"]) == (
        143,
        "signalled",
        "SIGTERM",
        None,
    )
    assert record["attempts"][0]["workers"][0]["signal"] == "SIGTERM"


def test_a_launcher_error_keeps_the_root_cause_it_came_after() -> None:
    record = RunSummary(run_id="job").record(RunEnd.launcher_error("internal error", 3, failure(0, 3)))
    assert (record["result"], record["exit_code"], record["error"]) == ("launcher_error", 3, "internal error")
    assert record["root_cause"]["rank"] == 0


def test_the_summary_is_written_whole_and_readable(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "summary.json"
    RunSummary(run_id="job").write(str(path), RunEnd.failed([failure(0, 3)]))
    written = json.loads(path.read_text())
    assert (written["run_id"], written["exit_code"], written["result"]) == ("job", 3, "failed")
    assert written["root_cause"]["exit_status"] == 3
    assert [entry.name for entry in path.parent.iterdir()] == ["summary.json"]


def test_a_hang_is_reported_with_where_each_node_wrote_its_stacks(capfd: pytest.CaptureFixture[str]) -> None:
    flush_consoles()  # nothing of an earlier test's is left to come
    capfd.readouterr()
    print_root_cause(RunEnd.hung(hang_cause(missing=(3,))), "t.py")
    flush_consoles()
    assert capfd.readouterr().err.splitlines() == [
        "xlarun: the workers are hung: no output for 600 s and no CPU use",
        "xlarun: where the ranks stand: rank 2: load (t.py:4) · ranks 0-1: all_reduce (t.py:9)",
        "xlarun: every thread's stack on node 0 (host-a): /logs/a/attempt_0/<local_rank>/stacks.txt",
        "xlarun: every thread's stack on node 1 (host-b): /logs/b/attempt_0/<local_rank>/stacks.txt",
        "xlarun: no stacks came from rank 3",
    ]


def test_a_failure_is_reported_as_torchrun_does(capfd: pytest.CaptureFixture[str]) -> None:
    flush_consoles()
    capfd.readouterr()
    print_root_cause(RunEnd.failed([failure(1, 3), failure(0, -9)]), "train.py")
    flush_consoles()
    assert capfd.readouterr().err == format_report("train.py", [failure(1, 3), failure(0, -9)]) + "\n"


@pytest.mark.parametrize(
    "end",
    [
        RunEnd.failed([failure(3, 7, node_rank=1, nnodes=2), failure(0, -15, nnodes=2)]),
        RunEnd.node_lost(LostNode(node_rank=1, host="h2", silent_for=15.0), [failure(0, 1, nnodes=2)]),
        RunEnd.signalled(signal.SIGHUP),
        RunEnd.launcher_error("the store is gone", root_cause=failure(1, 2)),
        RunEnd.succeeded(),
    ],
)
def test_another_node_s_summary_reads_back_into_the_end_it_was_made_from(end: RunEnd) -> None:
    record = json.loads(json.dumps(RunSummary(run_id="job").record(end)))
    assert read_run_end(record) == end


def test_a_hang_reads_back_with_its_message() -> None:
    record = json.loads(json.dumps(RunSummary(run_id="job").record(RunEnd.hung(hang_cause()))))
    end = read_run_end(record)
    assert (end.result, end.exit_code, getattr(end.root_cause, "message", None)) == ("hung", 124, hang_cause().message)


@pytest.mark.parametrize("record", [{}, {"launcher_signal": "SIGNOPE"}, {"root_cause": {"reason": "exited"}}])
def test_a_summary_xlarun_did_not_write_is_refused(record: dict) -> None:
    with pytest.raises(ValueError):
        read_run_end({**RunSummary(run_id="job").record(RunEnd.succeeded()), **record} if record else record)
