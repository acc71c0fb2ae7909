"""xlarun under a real Slurm: two nodes (n1, n2) on this machine, one srun task per node.

The cluster comes from the session fixture ``slurm_env`` (see tests/slurm.py), started for the
first of these tests and stopped when the session ends: these tests skip where the machine cannot
host it and must run under CI. All carry the ``slurm`` marker: run them alone with ``-m slurm``,
or everything else without starting the cluster with ``-m "not slurm"``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
import pytest
from helpers import REPO, Run, clean_env, kill_all

pytestmark = pytest.mark.slurm

# The console script installed next to this interpreter: what a user puts after srun.
XLARUN_SCRIPT = Path(sys.executable).parent / "xlarun"
# Safety nets only: a healthy step ends in seconds. The job's own time limit (minutes) makes
# Slurm end a step that outlives the test.
STEP_TIMEOUT_S = 150
JOB_TIME_LIMIT_MIN = 3
TASK_LINE = re.compile(r"^\s*(\d+): (.*)$", re.MULTILINE)
RANK_LINE = re.compile(r"^\s*(\d+): .*\brank=(\d+) world=(\d+) sum=(\d+)", re.MULTILINE)
JOINED_LINE = re.compile(r"^\s*(\d+): .*\bjoined rank=(\d+)", re.MULTILINE)
EXIT_LINE = re.compile(r"^\s*(\d+): xlarun exit status (\d+)$", re.MULTILINE)

# Exits 3 on global rank 2 (the first worker of the second node) once every worker has joined
# the process group; every other worker would sleep far past the test unless stopped. The two
# workers of a node share srun's stdout and run unbuffered (``python -u``), so each line goes out
# in one write: print() writes the text and the newline apart, and another worker's line could
# land between them.
FAILING_WORKER = """\
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
sys.stdout.write(f"joined rank={dist.get_rank()}\\n")
sys.stdout.flush()
if dist.get_rank() == 2:
    sys.exit(3)
time.sleep(600)
"""

# Runs the task's command, then reports its exit status on a line of its own and passes it on.
REPORT_EXIT_STATUS = '"$@"; status=$?; echo "xlarun exit status $status"; exit $status'


def srun_two_nodes(slurm_env: Mapping[str, str], job_name: str, command: Sequence[str]) -> Run:
    """One task on each of the two nodes, output lines labelled with the task number.

    ``--kill-on-bad-exit=0``: srun itself must not stop the other task when one fails, so what
    ends the step is what the tasks do.
    """
    env = clean_env({"SLURM_CONF": slurm_env["SLURM_CONF"]})
    name = f"xlarun-test-{job_name}"
    srun = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--label",
        "--kill-on-bad-exit=0",
        f"--job-name={name}",
        f"--time={JOB_TIME_LIMIT_MIN}",
        *command,
    ]
    try:
        completed = subprocess.run(
            srun, env=env, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as timeout:
        subprocess.run(["scancel", f"--name={name}"], env=env, timeout=30)
        pytest.fail(
            f"srun still running after {STEP_TIMEOUT_S} s\nstdout:\n{as_text(timeout.stdout)}\n"
            f"stderr:\n{as_text(timeout.stderr)}"
        )
    return Run(completed.returncode, completed.stdout, completed.stderr)


def as_text(output: bytes | str | None) -> str:
    """What a timed-out subprocess had written (bytes even in text mode)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def xlarun_command() -> list[str]:
    if not XLARUN_SCRIPT.exists():
        pytest.fail(f"no xlarun console script at {XLARUN_SCRIPT}: install the package into this environment")
    return [str(XLARUN_SCRIPT)]


def processes_running(path: Path) -> list[int]:
    """Processes whose command line names ``path``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if str(path) in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process.info["pid"])
    return found


def test_slurm_srun_places_one_task_on_each_node(slurm_env):
    step = srun_two_nodes(slurm_env, "placement", ["printenv", "SLURM_NODEID", "SLURMD_NODENAME"])

    assert step.returncode == 0, step.stderr
    by_task: dict[str, list[str]] = {}
    for task, line in TASK_LINE.findall(step.stdout):
        by_task.setdefault(task, []).append(line)
    assert by_task == {"0": ["0", "n1"], "1": ["1", "n2"]}, step.stdout


def test_slurm_xlarun_all_reduces_across_both_nodes(slurm_env):
    step = srun_two_nodes(
        slurm_env,
        "allreduce",
        [*xlarun_command(), "--cluster", "slurm", "--nproc_per_node", "2", "examples/allreduce.py"],
    )

    assert step.returncode == 0, f"stdout:\n{step.stdout}\nstderr:\n{step.stderr}"
    results = RANK_LINE.findall(step.stdout)
    ranks_by_task = {
        task: sorted(int(rank) for rank_task, rank, _, _ in results if rank_task == task) for task in ("0", "1")
    }
    assert ranks_by_task == {"0": [0, 1], "1": [2, 3]}, step.stdout
    assert {(world, total) for _, _, world, total in results} == {("4", "6")}, step.stdout


def test_slurm_worker_failure_on_one_node_ends_the_step_on_both(slurm_env, tmp_path):
    failing_worker = tmp_path / "fail_on_rank_2.py"
    failing_worker.write_text(FAILING_WORKER)

    try:
        step = srun_two_nodes(
            slurm_env,
            "failure",
            [
                "bash",
                "-c",
                REPORT_EXIT_STATUS,
                "task",
                *xlarun_command(),
                "--cluster",
                "slurm",
                "--nproc_per_node",
                "2",
                str(failing_worker),
            ],
        )
        leftover_workers = processes_running(failing_worker)
    finally:
        kill_all(processes_running(failing_worker))

    output = f"stdout:\n{step.stdout}\nstderr:\n{step.stderr}"
    # Every worker joined, so the failure came after initialisation, from rank 2 on the second node.
    assert sorted(JOINED_LINE.findall(step.stdout)) == [("0", "0"), ("0", "1"), ("1", "2"), ("1", "3")], output
    exit_status = {task: int(status) for task, status in EXIT_LINE.findall(step.stdout)}
    assert sorted(exit_status) == ["0", "1"], output
    assert exit_status["0"] != 0 and exit_status["1"] != 0, output
    assert step.returncode != 0, output
    assert leftover_workers == [], output
    # Each node's report names the root cause: global rank 2 and its exit code.
    for task in ("0", "1"):
        report = "\n".join(line for line_task, line in TASK_LINE.findall(step.stderr) if line_task == task)
        assert re.search(r"^\s*rank\s*:\s*2\b", report, re.MULTILINE), output
        assert re.search(r"^\s*exitcode\s*:\s*3\b", report, re.MULTILINE), output
