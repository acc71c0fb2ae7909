"""Worker side: joining the process group under torch_xla 2.9 on CPU, and catching a split world.

Workers are real processes started with the environment torchrun and xlarun give
them (``run_workers``); the other worker-side test modules start theirs with it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from conftest import free_port

from xlarun.worker import RUNTIME_VIEW, TORCH_VIEW, describe_split, is_launched

REPO = Path(__file__).resolve().parents[1]
WORKER_TIMEOUT_S = 240

# Variables that decide how a worker joins; a value inherited from the test's
# own environment would change what the workers do.
INHERITED_TO_CLEAR = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "PJRT_DEVICE",
    "PJRT_LOCAL_PROCESS_RANK", "PJRT_LOCAL_PROCESS_COUNT", "CPU_NUM_DEVICES", "XLA_USE_SPMD", "XLARUN_SPMD",
    "XLARUN_LAUNCHED", "XRT_WORKERS", "XRT_DEVICE_MAP", "XRT_MULTI_PROCESSING_DEVICE",
)


def worker_environment(local_rank: int, nproc: int, master_port: int,
                       agent_store: bool = False, restart_count: int = 0) -> dict[str, str]:
    """What a worker of a one-node xlarun launch on CPU finds in its environment."""
    env = {name: value for name, value in os.environ.items() if name not in INHERITED_TO_CLEAR}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env.update({
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(local_rank),
        "ROLE_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": "worker-test",
        "TORCHELASTIC_USE_AGENT_STORE": str(agent_store),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "PJRT_DEVICE": "CPU",
        "XLARUN_LAUNCHED": "1",
    })
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_workers(argv: Sequence[str], nproc: int, *,
                env_for_rank: Callable[[int], Mapping[str, str]] = lambda rank: {},
                master_port: int | None = None, agent_store: bool = False,
                restart_count: int = 0) -> list[subprocess.CompletedProcess]:
    """Run ``python argv...`` as ``nproc`` workers of one node and wait for all of them.

    ``env_for_rank(local_rank)`` adds to or overrides a worker's environment.
    """
    port = master_port if master_port is not None else free_port()
    workers = []
    try:
        for local_rank in range(nproc):
            env = worker_environment(local_rank, nproc, port, agent_store, restart_count)
            env.update(env_for_rank(local_rank))
            workers.append(subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        results = []
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=WORKER_TIMEOUT_S)
            results.append(subprocess.CompletedProcess(worker.args, worker.returncode, stdout, stderr))
        return results
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def json_report(result: subprocess.CompletedProcess) -> dict:
    """The last JSON line a worker printed; fails with the worker's output when there is none."""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    pytest.fail(f"worker printed no report (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def test_importing_the_worker_module_leaves_torch_unimported():
    check = "import sys, xlarun.worker; sys.exit('torch' in sys.modules or 'torch_xla' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_is_launched_reads_the_launchers_marker(monkeypatch):
    monkeypatch.delenv("XLARUN_LAUNCHED", raising=False)
    assert not is_launched()
    monkeypatch.setenv("XLARUN_LAUNCHED", "1")
    assert is_launched()


def test_describe_split_accepts_matching_views():
    views = {TORCH_VIEW: (3, 8), RUNTIME_VIEW: (3, 8)}
    assert describe_split(3, 8, views, "TPU", spmd=False) is None


def test_describe_split_names_the_cpu_client_when_each_process_is_alone():
    message = describe_split(1, 4, {RUNTIME_VIEW: (0, 1)}, "CPU", spmd=False)
    assert message.startswith("PJRT's CPU client has no cross-process collectives")
    assert "each of the 4 processes" in message
    assert "--spmd --virtual-devices" in message


def test_describe_split_names_the_disagreeing_view_and_the_launchers_numbers():
    message = describe_split(5, 16, {TORCH_VIEW: (5, 16), RUNTIME_VIEW: (5, 32)}, "TPU", spmd=False)
    assert "RANK=5 WORLD_SIZE=16" in message
    assert "the XLA runtime reports rank 5 of 32" in message
    assert "\n" not in message


def test_describe_split_points_spmd_at_one_process_per_node():
    message = describe_split(0, 8, {RUNTIME_VIEW: (0, 2)}, "TPU", spmd=True)
    assert "under SPMD each node runs one process" in message


@pytest.mark.parametrize("init", ["torch", "xlarun"])
def test_one_process_joins_a_world_of_one_and_all_reduces(init):
    [result] = run_workers(["examples/xla_allreduce.py", "--init", init], nproc=1)
    assert result.returncode == 0, result.stderr
    assert json_report(result) == {"rank": 0, "world_size": 1, "sum": 1.0}


def test_two_cpu_processes_are_refused_with_the_cause():
    results = run_workers(["examples/xla_allreduce.py"], nproc=2)
    for result in results:
        assert result.returncode != 0, result.stdout
        assert "SplitWorldError: PJRT's CPU client has no cross-process collectives: " \
               "each of the 2 processes would train alone as rank 0 of 1" in result.stderr
        assert '"sum"' not in result.stdout


GLOO_ALL_REDUCE = """
import json, torch, torch.distributed as dist
from xlarun.worker import init_process_group
init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": total.item()}))
dist.destroy_process_group()
"""


def test_the_gloo_backend_the_error_suggests_joins_two_cpu_processes():
    results = run_workers(["-c", GLOO_ALL_REDUCE], nproc=2)
    reports = sorted((json_report(result) for result in results), key=lambda report: report["rank"])
    assert reports == [{"rank": 0, "world_size": 2, "sum": 3.0}, {"rank": 1, "world_size": 2, "sum": 3.0}]
