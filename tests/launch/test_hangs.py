"""A run that hangs or dies explains itself: ``--hang-timeout``, ``xlarun --stacks``, memory and the OOM killer.

The workers are real gloo processes on 127.0.0.1 (``hang_rank.py``: one rank waits in
``stuck_in_data_loader`` while the others wait for it in an all-reduce), real CPU hogs, real
memory, a real memory cgroup and torch_xla's real CPU client.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import XLARUN, is_alive, run_command, run_xlarun, wait_for, worker
from multinode import Nodes, both, static

HANG = worker("hang_rank.py")
TIMEOUT = 3
# Found within the timeout, the check that the workers are idle and the stacks' dump: a few seconds more.
FOUND_WITHIN = TIMEOUT + 10
HUNG_EXIT = 124
NATIVE = "\n--- py-spy dump --native ---\n"
POSITION = re.compile(
    r"rank 2: stuck_in_data_loader \(hang_rank\.py:\d+\) · ranks 0-1,3: all_reduce "
    r"\(hang_rank\.py:\d+\)"
)


def worker_pids(out_dir: Path) -> list[int]:
    return [json.loads(path.read_text())["pid"] for path in out_dir.glob("[0-9]*.json")]


def summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_a_hung_rank_is_named_with_every_ranks_stack(nodes: Nodes, out_dir: Path, port: int, tmp_path: Path) -> None:
    record = tmp_path / "summary.json"
    nodes.start(
        "--nproc-per-node",
        "4",
        "--master-port",
        port,
        "--hang-timeout",
        TIMEOUT,
        "--log-dir",
        tmp_path / "logs",
        "--summary-file",
        record,
        HANG,
        out_dir,
        2,
    )
    wait_for(lambda: len(worker_pids(out_dir)) == 4, "the four workers to join")
    joined = time.monotonic()
    run = nodes.finish_all()[0]
    found_after = time.monotonic() - joined

    assert run.returncode == HUNG_EXIT, run.stderr
    assert found_after < FOUND_WITHIN, run.stderr
    assert POSITION.search(run.stderr), run.stderr
    stacks = sorted(tmp_path.glob("logs/*/attempt_0/*/stacks.txt"))
    assert [path.parent.name for path in stacks] == ["0", "1", "2", "3"]
    texts = [path.read_text() for path in stacks]
    assert all(text.startswith(("Thread ", "Current thread ")) for text in texts), texts
    assert "in stuck_in_data_loader" in texts[2] and "in all_reduce" in texts[0]
    # py-spy (installed with the test tools) adds each worker's native frames after its Python ones.
    natives = [text.partition(NATIVE)[2] for text in texts]
    assert all('"MainThread"' in native for native in natives), texts
    assert "stuck_in_data_loader (hang_rank.py:" in natives[2]
    written = summary(record)
    assert written["result"] == "hung" and written["exit_code"] == HUNG_EXIT
    assert written["root_cause"]["reason"] == "hung"
    assert written["root_cause"]["positions"]["2"].startswith("stuck_in_data_loader (hang_rank.py:")
    assert [worker["stack"].split(" ")[0] for worker in written["attempts"][0]["workers"]] == [
        "all_reduce",
        "all_reduce",
        "stuck_in_data_loader",
        "all_reduce",
    ]
    assert not [pid for pid in worker_pids(out_dir) if is_alive(pid)]


def test_a_hung_attempt_is_restarted_as_a_failed_one(port: int, out_dir: Path, tmp_path: Path) -> None:
    record = tmp_path / "summary.json"
    run = run_xlarun(
        "--nproc-per-node",
        "2",
        "--master-port",
        port,
        "--hang-timeout",
        TIMEOUT,
        "--max-restarts",
        1,
        "--summary-file",
        record,
        HANG,
        out_dir,
        1,
        "first-attempt",
    )

    assert run.returncode == 0, run.stderr
    assert re.search(
        r"^xlarun: where the ranks of attempt 0 stood: rank 0: all_reduce \(hang_rank\.py:\d+\) · "
        r"rank 1: stuck_in_data_loader \(hang_rank\.py:\d+\)$",
        run.stderr,
        re.M,
    ), run.stderr
    assert re.search(
        r"^xlarun: attempt 0 hung \(no output for \d+ s and no CPU use\); restarting the worker group "
        r"\(restart 1 of 1\)$",
        run.stderr,
        re.M,
    ), run.stderr
    written = summary(record)
    assert (written["result"], written["restarts"]) == ("succeeded", 1)
    assert [worker.get("stack") is not None for attempt in written["attempts"] for worker in attempt["workers"]] == [
        True,
        True,
        False,
        False,
    ]


def test_a_silent_worker_that_computes_is_not_hung(port: int) -> None:
    run = run_xlarun("--nproc-per-node", "1", "--master-port", port, "--hang-timeout", 1, worker("busy_silent.py"), 4)

    assert run.returncode == 0, run.stderr
    busy = [line for line in run.stderr.splitlines() if "uses the CPU" in line]
    assert busy == [
        "xlarun: local rank 0 made no progress for 1 s but uses the CPU (an XLA compile?): not hung; the run goes on"
    ], run.stderr


def test_without_the_flag_nothing_is_watched(port: int, out_dir: Path) -> None:
    (out_dir / "release").touch()  # a hang_rank run that does not hang: the check is that nothing else happens
    run = run_xlarun("--nproc-per-node", "2", "--master-port", port, HANG, out_dir, 1)

    assert run.returncode == 0, run.stderr
    assert "hung" not in run.stderr and "CPU" not in run.stderr


def test_node_0_names_a_stuck_rank_of_node_1(nodes: Nodes, out_dir: Path, port: int, tmp_path: Path) -> None:
    """Node 1 finds the hang (node 0 would wait a minute): node 0 takes its stacks when told, and names all."""
    records = [tmp_path / f"node{rank}.json" for rank in (0, 1)]
    node0 = nodes.start(*static(port, 0, 2, 2), "--hang-timeout", 60, "--summary-file", records[0], HANG, out_dir, 2)
    node1 = nodes.start(
        *static(port, 1, 2, 2), "--hang-timeout", TIMEOUT, "--summary-file", records[1], HANG, out_dir, 2
    )
    wait_for(lambda: len(worker_pids(out_dir)) == 4, "the four workers to join")
    joined = time.monotonic()
    runs = nodes.finish_all([node0, node1])
    found_after = time.monotonic() - joined

    assert [run.returncode for run in runs] == [HUNG_EXIT, HUNG_EXIT], both(runs)
    assert found_after < FOUND_WITHIN, both(runs)
    assert POSITION.search(runs[0].stderr), both(runs)
    assert "the workers are hung: node 1: no output for " in runs[0].stderr, both(runs)
    positions = summary(records[0])["root_cause"]["positions"]
    assert sorted(positions) == ["0", "1", "2", "3"]
    assert summary(records[1])["result"] == "hung"
    assert not [pid for pid in worker_pids(out_dir) if is_alive(pid)]


def test_stacks_of_a_live_run_and_the_run_goes_on(nodes: Nodes, out_dir: Path, port: int) -> None:
    launcher = nodes.start("--nproc-per-node", "2", "--master-port", port, HANG, out_dir, 1)
    wait_for(lambda: len(worker_pids(out_dir)) == 2, "the two workers to join")
    shown = run_command([*XLARUN, "--stacks", str(launcher.pid)])
    (out_dir / "release").touch()
    run = nodes.finish_all()[0]

    assert shown.returncode == 0, shown.stderr
    assert f"xlarun launch {launcher.pid}: 2 workers" in shown.stdout
    assert re.search(r"^rank 0 \(local rank 0, pid \d+\):\n(Current thread|Thread) ", shown.stdout, re.M)
    assert "in all_reduce" in shown.stdout and "in stuck_in_data_loader" in shown.stdout
    assert "rank 1, native (py-spy dump --native):\nProcess " in shown.stdout
    assert re.search(r"rank 0: all_reduce \(hang_rank\.py:\d+\) · rank 1: stuck_in_data_loader", shown.stdout)
    assert run.returncode == 0, run.stderr


def test_stacks_without_a_launch_is_one_line() -> None:
    shown = run_command([*XLARUN, "--stacks", str(os.getpid())])

    assert shown.returncode == 1
    assert shown.stderr == f"xlarun: process {os.getpid()} is not an xlarun launcher with running workers\n"


def test_the_script_sees_its_own_environment(port: int, tmp_path: Path) -> None:
    """The stack-dump hook leaves the script the PYTHONPATH it was given, and no variable of its own."""
    run = run_xlarun(
        "--nproc-per-node",
        "1",
        "--master-port",
        port,
        worker("dump_env.py"),
        env={"DUMP_DIR": str(tmp_path), "PYTHONPATH": "/opt/site"},
    )

    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "0_0.json").read_text())
    assert record["env"]["PYTHONPATH"] == "/opt/site"
    assert "XLARUN_STACKS" not in record["env"]
    assert record["exec_env"]["XLARUN_STACKS"].endswith("/attempt_0/0/stacks.txt")
    assert record["exec_env"]["PYTHONPATH"].endswith(":/opt/site")
    assert not [entry for entry in record["sys_path"] if entry.endswith(os.path.join("worker", "startup"))]


def test_peak_memory_and_cpu_time_per_worker(port: int, tmp_path: Path) -> None:
    record = tmp_path / "summary.json"
    run = run_xlarun("--nproc-per-node", "1", "--master-port", port, "--summary-file", record, worker("memory.py"), 300)

    assert run.returncode == 0, run.stderr
    (entry,) = summary(record)["attempts"][0]["workers"]
    assert 300 <= entry["peak_rss_mib"] <= 340, entry
    assert entry["cpu_s"] > 0 and entry["steps"] is None


def memory_cgroup(limit_mib: int) -> Path:
    """A memory cgroup of its own under the test's, limited to ``limit_mib`` (swap included); skips where
    none can be made (not root, no memory controller)."""
    from xlarun.host.oom import memory_cgroup_directory

    parent = memory_cgroup_directory()
    if parent is None or not os.access(parent, os.W_OK):
        reason = "no writable memory cgroup here (the OOM tests need root and the memory controller)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    group = Path(parent) / f"xlarun-oom-{secrets.token_hex(4)}"
    group.mkdir()
    limit = str(limit_mib * 1024 * 1024)
    if (group / "memory.max").exists():  # cgroup v2
        (group / "memory.max").write_text(limit)
        (group / "memory.swap.max").write_text("0")
    else:
        (group / "memory.limit_in_bytes").write_text(limit)
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(limit)
    return group


# How xlarun learns whom the OOM killer ended: the kernel's log where it can read it (root, the host's
# pid namespace), else the cgroup's count and the worker's peak RSS (in a pid namespace of its own,
# whose pids the kernel's log does not use).
EVIDENCE = {"kernel log": [], "counters": ["unshare", "--pid", "--fork", "--mount-proc"]}


def in_cgroup(group: Path, evidence: str, command: list[object]) -> list[str]:
    """``command`` started in ``group``, seeing the evidence named."""
    if evidence == "counters" and shutil.which("unshare") is None:
        pytest.skip("no unshare here, to start a launcher in a pid namespace of its own")
    return [
        "sh",
        "-c",
        f"echo $$ > {group / 'cgroup.procs'} && exec " + " ".join(map(str, [*EVIDENCE[evidence], *command])),
    ]


@pytest.mark.parametrize("evidence", EVIDENCE)
def test_a_worker_the_oom_killer_ends_is_named(port: int, tmp_path: Path, evidence: str) -> None:
    group = memory_cgroup(600)
    record = tmp_path / "summary.json"
    try:
        # The launcher and its workers start in the cgroup, as in a container with a memory limit.
        run = run_command(
            in_cgroup(
                group,
                evidence,
                [
                    *XLARUN,
                    "--nproc-per-node",
                    1,
                    "--master-port",
                    port,
                    "--summary-file",
                    record,
                    worker("memory.py"),
                    1200,
                    "--step",
                    20,
                ],
            )
        )
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), "the cgroup to empty")
        group.rmdir()

    assert run.returncode == 137, run.stderr
    found = re.search(
        r"^xlarun: rank 0 was killed by the kernel's OOM killer \(peak RSS (\d+) MiB\)$", run.stderr, re.M
    )
    assert found and 450 <= int(found[1]) <= 600, run.stderr
    root = summary(record)["root_cause"]
    assert root["reason"] == "oom_killed" and root["signal"] == "SIGKILL"


@pytest.mark.parametrize("evidence", EVIDENCE)
def test_another_process_oom_killed_in_the_cgroup_does_not_blame_a_worker_killed_by_hand(
    port: int, tmp_path: Path, evidence: str
) -> None:
    group = memory_cgroup(300)
    record = tmp_path / "summary.json"
    ready, go = tmp_path / "ready", tmp_path / "go"
    # A small worker that waits for the word, then gets a SIGKILL as from an operator's kill -9.
    killed_by_hand = f"'touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done; kill -KILL $$'"
    try:
        launcher = subprocess.Popen(
            in_cgroup(
                group,
                evidence,
                [
                    *XLARUN,
                    "--nproc-per-node",
                    1,
                    "--master-port",
                    port,
                    "--summary-file",
                    record,
                    "--no-python",
                    "sh",
                    "-c",
                    killed_by_hand,
                ],
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(ready.exists, "the worker to start")
        # An unrelated process in the same cgroup crosses the limit and is the one the kernel kills.
        hog = run_command(
            [
                "sh",
                "-c",
                f"echo $$ > {group / 'cgroup.procs'} && exec {sys.executable} {worker('memory.py')} 1200 --step 20",
            ]
        )
        assert hog.returncode == -signal.SIGKILL, hog
        go.touch()
        _, stderr = launcher.communicate(timeout=60)
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), "the cgroup to empty")
        group.rmdir()

    assert launcher.returncode == 137, stderr
    assert "OOM" not in stderr, stderr
    assert summary(record)["root_cause"]["reason"] == "signal"


def test_a_sigkill_from_elsewhere_is_not_the_oom_killer(port: int, tmp_path: Path) -> None:
    record = tmp_path / "summary.json"
    run = run_xlarun(
        "--nproc-per-node",
        "1",
        "--master-port",
        port,
        "--summary-file",
        record,
        "--no-python",
        "sh",
        "-c",
        "kill -KILL $$",
    )

    assert run.returncode == 137, run.stderr
    assert "OOM" not in run.stderr
    assert summary(record)["root_cause"]["reason"] == "signal"


@pytest.mark.torch_xla
def test_torch_xla_steps_are_counted_and_kept_out_of_the_output(port: int, tmp_path: Path) -> None:
    record = tmp_path / "summary.json"
    run = run_xlarun(
        "--nproc-per-node",
        "1",
        "--master-port",
        port,
        "--hang-timeout",
        120,
        "--tee",
        3,
        "--log-dir",
        tmp_path / "logs",
        "--summary-file",
        record,
        worker("xla_steps.py"),
        env={"PJRT_DEVICE": "CPU"},
    )

    assert run.returncode == 0, run.stderr
    (entry,) = summary(record)["attempts"][0]["workers"]
    assert entry["steps"] == 3
    (stderr_log,) = tmp_path.glob("logs/*/attempt_0/0/stderr.log")
    for text in (run.stderr, stderr_log.read_text()):
        assert "::mark_step" not in text and "::sync" not in text, text
        assert "step 2" in text
