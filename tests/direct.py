"""Workers started without a launcher, with the environment a one-node xlarun launch on CPU gives them.

- ``run_workers(argv, nproc, ...)``: start ``nproc`` workers (``python ARGV``) at once and wait for them.
- ``json_report(result)``: the JSON line a worker printed last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from helpers import free_port

REPO = Path(__file__).resolve().parents[1]
WORKER_TIMEOUT_S = 240

# Variables that decide how a worker joins; a value inherited from the test's
# own environment would change what the workers do.
INHERITED_TO_CLEAR = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "PJRT_DEVICE",
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "CPU_NUM_DEVICES",
    "XLA_USE_SPMD",
    "XLARUN_SPMD",
    "XLARUN_LAUNCHED",
    "XRT_WORKERS",
    "XRT_DEVICE_MAP",
    "XRT_MULTI_PROCESSING_DEVICE",
)


def worker_environment(
    local_rank: int, nproc: int, master_port: int, agent_store: bool = False, restart_count: int = 0
) -> dict[str, str]:
    """What a worker of a one-node xlarun launch on CPU finds in its environment."""
    env = {name: value for name, value in os.environ.items() if name not in INHERITED_TO_CLEAR}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env.update(
        {
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
        }
    )
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_workers(
    argv: Sequence[str],
    nproc: int,
    *,
    env_for_rank: Callable[[int], Mapping[str, str]] = lambda rank: {},
    master_port: int | None = None,
    agent_store: bool = False,
    restart_count: int = 0,
) -> list[subprocess.CompletedProcess]:
    """Run ``python argv...`` as ``nproc`` workers of one node and wait for all of them.

    ``env_for_rank(local_rank)`` adds to or overrides a worker's environment.
    """
    port = master_port if master_port is not None else free_port()
    workers = []
    try:
        for local_rank in range(nproc):
            env = worker_environment(local_rank, nproc, port, agent_store, restart_count)
            env.update(env_for_rank(local_rank))
            workers.append(
                subprocess.Popen(
                    [sys.executable, *argv],
                    cwd=REPO,
                    env=env,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
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
