"""Signals: stop signals are forwarded as themselves then the group is torn down; SIGUSR1/2 are relayed.

Workers record every signal they receive (``signal_recorder.py``), so each test asserts
what reached them, and the ``--summary-file`` tells how each one ended.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import finish, is_alive, read_pid, run_xlarun, start_signal_recorders, wait_for, worker
from helpers import recorded_signals as recorded


def start_recorders(
    out_dir: Path, port: int, launcher_flags: Sequence[str] = (), worker_flags: Sequence[str] = ()
) -> subprocess.Popen:
    return start_signal_recorders(out_dir, ["--master_port", port, *launcher_flags], worker_flags)


@pytest.mark.parametrize(
    "number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=lambda number: number.name
)
def test_stop_signal_is_forwarded_as_itself_then_teardown(
    tmp_path: Path, out_dir: Path, port: int, number: signal.Signals
) -> None:
    summary_file = tmp_path / "summary.json"
    launcher = start_recorders(out_dir, port, ["--summary-file", str(summary_file)])
    launcher.send_signal(number)
    result = finish(launcher)
    assert result.returncode == 128 + number
    assert recorded(out_dir, 0) == recorded(out_dir, 1) == [number.name]
    summary = json.loads(summary_file.read_text())
    assert summary["launcher_signal"] == number.name
    assert [w["signal"] for w in summary["attempts"][0]["workers"]] == [number.name, number.name]
    assert f"received {number.name}" in result.stderr
    assert "FAILED" not in result.stderr


def test_sigusr1_and_sigusr2_reach_every_worker_and_the_run_goes_on(out_dir: Path, port: int) -> None:
    launcher = start_recorders(out_dir, port)
    launcher.send_signal(signal.SIGUSR1)
    launcher.send_signal(signal.SIGUSR2)
    wait_for(lambda: all(len(recorded(out_dir, rank)) == 2 for rank in (0, 1)), "both signals at both workers")
    assert launcher.poll() is None, "the launcher stopped"
    (out_dir / "finish").write_text("")
    result = finish(launcher)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert sorted(recorded(out_dir, rank)) == ["SIGUSR1", "SIGUSR2"]


def test_worker_ignoring_sigterm_is_killed_after_the_kill_timeout(tmp_path: Path, out_dir: Path, port: int) -> None:
    summary_file = tmp_path / "summary.json"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--kill-timeout",
        "1",
        "--summary-file",
        summary_file,
        worker("signal_recorder.py"),
        out_dir,
        "--ignore-term",
        "--fail-rank",
        "1",
        "--code",
        "3",
    )
    assert result.returncode == 3, result.stderr
    assert recorded(out_dir, 0) == ["SIGTERM"]
    workers = json.loads(summary_file.read_text())["attempts"][0]["workers"]
    assert (workers[0]["signal"], workers[1]["exitcode"]) == ("SIGKILL", 3)


def test_second_stop_signal_skips_the_grace_period(tmp_path: Path, out_dir: Path, port: int) -> None:
    """With a grace far beyond the test's safety net, only a skipped grace lets the launcher end."""
    launcher = start_recorders(out_dir, port, ["--kill-timeout", "3600"], ["--ignore-term"])
    launcher.send_signal(signal.SIGTERM)
    wait_for(lambda: recorded(out_dir, 0) and recorded(out_dir, 1), "workers to get SIGTERM")
    launcher.send_signal(signal.SIGTERM)
    result = finish(launcher)
    assert result.returncode == 128 + signal.SIGTERM
    assert not any(is_alive(read_pid(out_dir / f"{rank}.ready")) for rank in (0, 1))


def test_a_crash_stops_peers_with_sigterm(tmp_path: Path, out_dir: Path, port: int) -> None:
    """The peers of a failed worker are stopped by the launcher (SIGTERM), not left to finish."""
    summary_file = tmp_path / "summary.json"
    result = run_xlarun(
        "--nproc_per_node",
        "3",
        "--master_port",
        port,
        "--summary-file",
        summary_file,
        worker("signal_recorder.py"),
        out_dir,
        "--fail-rank",
        "2",
        "--code",
        "4",
    )
    assert result.returncode == 4
    assert recorded(out_dir, 0) == recorded(out_dir, 1) == ["SIGTERM"]
    assert recorded(out_dir, 2) == []
    workers = json.loads(summary_file.read_text())["attempts"][0]["workers"]
    assert [(w["exitcode"], w["signal"]) for w in workers] == [(None, "SIGTERM"), (None, "SIGTERM"), (4, None)]


@pytest.mark.parametrize("name", ["SIGCHLD", "SIGCONT"])
def test_a_signal_the_launcher_gets_itself_is_refused(tmp_path: Path, port: int, name: str) -> None:
    """Handled as a stop signal, SIGCHLD would end every run at its first worker's exit (exit 145),
    SIGCONT every run continued after Ctrl-Z: refused in one line, nothing started."""
    marker = tmp_path / "started"
    result = run_xlarun("--signals-to-handle", f"SIGTERM,{name}", "--master_port", port, worker("marker.py"), marker)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"{name} cannot be handled" in result.stderr, result.stderr
    assert not marker.exists()
