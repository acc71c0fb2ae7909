"""The launcher keeps its promises when the world around it fails.

No worker outlives the launcher, it exits with the root cause's code, and the summary file is
written, whatever goes wrong around it: a reader of its output that stops, a stderr that is
closed or broken, a full disk under ``--tee``, a descriptor limit too low to start the
workers, Ctrl-Z. Each test starts a real launcher with real workers
(``tests/workers/faults.py``, which record their pids) and checks all three.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import (
    RUN_TIMEOUT_S,
    XLARUN,
    clean_env,
    free_port,
    is_alive,
    kill_all,
    pipe_is_full,
    slack_s,
    wait_for,
    worker,
)

from xlarun.console import FLUSH_PATIENCE_S

GRACE_S = 2


def faults(out_dir: Path, *actions: str) -> list[str]:
    return [worker("faults.py"), str(out_dir), *actions]


def launch(out_dir: Path, *actions: str, extra: tuple[str, ...] = (), **popen: object) -> subprocess.Popen:
    command = [
        *XLARUN,
        "--nproc_per_node",
        str(len(actions)),
        "--master_port",
        str(free_port()),
        "--kill-timeout",
        str(GRACE_S),
        "--summary-file",
        str(out_dir / "summary.json"),
        *extra,
        *faults(out_dir, *actions),
    ]
    options: dict = {
        "env": clean_env(),
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        **popen,
    }
    return subprocess.Popen(command, **options)


def worker_pids(out_dir: Path) -> list[int]:
    return [int(path.read_text()) for path in sorted(out_dir.glob("*.pid"))]


def summary(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


@pytest.fixture
def out_dir(tmp_path: Path) -> Iterator[Path]:
    """The workers' pid records; whatever they name is killed at teardown."""
    directory = tmp_path / "out"
    directory.mkdir()
    yield directory
    kill_all(worker_pids(directory))


def none_alive(out_dir: Path) -> Callable[[], bool]:
    return lambda: not any(is_alive(pid) for pid in worker_pids(out_dir))


def test_a_reader_that_stops_does_not_stop_supervision(out_dir: Path) -> None:
    # Nobody reads the launcher's stderr or stdout: rank 0 fills them, rank 1 fails at 1 s.
    read_err, write_err = os.pipe()
    read_out, write_out = os.pipe()
    try:
        started = time.monotonic()
        launcher = launch(out_dir, "flood:8", "exit:7:1", stdout=write_out, stderr=write_err)
        os.close(write_err)
        os.close(write_out)
        wait_for(lambda: len(worker_pids(out_dir)) == 2, "the workers to start")
        wait_for(none_alive(out_dir), "every worker to end")
        workers_gone = time.monotonic() - started
        code = launcher.wait(timeout=RUN_TIMEOUT_S)
    finally:
        os.close(read_err)
        os.close(read_out)
    # The report waits for a reader that never comes, FLUSH_PATIENCE_S at the most.
    assert workers_gone < 1 + GRACE_S + slack_s(3)
    assert code == 7
    record = summary(out_dir)
    assert record["result"] == "failed" and record["root_cause"]["rank"] == 1 and record["exit_code"] == 7
    assert time.monotonic() - started < 1 + GRACE_S + FLUSH_PATIENCE_S + slack_s(5)


def test_sigterm_is_honoured_while_nobody_reads_the_output(out_dir: Path) -> None:
    read_err, write_err = os.pipe()
    try:
        launcher = launch(out_dir, "flood:8", "sleep", stdout=subprocess.DEVNULL, stderr=write_err)
        os.close(write_err)
        wait_for(lambda: len(worker_pids(out_dir)) == 2, "the workers to start")
        wait_for(pipe_is_full(read_err), "rank 0's lines to fill the launcher's stderr")
        launcher.send_signal(signal.SIGTERM)
        wait_for(none_alive(out_dir), "every worker to end")
        code = launcher.wait(timeout=RUN_TIMEOUT_S)
    finally:
        os.close(read_err)
    assert code == 128 + signal.SIGTERM
    assert summary(out_dir)["result"] == "signalled"


def closed_stderr() -> None:
    os.close(2)


@pytest.mark.parametrize("stderr", ["closed", "broken"])
def test_a_closed_or_broken_stderr_changes_neither_the_code_nor_the_summary(out_dir: Path, stderr: str) -> None:
    if stderr == "closed":  # 2>&-
        launcher = launch(out_dir, "sleep", "exit:3:0.5", "sleep", stderr=None, preexec_fn=closed_stderr)
    else:  # 2>&1 | head -1, once head has gone
        read_end, write_end = os.pipe()
        os.close(read_end)
        launcher = launch(out_dir, "sleep", "exit:3:0.5", "sleep", stderr=write_end)
        os.close(write_end)
    assert launcher.wait(timeout=RUN_TIMEOUT_S) == 3
    assert none_alive(out_dir)()
    record = summary(out_dir)
    assert (record["result"], record["exit_code"], record["root_cause"]["rank"]) == ("failed", 3, 1)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``small_disk("size=256k")``: a tmpfs of that size (or inode count) mounted for the test."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], capture_output=True)
        if done.returncode != 0:
            (pytest.fail if os.environ.get("CI") else pytest.skip)(f"cannot mount a small tmpfs: {done.stderr!r}")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_under_tee_costs_the_file_not_the_run(out_dir: Path, small_disk: Callable[[str], Path]) -> None:
    disk = small_disk("size=256k")
    launcher = launch(out_dir, "lines:2000", extra=("--tee", "3", "--log-dir", str(disk)))
    stdout, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    assert launcher.returncode == 0, stderr
    notices = [line for line in stderr.decode().splitlines() if "No space left on device" in line]
    assert len(notices) == 1 and notices[0].startswith("xlarun: cannot write ") and "the run go on" in notices[0]
    # The console still got every line, each behind its prefix.
    assert stdout.decode().count("[default0]:") == 2000
    assert summary(out_dir)["result"] == "succeeded"
    assert none_alive(out_dir)()


def test_a_log_dir_out_of_inodes_at_a_restart_is_one_line(out_dir: Path, small_disk: Callable[[str], Path]) -> None:
    # Room for the first attempt's directories and files, not for the restart's.
    disk = small_disk("nr_inodes=5")
    launcher = launch(out_dir, "exit:3:0", extra=("--max-restarts", "1", "--log-dir", str(disk)))
    _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    assert launcher.returncode == 1, stderr
    assert stderr.decode().splitlines()[-1].startswith("xlarun: cannot make the log directory of attempt 1 in ")
    record = summary(out_dir)
    assert record["result"] == "launcher_error" and "No space left on device" in record["error"]
    assert none_alive(out_dir)()


def test_a_start_the_launcher_cannot_make_is_its_own_error(out_dir: Path) -> None:
    # Enough descriptors for the launcher to start, not for 24 workers' pipes and pidfds.
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    launcher = launch(out_dir, *["sleep"] * 24, preexec_fn=low_limit)
    _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    assert launcher.returncode == 1, stderr
    record = summary(out_dir)
    assert record["result"] == "launcher_error" and record["root_cause"] is None
    assert "the launcher ran out of file descriptors" in record["error"] and "limit is 48" in record["error"]
    assert none_alive(out_dir)()


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_suspends_the_workers_with_the_launcher(out_dir: Path) -> None:
    launcher = launch(out_dir, "exit:0:3", "exit:0:3")
    try:
        wait_for(lambda: len(worker_pids(out_dir)) == 2, "the workers to start")
        launcher.send_signal(signal.SIGTSTP)
        wait_for(
            lambda: all(process_state(pid) == "T" for pid in [launcher.pid, *worker_pids(out_dir)]),
            "the launcher and its workers to stop",
        )
        time.sleep(4)  # longer than the workers would have run
        assert all(process_state(pid) == "T" for pid in worker_pids(out_dir))
        launcher.send_signal(signal.SIGCONT)
        assert launcher.wait(timeout=RUN_TIMEOUT_S) == 0
    finally:
        kill_all([launcher.pid])
    assert summary(out_dir)["result"] == "succeeded"


def test_a_progress_bar_passes_through_the_tee_as_it_is_drawn(out_dir: Path) -> None:
    launcher = launch(out_dir, "progress:10", extra=("--tee", "1"))
    assert launcher.stdout is not None
    os.set_blocking(launcher.stdout.fileno(), False)
    seen = b""
    # Long before the bar ends its line (2 s), its steps are on the console behind the prefix.
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while b"\r[default0]: 30%" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
        seen += launcher.stdout.read() or b""
    assert launcher.poll() is None, "the bar was shown only at the end of the run"
    stdout, _ = launcher.communicate(timeout=RUN_TIMEOUT_S)
    drawn = (seen + stdout).decode()
    assert drawn.startswith("[default0]:  0%|\r[default0]: 10%|#\r")
    assert drawn.endswith("[default0]:100%|##########\n")
