"""Runs you can leave: ``xlarun --detach`` and the verbs that find a run again, with real launchers.

Every test records its runs in a state directory of its own (``XLARUN_STATE_DIR``); at teardown
every launcher that directory records as running is killed, which its orphan guard answers by
killing the workers, so no test leaves a run behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import XLARUN, clean_env, is_alive, read_pid, run_xlarun, start_xlarun, wait_for, worker

from xlarun.jobs.records import JobStore, LauncherProcess

RELEASED = worker("until_released.py")
STEPPING = worker("stepping.py")


@pytest.fixture
def state(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a test's xlarun commands: a state directory of its own."""
    root = tmp_path / "state"
    yield {"XLARUN_STATE_DIR": str(root)}
    for run in root.glob("runs/*/launcher.json"):
        recorded = json.loads(run.read_text())
        launcher = LauncherProcess(recorded["pid"], recorded["start_ticks"], recorded["boot_id"])
        if launcher.alive():
            os.kill(launcher.pid, signal.SIGKILL)


def detach(state: dict[str, str], *args: object) -> str:
    """Start a detached run; its id."""
    result = run_xlarun("--detach", *args, env=state)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def jobs(state: dict[str, str]) -> list[dict[str, Any]]:
    result = run_xlarun("--jobs", "--json", env=state)
    assert result.returncode == 0, result.stderr
    listed: list[dict[str, Any]] = json.loads(result.stdout)
    return listed


def job(state: dict[str, str], job_id: str) -> dict[str, Any]:
    return next(entry for entry in jobs(state) if entry["id"] == job_id)


def started_workers(out_dir: Path, count: int) -> list[int]:
    paths = [out_dir / f"pid_{rank}" for rank in range(count)]
    wait_for(lambda: all(path.exists() for path in paths), "the workers' pid files")
    return [read_pid(path) for path in paths]


def test_a_detached_run_outlives_its_callers_session_and_wait_gives_its_exit_code(
    state: dict[str, str], out_dir: Path
) -> None:
    # The caller runs in a shell of a session of its own, which then hangs up, as a closed terminal does.
    command = [*XLARUN, "--detach", "--nproc-per-node", "2", RELEASED, str(out_dir), "3"]
    shell = subprocess.Popen(
        ["bash", "-c", 'printf "%s\\n" "$("$@")"; exec sleep 600', "bash", *command],
        env=clean_env(state),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert shell.stdout is not None
        job_id = shell.stdout.readline().strip()  # the command substitution ended: the caller closed its streams
        assert re.fullmatch(r"[0-9a-f]{12}", job_id), job_id
        pids = started_workers(out_dir, 2)
        os.killpg(shell.pid, signal.SIGHUP)
        assert shell.wait(timeout=60) == -signal.SIGHUP
    finally:
        shell.kill()
        shell.wait()
    assert all(is_alive(pid) for pid in pids)
    assert job(state, job_id)["state"] == "running"
    (out_dir / "release").touch()
    assert run_xlarun("--wait", job_id, env=state).returncode == 3
    ended = job(state, job_id)
    assert (ended["state"], ended["exit_code"]) == ("failed", 3)
    assert ended["command"][0] == "xlarun" and ended["command"][-3:] == [RELEASED, str(out_dir), "3"]
    # A run that ended answers at once.
    assert run_xlarun("--wait", job_id[:6], env=state).returncode == 3


def test_its_console_keeps_every_workers_line_whole_and_follow_exits_with_the_runs_code(
    state: dict[str, str],
) -> None:
    job_id = detach(state, "--nproc-per-node", "2", worker("chatter.py"), "300")
    followed = run_xlarun("--logs", job_id, "--follow", env=state)
    assert followed.returncode == 0, followed.stderr
    lines = [line for line in followed.stdout.splitlines() if not line.startswith("xlarun: ")]
    assert len(lines) == 2 * 2 * 300
    assert all(re.fullmatch(r"r[01] (out|err) \d+ x*", line) for line in lines), [
        line for line in lines if not re.fullmatch(r"r[01] (out|err) \d+ x*", line)
    ][:3]
    assert run_xlarun("--logs", job_id, env=state).stdout == followed.stdout


def test_stop_ends_the_run_and_returns_once_its_workers_are_gone(state: dict[str, str], out_dir: Path) -> None:
    job_id = detach(state, "--nproc-per-node", "2", RELEASED, str(out_dir), "0")
    pids = started_workers(out_dir, 2)
    stopped = run_xlarun("--stop", job_id[:5], env=state)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(is_alive(pid) for pid in pids)
    ended = job(state, job_id)
    assert (ended["state"], ended["exit_code"]) == ("signaled", 128 + signal.SIGTERM)
    assert "received SIGTERM" in run_xlarun("--logs", job_id, env=state).stdout


def test_a_killed_launcher_leaves_a_lost_run_and_no_worker(state: dict[str, str], out_dir: Path) -> None:
    job_id = detach(state, "--nproc-per-node", "2", RELEASED, str(out_dir), "0")
    pids = started_workers(out_dir, 2)
    os.kill(job(state, job_id)["pid"], signal.SIGKILL)
    wait_for(lambda: job(state, job_id)["state"] == "lost", "the run to show as lost")
    assert job(state, job_id)["exit_code"] is None
    wait_for(lambda: not any(is_alive(pid) for pid in pids), "the orphan guard to kill the workers")
    waited = run_xlarun("--wait", job_id, env=state)
    assert waited.returncode == 1
    assert "was lost" in waited.stderr


def test_status_shows_each_rank_of_a_running_run(state: dict[str, str], out_dir: Path) -> None:
    job_id = detach(state, "--nproc-per-node", "2", RELEASED, str(out_dir), "0")
    pids = started_workers(out_dir, 2)
    result = run_xlarun("--status", job_id, "--json", env=state)
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)
    assert [(rank["rank"], rank["pid"]) for rank in ranks] == [(0, pids[0]), (1, pids[1])]
    assert all(rank["rss_bytes"] > 0 and rank["state"] in ("sleeping", "running") for rank in ranks)
    table = run_xlarun("--status", job_id, env=state).stdout.splitlines()
    assert table[0].startswith(f"run {job_id}: running")
    assert [line.split()[:2] for line in table[2:]] == [["0", str(pids[0])], ["1", str(pids[1])]]
    (out_dir / "release").touch()
    assert run_xlarun("--wait", job_id, env=state).returncode == 0


@pytest.mark.torch_xla  # torch_xla's step log, which xlarun switches on where torch_xla is installed
def test_status_counts_each_ranks_steps_and_marks_a_straggler(state: dict[str, str], out_dir: Path) -> None:
    """Rank 1 steps ten times slower than ranks 0 and 2: its steps per second are below half the median."""
    job_id = detach(
        state, "--hang-timeout", "600", "--nproc-per-node", "3", STEPPING, str(out_dir), "0.05", "0.5", "0.05"
    )
    started_workers(out_dir, 3)

    def ranks_with_rates() -> list[dict[str, Any]] | None:
        ranks: list[dict[str, Any]] = json.loads(run_xlarun("--status", job_id, "--json", env=state).stdout)
        return ranks if len(ranks) == 3 and all(rank["steps_per_s"] for rank in ranks) else None

    wait_for(ranks_with_rates, "every rank's steps per second")  # each over two writes of its tally, a second apart
    ranks = ranks_with_rates()
    assert ranks is not None
    assert [rank["straggler"] for rank in ranks] == [False, True, False], ranks
    assert all(rank["steps"] > 0 for rank in ranks) and ranks[0]["steps"] > ranks[1]["steps"]
    table = run_xlarun("--status", job_id, env=state).stdout.splitlines()
    assert "STEPS/S" in table[1] and "(straggler)" in table[3] and "(straggler)" not in table[2] + table[4]
    (out_dir / "release").touch()
    assert run_xlarun("--wait", job_id, env=state).returncode == 0


def test_attach_leaves_the_run_going_on_ctrl_c(state: dict[str, str], out_dir: Path) -> None:
    job_id = detach(state, "--nproc-per-node", "1", RELEASED, str(out_dir), "0")
    started_workers(out_dir, 1)
    # Python's fault handler, to show where it stands if it outlives the SIGINT (SIGABRT dumps every thread's stack).
    attached = start_xlarun("--attach", job_id, env={**state, "PYTHONFAULTHANDLER": "1"})
    try:
        assert attached.stdout is not None
        assert attached.stdout.readline() == "r0 started\n"
        attached.send_signal(signal.SIGINT)
        try:
            code = attached.wait(timeout=60)
        except subprocess.TimeoutExpired:
            attached.send_signal(signal.SIGABRT)
            pytest.fail(f"--attach still ran 60 s after SIGINT; its stderr:\n{attached.communicate(timeout=30)[1]}")
        assert code == 0
    finally:
        attached.kill()
        attached.communicate()
    assert job(state, job_id)["state"] == "running"
    again = start_xlarun("--attach", job_id, env=state)
    (out_dir / "release").touch()
    stdout, _ = again.communicate(timeout=120)
    assert again.returncode == 0
    assert stdout.endswith("r0 released\n")


def test_bad_input_starts_and_records_nothing(state: dict[str, str], tmp_path: Path) -> None:
    refused = run_xlarun("--detach", "--nproc-per-node", "0", RELEASED, env=state)
    assert refused.returncode == 2
    assert len(refused.stderr.splitlines()) == 1 and refused.stdout == ""
    missing = run_xlarun("--detach", str(tmp_path / "no_such_script.py"), env=state)
    assert missing.returncode == 2, missing.stderr
    assert jobs(state) == []


def test_ids_by_prefix_unknown_and_ambiguous_ones_and_prune(state: dict[str, str], out_dir: Path) -> None:
    finished = detach(state, "--rdzv-id", "job-a", worker("marker.py"), str(out_dir / "a"))
    assert run_xlarun("--wait", "job-a", env=state).returncode == 0
    running = detach(state, "--rdzv-id", "job-b", RELEASED, str(out_dir), "0")
    assert (finished, running) == ("job-a", "job-b")
    ambiguous = run_xlarun("--status", "job-", env=state)
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr
    unknown = run_xlarun("--logs", "nothing", env=state)
    assert unknown.returncode == 2 and len(unknown.stderr.splitlines()) == 1
    # The running run keeps its id: a second run of that id is refused.
    again = run_xlarun("--detach", "--rdzv-id", "job-b", RELEASED, str(out_dir), "0", env=state)
    assert again.returncode == 2, again.stderr
    pruned = run_xlarun("--jobs", "--prune", "--json", env=state)
    assert [entry["id"] for entry in json.loads(pruned.stdout)] == ["job-b"]
    started_workers(out_dir, 1)
    (out_dir / "release").touch()
    assert run_xlarun("--wait", "job-b", env=state).returncode == 0


def test_a_damaged_record_costs_only_its_own_entry(state: dict[str, str], out_dir: Path) -> None:
    first = detach(state, worker("marker.py"), str(out_dir / "a"))
    second = detach(state, worker("marker.py"), str(out_dir / "b"))
    for job_id in (first, second):
        assert run_xlarun("--wait", job_id, env=state).returncode == 0
    (Path(state["XLARUN_STATE_DIR"]) / "runs" / first / "run.json").write_text('{"id": "')
    listed = run_xlarun("--jobs", env=state)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [second]
    assert first in listed.stderr and len(listed.stderr.splitlines()) == 1


def test_from_python(state: dict[str, str], out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import xlarun

    for name, value in clean_env(state).items():
        monkeypatch.setenv(name, value)
    started = xlarun.launch(RELEASED, str(out_dir), "5", nproc_per_node=2, detach=True)
    started_workers(out_dir, 2)
    found = xlarun.job(started.id[:4])
    assert found.id == started.id and found.status()["state"] == "running"
    assert [rank["rank"] for rank in found.status()["ranks"]] == [0, 1]
    (out_dir / "release").touch()
    with pytest.raises(xlarun.WorkerFailed) as failed:
        started.wait()
    assert failed.value.exit_code == 5 and failed.value.summary["result"] == "failed"
    assert failed.value.failures[0].returncode == 5 and "exited with code 5" in str(failed.value)
    assert "r0 started" in found.logs() and "r1 started" in found.logs()
    assert JobStore(state["XLARUN_STATE_DIR"]).find(started.id).state == "failed"
