"""``--max-restarts``: the whole group restarts with a higher TORCHELASTIC_RESTART_COUNT and a new attempt dir."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_xlarun, worker


def attempts_seen(out_dir: Path, rank: int) -> list[int]:
    return [int(line) for line in (out_dir / f"{rank}.attempts").read_text().split()]


def test_group_restarts_until_it_succeeds(tmp_path: Path, out_dir: Path, port: int) -> None:
    log_dir = tmp_path / "logs"
    summary_file = tmp_path / "summary.json"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--max-restarts",
        "2",
        "--log-dir",
        log_dir,
        "-r",
        "1",
        "--summary-file",
        summary_file,
        worker("fail_attempts.py"),
        out_dir,
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert attempts_seen(out_dir, 0) == attempts_seen(out_dir, 1) == [0, 1, 2]
    [run_dir] = log_dir.iterdir()
    assert sorted(path.name for path in run_dir.iterdir()) == ["attempt_0", "attempt_1", "attempt_2"]
    for attempt in range(3):
        for rank in (0, 1):
            stdout = (run_dir / f"attempt_{attempt}" / str(rank) / "stdout.log").read_text()
            assert stdout == f"rank {rank} attempt {attempt}\n"
    restart_lines = [line for line in result.stderr.splitlines() if "restart" in line]
    assert len(restart_lines) == 2
    for number, line in enumerate(restart_lines, start=1):
        assert f"attempt {number - 1} failed" in line and "exited with code 5" in line
        assert f"restart {number} of 2" in line
    summary = json.loads(summary_file.read_text())
    assert (summary["result"], summary["restarts"], len(summary["attempts"])) == ("succeeded", 2, 3)


def test_out_of_restarts_fails_with_the_last_attempts_root_cause(out_dir: Path, port: int) -> None:
    result = run_xlarun(
        "--nproc_per_node", "2", "--master_port", port, "--max_restarts", "1", worker("fail_attempts.py"), out_dir, "5"
    )
    assert result.returncode == 5
    assert attempts_seen(out_dir, 0) == attempts_seen(out_dir, 1) == [0, 1]
    assert len([line for line in result.stderr.splitlines() if "restarting the worker group" in line]) == 1
    assert "Root Cause (first observed failure):" in result.stderr
    assert "exitcode  : 5" in result.stderr


def test_without_restarts_a_failure_is_final(out_dir: Path, port: int) -> None:
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("fail_attempts.py"), out_dir, "1")
    assert result.returncode == 5
    assert attempts_seen(out_dir, 0) == [0]
    assert "restart" not in result.stderr
