"""Unit layer: the failure report and the summary record, formatted in-process."""

from __future__ import annotations

import json
from pathlib import Path

from xlarun.failures import NOT_AVAILABLE, FailureRecord
from xlarun.supervision.report import RunSummary, failure_as_dict, format_report


def failure(rank: int, returncode: int, node_rank: int = 0, nnodes: int = 1) -> FailureRecord:
    return FailureRecord(rank=rank, local_rank=rank, returncode=returncode, pid=1000 + rank, time=0.0,
                         host="host-a", node_rank=node_rank, nnodes=nnodes)


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
    record = failure_as_dict(failure(0, -15))
    assert (record["exit_status"], record["signal"]) == (143, "SIGTERM")
    assert record["traceback"] == NOT_AVAILABLE


def test_the_summary_is_written_whole_and_readable(tmp_path: Path) -> None:
    summary = RunSummary(run_id="job", exit_code=3, result="failed", root_cause=failure_as_dict(failure(0, 3)))
    path = tmp_path / "deep" / "summary.json"
    summary.write(str(path))
    written = json.loads(path.read_text())
    assert (written["run_id"], written["exit_code"], written["result"]) == ("job", 3, "failed")
    assert written["root_cause"]["exit_status"] == 3
    assert [entry.name for entry in path.parent.iterdir()] == ["summary.json"]
