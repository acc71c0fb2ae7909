"""``agent-cpu``: node 0's agent CPU, real agents on loopback.

Runs real agents on loopback (static, one sleeping worker per node) with 2 and then 24 nodes
and compares the CPU time of node 0's agent, which serves the store, for xlarun and torchrun.
Each run lasts ``--cpu-run`` seconds (20 by default).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from xlarun.host.ports import free_port

from .common import (
    LAUNCHERS,
    check_exit,
    children_of,
    clean_environment,
    listening,
    name_of,
    process_cpu_seconds,
    progress,
    scratch_directory,
)

AGENT_CPU_NODES = (2, 24)
AGENT_CPU_RUN_S = 20


def worker_started(pid: int) -> bool:
    """Whether the agent ``pid`` has started its ``sleep`` worker."""
    return any(name_of(child) == "sleep" for child in children_of(pid))


@dataclass
class AgentCpu:
    total_s: float
    running_s: float


def agent_cpu(launcher: str, bin_dir: Path, scratch: Path, count: int, run_s: int) -> AgentCpu:
    """CPU seconds of node 0's agent in a static job of ``count`` loopback nodes, one sleeping worker each.

    Node 0 starts alone, as on a host of its own, and the others once it serves the store:
    torch's import costs a process far more system time while 23 other interpreters that
    imported torch share the machine (about +1 s, for torchrun's agent as for xlarun's, and
    for a bare ``import torch.distributed``), which a real node never pays. The total comes from
    ``wait4`` on node 0's agent (its time and that of the processes it reaped: the ``sleep``
    worker and xlarun's orphan guard, which cost next to nothing); ``running_s`` is the part
    after its worker started, the time the store and the watching cost.
    """
    port = free_port()
    env = clean_environment()

    def start(rank: int) -> int:
        argv = [
            str(bin_dir / launcher),
            "--nnodes",
            str(count),
            "--node_rank",
            str(rank),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            "--nproc_per_node",
            "1",
            "--no-python",
            "sleep",
            str(run_s),
        ]
        with open(scratch / f"{launcher}-{count}-{rank}.stderr", "w") as stderr:
            return subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
            ).pid

    node0 = start(0)
    while not listening(port):
        time.sleep(0.05)
    others = [start(rank) for rank in range(1, count)]
    while not worker_started(node0):
        time.sleep(0.05)
    at_start = process_cpu_seconds(node0)
    _, status, usage = os.wait4(node0, 0)
    for pid in others:
        os.waitpid(pid, 0)
    check_exit(f"{launcher} (node 0)", status, True, scratch / f"{launcher}-{count}-0.stderr")
    total = usage.ru_utime + usage.ru_stime
    return AgentCpu(total, total - at_start)


def run_agent_cpu(bin_dir: Path, run_s: int) -> list[str]:
    samples: dict[tuple[str, int], AgentCpu] = {}
    with scratch_directory() as scratch:
        for count in AGENT_CPU_NODES:
            for launcher in LAUNCHERS:
                progress(f"bench: node 0's agent CPU, {launcher}, {count} loopback nodes, {run_s} s")
                samples[launcher, count] = agent_cpu(launcher, bin_dir, Path(scratch), count, run_s)
    small, large = AGENT_CPU_NODES
    limit = 1.25 * samples["xlarun", small].total_s + 0.3
    rows = [
        f"## Node 0's agent CPU over a {run_s} s static run, one sleeping worker per node",
        "",
        "| nodes | xlarun total (s) | xlarun while running (s) | torchrun total (s) | torchrun while running (s) |",
        "|---|---|---|---|---|",
    ]
    for count in AGENT_CPU_NODES:
        xlarun, torchrun = samples["xlarun", count], samples["torchrun", count]
        rows.append(
            f"| {count} | {xlarun.total_s:.2f} | {xlarun.running_s:.2f} | {torchrun.total_s:.2f} "
            f"| {torchrun.running_s:.2f} |"
        )
    met = samples["xlarun", large].total_s <= limit
    return rows + [
        "",
        f"Goal: xlarun with {large} nodes within 1.25 × (+0.3 s) of {small} nodes, at most "
        f"{limit:.2f} s: {'met' if met else 'not met'}.",
    ]
