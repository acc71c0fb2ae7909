"""No process a launch started outlives it: grandchildren, exited workers' children, a killed launcher."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import files_exist, finish, is_alive, kill_all, read_pid, run_xlarun, start_xlarun, wait_for, worker


def pids(out_dir: Path, suffix: str) -> list[int]:
    return [read_pid(out_dir / f"{rank}.{suffix}") for rank in (0, 1)]


@pytest.mark.parametrize("mode, exit_code", [("exit-then-fail", 1), ("exit", 0)], ids=["failure", "success"])
def test_grandchildren_of_exited_workers_are_torn_down(out_dir: Path, port: int, mode: str, exit_code: int) -> None:
    """Workers exit leaving a child each (on failure: rank 0 exits 0, then rank 1 fails): no grandchild survives xlarun."""
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("grandchild.py"), out_dir, mode)
    grandchildren = pids(out_dir, "grandchild")
    try:
        assert result.returncode == exit_code, result.stderr
        assert [pid for pid in grandchildren if is_alive(pid)] == []
    finally:
        kill_all(grandchildren)


def test_grandchildren_are_torn_down_when_the_launcher_is_stopped(out_dir: Path, port: int) -> None:
    launcher = start_xlarun("--nproc_per_node", "2", "--master_port", port, worker("grandchild.py"), out_dir, "wait")
    wait_for(files_exist(*(out_dir / f"{rank}.ready" for rank in (0, 1))), "workers and their children")
    launched = pids(out_dir, "ready") + pids(out_dir, "grandchild")
    try:
        launcher.send_signal(signal.SIGTERM)
        assert finish(launcher).returncode == 128 + signal.SIGTERM
        assert [pid for pid in launched if is_alive(pid)] == []
    finally:
        kill_all(launched)


def test_launcher_killed_with_sigkill_leaves_nothing_running(out_dir: Path, port: int) -> None:
    """torchrun orphans its workers here; xlarun's guard kills every group it started."""
    launcher = start_xlarun("--nproc_per_node", "2", "--master_port", port, worker("grandchild.py"), out_dir, "wait")
    wait_for(files_exist(*(out_dir / f"{rank}.ready" for rank in (0, 1))), "workers and their children")
    launched = pids(out_dir, "ready") + pids(out_dir, "grandchild")
    try:
        assert all(is_alive(pid) for pid in launched)
        launcher.kill()
        assert finish(launcher).returncode == -signal.SIGKILL
        # The guard acts once it sees the launcher gone; the deadline is only a safety net.
        wait_for(lambda: not any(is_alive(pid) for pid in launched), "every worker and grandchild to die")
    finally:
        kill_all(launched)
