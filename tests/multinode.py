"""Helpers for the multi-node tests: agents on 127.0.0.1 as nodes, and what they printed.

- ``static(port, node_rank, nnodes, nproc)`` and ``c10d(port, run_id, nnodes, nproc)``: the flags of one node.
- ``Nodes`` (the ``nodes`` fixture of ``conftest.py``): the agents a test starts; whatever is left of them is
  killed at teardown.
- ``lines(run)``: the launcher's lines on stderr, without the warnings every CPU launch prints first.
- ``listeners(port)``: who listens on a port, to find the agent that serves the store.
- ``kill_machine(pid)``: SIGKILL an agent and every process under it, as if its host vanished.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from helpers import Run, finish, kill_all, start_xlarun, wait_for

HOST = "127.0.0.1"
# Launch notices that do not concern several nodes (e.g. PJRT's CPU client warning).
WARNING = "xlarun: warning: "


def static(port: int, node_rank: int, nnodes: int, nproc: int) -> list[str]:
    return [
        "--nnodes",
        str(nnodes),
        "--node_rank",
        str(node_rank),
        "--master_addr",
        HOST,
        "--master_port",
        str(port),
        "--nproc_per_node",
        str(nproc),
    ]


def c10d(port: int, run_id: str, nnodes: str | int, nproc: int) -> list[str]:
    return [
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{HOST}:{port}",
        "--rdzv_id",
        run_id,
        "--nnodes",
        str(nnodes),
        "--nproc_per_node",
        str(nproc),
    ]


class Nodes:
    """The agents a test starts; whatever is left of them (launchers, workers) is killed at teardown."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.processes: list[subprocess.Popen] = []

    def start(self, *args: object, env: dict[str, str] | None = None) -> subprocess.Popen:
        process = start_xlarun(*args, env=env)
        self.processes.append(process)
        return process

    def finish_all(self, processes: Sequence[subprocess.Popen] | None = None) -> list[Run]:
        return [finish(process) for process in (self.processes if processes is None else processes)]

    def records(self) -> list[dict[str, Any]]:
        """The records the workers wrote whole: a file is there, empty, from a worker's ``open``
        until its ``json.dump`` is done."""
        whole = []
        for path in sorted(self.out_dir.glob("*.json")):
            with contextlib.suppress(json.JSONDecodeError):
                whole.append(json.loads(path.read_text()))
        return whole

    def wait_for_records(self, count: int) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.records()) >= count, f"{count} worker records")
        return self.records()

    def worker_pids(self) -> list[int]:
        return [record["pid"] for record in self.records() if "pid" in record]

    def cleanup(self) -> None:
        kill_all([process.pid for process in self.processes if process.poll() is None])
        for process in self.processes:
            if process.poll() is None:
                process.communicate()
        kill_all(self.worker_pids())


def both(runs: Sequence[Run]) -> str:
    """Every node's output, for assertion messages."""
    return "\n".join(
        f"--- node {index} (exit {run.returncode})\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        for index, run in enumerate(runs)
    )


def without_warnings(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(WARNING))


def lines(run: Run) -> list[str]:
    return without_warnings(run.stderr).splitlines()


def listeners(port: int) -> list[tuple[str, int]]:
    """(address, pid) of every TCP socket listening on ``port``."""
    return [
        (connection.laddr.ip, connection.pid)
        for connection in psutil.net_connections(kind="tcp")
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port
    ]


def kill_machine(pid: int) -> list[int]:
    """SIGKILL an agent, its orphan guard and its workers at once, as if its host vanished; returns their pids."""
    doomed = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    kill_all(doomed)
    return doomed
