"""Preemption and maintenance notices: the metadata server (tests/metadata.py, long polls and all) says the
VM stops or moves, and the launcher says so in one line, records a ``preemption`` event, sends
``--preemption-signal`` to every worker, and ends ``preempted``; with no metadata server it watches nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from helpers import (
    PYTHON,
    Run,
    clean_env,
    files_exist,
    recorded_signals,
    start_signal_recorders,
    wait_for,
    worker,
)
from metadata import Served, serve_metadata

NOTICE_LINE = "xlarun: the metadata server's instance/"


class Lines:
    """A started launcher's stderr, each line with the time it was read."""

    def __init__(self, launcher: subprocess.Popen) -> None:
        self.launcher = launcher
        self.read: list[tuple[float, str]] = []
        assert launcher.stderr is not None
        self._thread = threading.Thread(target=self._read, args=(launcher.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.read.append((time.time(), line))

    def when(self, start: str) -> float | None:
        return next((at for at, line in self.read if line.startswith(start)), None)

    def finish(self) -> Run:
        try:
            self.launcher.wait(timeout=120)
        finally:
            self.launcher.kill()
        self._thread.join(10)
        assert self.launcher.stdout is not None
        return Run(self.launcher.returncode, self.launcher.stdout.read(), "".join(line for _, line in self.read))


def long_polls_waiting(served: Served) -> bool:
    """Both values are read and long-polled: a change now answers a poll that waits for it."""
    paths = [path for path, _ in served.requests]
    return all(
        any(f"{name}?wait_for_change=true" in path for path in paths) for name in ("preempted", "maintenance-event")
    )


def start_under(served: Served, out_dir: Path, port: int, *flags: object) -> tuple[Lines, Path, Path]:
    events, summary = out_dir / "events.jsonl", out_dir / "run.json"
    launcher = start_signal_recorders(
        out_dir,
        ["--master-port", port, "--event-log", events, "--summary-file", summary, *flags],
        env={"GCE_METADATA_HOST": served.host},
    )
    lines = Lines(launcher)
    wait_for(lambda: long_polls_waiting(served), "the launcher's long polls of the metadata server")
    return lines, events, summary


def preemption_events(events: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    return [record for record in records if record["name"] == "preemption"]


def event_time(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()


def test_a_preemption_notice_is_a_line_an_event_and_the_signal_and_the_run_ends_preempted(
    out_dir: Path, port: int
) -> None:
    with serve_metadata({}) as served:
        lines, events, summary = start_under(served, out_dir, port, "--preemption-signal", "SIGUSR1")
        noticed = time.time()
        served.instance.change("preempted", "TRUE")
        wait_for(
            lambda: recorded_signals(out_dir, 0) == ["SIGUSR1"] and recorded_signals(out_dir, 1) == ["SIGUSR1"],
            "both workers to receive SIGUSR1",
        )
        signalled = max(os.stat(out_dir / f"{rank}.signals").st_mtime for rank in (0, 1))
        wait_for(lambda: lines.when(NOTICE_LINE) and preemption_events(events), "the line and the event")
        # What follows a preemption: the VM's shutdown sends SIGTERM.
        lines.launcher.send_signal(signal.SIGTERM)
        run = lines.finish()
    assert run.returncode == 143, run.stderr
    said = [line for _, line in lines.read if line.startswith(NOTICE_LINE)]
    assert said == [
        "xlarun: the metadata server's instance/preempted is TRUE: this VM is preempted and stops in about 30 s; "
        "sent SIGUSR1 to every worker\n"
    ]
    (event,) = preemption_events(events)
    assert event["attributes"] == {"notice": "instance/preempted", "value": "TRUE", "stops": True, "signal": "SIGUSR1"}
    record = json.loads(summary.read_text())
    assert (record["result"], record["exit_code"], record["launcher_signal"]) == ("preempted", 143, "SIGTERM")
    assert [recorded_signals(out_dir, rank) for rank in (0, 1)] == [["SIGUSR1", "SIGTERM"]] * 2
    line_at = lines.when(NOTICE_LINE)
    assert line_at is not None
    print(
        f"\nfrom the notice: the line {line_at - noticed:.3f} s, the event {event_time(event) - noticed:.3f} s, "
        f"the signal {signalled - noticed:.3f} s (the later worker's file)"
    )


def test_host_maintenance_without_a_signal_asked_for_sends_none(out_dir: Path, port: int) -> None:
    with serve_metadata({}) as served:
        lines, events, summary = start_under(served, out_dir, port)
        served.instance.change("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        wait_for(lambda: preemption_events(events), "the event")
        lines.launcher.send_signal(signal.SIGTERM)
        run = lines.finish()
    assert run.returncode == 143, run.stderr
    assert (
        "xlarun: the metadata server's instance/maintenance-event is TERMINATE_ON_HOST_MAINTENANCE: this VM stops "
        "for host maintenance in about 60 s\n" in run.stderr
    )
    assert preemption_events(events)[0]["attributes"]["signal"] is None
    assert [recorded_signals(out_dir, rank) for rank in (0, 1)] == [["SIGTERM"]] * 2
    assert json.loads(summary.read_text())["result"] == "preempted"


def test_a_live_migration_is_a_line_and_an_event_and_the_run_goes_on(out_dir: Path, port: int) -> None:
    with serve_metadata({}) as served:
        lines, events, summary = start_under(served, out_dir, port, "--preemption-signal", "SIGUSR1")
        served.instance.change("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        wait_for(lambda: preemption_events(events), "the event")
        (out_dir / "finish").write_text("")
        run = lines.finish()
    assert run.returncode == 0, run.stderr
    assert (
        "xlarun: the metadata server's instance/maintenance-event is MIGRATE_ON_HOST_MAINTENANCE: this VM is "
        "live-migrated for host maintenance in about 60 s; the run goes on\n" in run.stderr
    )
    assert preemption_events(events)[0]["attributes"]["stops"] is False
    assert [recorded_signals(out_dir, rank) for rank in (0, 1)] == [[], []]
    assert json.loads(summary.read_text())["result"] == "succeeded"


def test_a_metadata_server_that_never_ends_its_answer_holds_nothing_up(out_dir: Path, port: int) -> None:
    events, summary = out_dir / "events.jsonl", out_dir / "run.json"
    with serve_metadata({}, behaviour="endless") as served:
        launcher = start_signal_recorders(
            out_dir,
            ["--master-port", port, "--event-log", events, "--summary-file", summary],
            env={"GCE_METADATA_HOST": served.host},
        )
        lines = Lines(launcher)
        wait_for(lambda: len(served.requests) >= 2, "the launcher to ask the metadata server")
        (out_dir / "finish").write_text("")
        run = lines.finish()
    assert run.returncode == 0, run.stderr
    assert NOTICE_LINE not in run.stderr and preemption_events(events) == []
    assert json.loads(summary.read_text())["result"] == "succeeded"


def test_without_a_metadata_server_nothing_is_watched_or_loaded(out_dir: Path, port: int) -> None:
    (out_dir / "finish").write_text("")
    completed = subprocess.run(
        [PYTHON, "-X", "importtime", "-m", "xlarun", "--nproc_per_node", "2", "--master_port", str(port)]
        + ["--preemption-signal", "SIGUSR1", worker("signal_recorder.py"), str(out_dir)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=out_dir,
    )
    assert completed.returncode == 0, completed.stderr
    imported = [line.rsplit("|", 1)[1].strip() for line in completed.stderr.splitlines() if "|" in line]
    assert "xlarun.supervision.agent" in imported and "xlarun.host.metadata" not in imported
    assert files_exist(out_dir / "0.ready", out_dir / "1.ready")()
