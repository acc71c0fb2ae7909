"""The launcher's exit code: 0, the root cause's own code, 128+N for signals, 2 for usage, 1 for itself."""

from __future__ import annotations

import signal
from pathlib import Path

from helpers import files_exist, finish, run_xlarun, start_xlarun, wait_for, worker


def test_success_exits_0(out_dir: Path, port: int) -> None:
    (out_dir / "finish").write_text("")
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("signal_recorder.py"), out_dir)
    assert result.returncode == 0, result.stderr
    assert "FAILED" not in result.stderr
    assert (out_dir / "0.ready").exists() and (out_dir / "1.ready").exists()


def test_worker_exit_code_passes_through(out_dir: Path, port: int) -> None:
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        worker("signal_recorder.py"),
        out_dir,
        "--fail-rank",
        "1",
        "--code",
        "3",
    )
    assert result.returncode == 3, result.stderr


def test_worker_killed_by_sigkill_exits_137(port: int) -> None:
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("chatter.py"), "1", "--crash-rank", "1")
    assert result.returncode == 128 + signal.SIGKILL, result.stderr


def test_launcher_given_sigterm_exits_143(out_dir: Path, port: int) -> None:
    launcher = start_xlarun("--nproc_per_node", "2", "--master_port", port, worker("signal_recorder.py"), out_dir)
    wait_for(files_exist(out_dir / "0.ready", out_dir / "1.ready"), "workers to start")
    launcher.send_signal(signal.SIGTERM)
    assert finish(launcher).returncode == 128 + signal.SIGTERM


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    result = run_xlarun("--nproc_per_node", "none", worker("marker.py"), tmp_path / "marker")
    assert result.returncode == 2


def test_worker_that_cannot_be_started_is_a_launcher_failure(tmp_path: Path, port: int) -> None:
    """The command exists but the kernel cannot run it: one line, exit 1, no traceback."""
    program = tmp_path / "no_interpreter"
    program.write_text("#!/nonexistent/interpreter\n")
    program.chmod(0o755)
    result = run_xlarun("--no-python", "--master_port", port, program)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"xlarun: workers stopped: cannot start local rank 0: {program}: No such file or directory"
    ]
