"""``--event-log``: real launches write their events as JSON lines, in order, agreeing with the summary
file; a log that cannot take them costs events, counted, never the run's exit code or summary."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import finish, plan, run_xlarun, slack_s, wait_for, worker
from multinode import Nodes, listeners, static

DUMP_ENV = worker("dump_env.py")
FAIL_ATTEMPTS = worker("fail_attempts.py")
LOOP = worker("mn_allreduce_loop.py")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "s3cr3t-value-never-logged"
RFC3339_UTC_MICROSECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
ENVELOPE = ["schema_version", "seq", "time", "run_id", "node_rank", "host", "attempt", "name", "trace_id", "attributes"]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def names(log: list[dict[str, Any]]) -> list[str]:
    return [event["name"] for event in log]


def exit_codes(summary: dict[str, Any]) -> dict[tuple[int, int], int | None]:
    return {
        (attempt["attempt"], worker["rank"]): worker["exitcode"]
        for attempt in summary["attempts"]
        for worker in attempt["workers"]
    }


def test_a_two_worker_run_writes_its_events_in_order_with_the_summarys_exit_codes(
    tmp_path: Path, out_dir: Path
) -> None:
    log, summary_file = tmp_path / "ev.jsonl", tmp_path / "run.json"
    env = {
        "DUMP_DIR": str(out_dir),
        "TRACEPARENT": TRACEPARENT,
        "TRACESTATE": "vendor=abc",
        "BAGGAGE": "k=v",
        "HF_TOKEN": SECRET,
    }
    run = run_xlarun("--event-log", log, "--summary-file", summary_file, "--nproc-per-node", 2, DUMP_ENV, env=env)
    assert run.returncode == 0, run.stderr

    log_events = events(log)
    assert names(log_events) == [
        "launch.started",
        "rendezvous.started",
        "rendezvous.completed",
        "worker.started",
        "worker.started",
        "worker.exited",
        "worker.exited",
        "launch.finished",
    ]
    assert [event["seq"] for event in log_events] == list(range(1, 9))
    summary = json.loads(summary_file.read_text())
    for event in log_events:
        assert list(event) == ENVELOPE
        assert event["schema_version"] == 1 and RFC3339_UTC_MICROSECONDS.match(event["time"]), event
        assert (event["run_id"], event["node_rank"], event["attempt"]) == (summary["run_id"], 0, 0)
        assert event["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    exited = {
        (event["attempt"], event["attributes"]["rank"]): event["attributes"]["process.exit.code"]
        for event in log_events
        if event["name"] == "worker.exited"
    }
    assert exited == exit_codes(summary) == {(0, 0): 0, (0, 1): 0}
    pids = {worker["pid"] for worker in summary["attempts"][0]["workers"]}
    assert {event["attributes"]["process.pid"] for event in log_events if event["name"] == "worker.started"} == pids
    assert all(event["attributes"]["expected"] for event in log_events if event["name"] == "worker.exited")
    assert log_events[-1]["attributes"] == {"process.exit.code": 0, "result": "succeeded", "root_cause": None}
    assert summary["events_dropped"] == 0
    # The workers got the trace context unchanged; no secret reached the log.
    for rank in (0, 1):
        seen = json.loads((out_dir / f"{rank}_0.json").read_text())["env"]
        assert (seen["TRACEPARENT"], seen["TRACESTATE"], seen["BAGGAGE"]) == (TRACEPARENT, "vendor=abc", "k=v")
    assert SECRET not in log.read_text()


def test_without_an_event_log_the_summary_is_as_before(tmp_path: Path, out_dir: Path) -> None:
    summary_file = tmp_path / "run.json"
    run = run_xlarun("--summary-file", summary_file, "--nproc-per-node", 1, DUMP_ENV, env={"DUMP_DIR": str(out_dir)})
    assert run.returncode == 0, run.stderr
    assert "events_dropped" not in json.loads(summary_file.read_text())


def test_a_restart_is_an_event_and_the_second_attempt_has_its_own(tmp_path: Path, out_dir: Path) -> None:
    log, summary_file = tmp_path / "ev.jsonl", tmp_path / "run.json"
    run = run_xlarun(
        "--event-log",
        log,
        "--summary-file",
        summary_file,
        "--max-restarts",
        1,
        "--nproc-per-node",
        2,
        FAIL_ATTEMPTS,
        out_dir,
        1,
    )
    assert run.returncode == 0, run.stderr
    log_events = events(log)
    restart = names(log_events).index("restart")
    assert log_events[restart]["attributes"] == {"restarts_left": 0, "admitting": False}
    before, after = log_events[:restart], log_events[restart + 1 :]
    assert {event["attempt"] for event in before[1:]} == {0} and {event["attempt"] for event in after} == {1}
    assert names(after) == [
        "rendezvous.started",
        "rendezvous.completed",
        "worker.started",
        "worker.started",
        "worker.exited",
        "worker.exited",
        "launch.finished",
    ]
    failed = [
        event["attributes"]
        for event in before
        if event["name"] == "worker.exited" and not event["attributes"]["expected"]
    ]
    assert [(attributes["rank"], attributes["process.exit.code"]) for attributes in failed] == [(0, 5)]
    exited = {
        (event["attempt"], event["attributes"]["rank"]): event["attributes"]["process.exit.code"]
        for event in log_events
        if event["name"] == "worker.exited"
    }
    assert exited == exit_codes(json.loads(summary_file.read_text()))


def fifo_nobody_reads(tmp_path: Path) -> Path:
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where", ["/dev/full", "fifo"])
def test_a_log_that_takes_nothing_costs_events_not_the_run(tmp_path: Path, out_dir: Path, where: str) -> None:
    if where == "/dev/full" and not os.path.exists(where):
        pytest.skip("no /dev/full")
    log = fifo_nobody_reads(tmp_path) if where == "fifo" else Path(where)
    plain_summary, summary_file = tmp_path / "plain.json", tmp_path / "run.json"
    args = ("--max-restarts", 1, "--nproc-per-node", 2, FAIL_ATTEMPTS)
    (out_dir / "plain").mkdir()
    (out_dir / "logged").mkdir()
    started = time.monotonic()
    plain = run_xlarun("--summary-file", plain_summary, *args, out_dir / "plain", 1)
    plain_took = time.monotonic() - started
    started = time.monotonic()
    run = run_xlarun("--event-log", log, "--summary-file", summary_file, *args, out_dir / "logged", 1)
    took = time.monotonic() - started

    assert run.returncode == plain.returncode == 0, run.stderr
    summary, plain_record = json.loads(summary_file.read_text()), json.loads(plain_summary.read_text())
    assert summary.pop("events_dropped") > 0
    assert (summary["result"], summary["exit_code"], summary["restarts"]) == (
        plain_record["result"],
        plain_record["exit_code"],
        plain_record["restarts"],
    )
    assert exit_codes(summary) == exit_codes(plain_record)
    [said] = [line for line in run.stderr.splitlines() if "dropped" in line]
    assert said.startswith(f"xlarun: the event log {log}: ") and " events dropped (" in said, run.stderr
    assert took < plain_took + slack_s(10), f"{took:.1f} s, {plain_took:.1f} s without the log"
    if where == "fifo":
        assert stat.S_ISFIFO(os.stat(log).st_mode)  # still the FIFO: nothing replaced it with a file


def test_a_lost_node_is_an_event_on_node_0_within_the_heartbeat_timeout(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int
) -> None:
    logs = [tmp_path / "node0.jsonl", tmp_path / "node1.jsonl"]
    agents = []
    for node_rank in (0, 1):
        agents.append(
            nodes.start(
                *static(port, node_rank, 2, 1),
                "--rdzv_conf",
                "heartbeat_timeout=3",
                "--event-log",
                logs[node_rank],
                LOOP,
                out_dir,
            )
        )
        wait_for(lambda: listeners(port), f"the store to listen on port {port}")
    nodes.wait_for_records(2)
    survivor, victim = agents
    victims = [victim.pid, *(child.pid for child in psutil.Process(victim.pid).children(recursive=True))]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed = time.time()
    run = finish(survivor)
    victim.communicate()

    assert run.returncode == 1, run.stderr
    node0 = events(logs[0])
    [lost] = [event for event in node0 if event["name"] == "node.lost"]
    assert lost["node_rank"] == 0 and lost["attributes"]["node_rank"] == 1, lost
    assert datetime.fromisoformat(lost["time"]).timestamp() - killed < 3 + slack_s(2), lost
    finished = node0[-1]
    assert finished["name"] == "launch.finished"
    assert finished["attributes"]["root_cause"]["reason"] == "node_lost"
    assert finished["attributes"]["root_cause"]["node_rank"] == 1
    # Node 1 wrote its own events, as node 1, up to its end: whole lines only.
    node1 = events(logs[1])
    assert node1 and {event["node_rank"] for event in node1} == {1}


def test_the_dry_run_names_the_files_the_run_would_write(tmp_path: Path) -> None:
    log, summary_file = tmp_path / "ev.jsonl", tmp_path / "run.json"
    metrics = tmp_path / "xlarun.prom"
    document = plan(
        "--event-log",
        log,
        "--summary-file",
        summary_file,
        "--metrics-textfile",
        metrics,
        "--nproc-per-node",
        1,
        DUMP_ENV,
    )
    assert document["files"] == {
        "event_log": str(log),
        "summary_file": str(summary_file),
        "metrics_textfile": str(metrics),
        "compile_cache": None,
    }
    assert not log.exists() and not metrics.exists()
    assert plan("--nproc-per-node", 1, DUMP_ENV)["files"]["event_log"] is None
