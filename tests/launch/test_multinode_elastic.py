"""Elastic membership: nodes lost, late or replaced, with agents on 127.0.0.1 as nodes.

Each worker (``tests/workers/mn_elastic.py``) all-reduces over gloo and records the world it
saw as ``<attempt>.<rank>.json``; in the first attempt it then waits until stopped, so only a
change of nodes ends that attempt, and in the next one it exits 0. Each test asserts the
world of the last attempt and exit 0 on every agent still alive.

Short timeouts keep the tests short: this module's heartbeat timeout, and torch's keep-alive
(a lost node leaves torch's c10d round after ``keep_alive_interval`` x ``keep_alive_max_attempt``
seconds) and last call (a round of fewer than the maximum closes after ``last_call_timeout``).
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist
from helpers import Run, wait_for, worker
from multinode import HOST, Nodes, both, c10d, kill_machine, lines, listeners, static

ELASTIC = worker("mn_elastic.py")
# torch's keep-alive needs three intervals at 1 s: its state is cached for a second between reads.
CONF = (
    "--rdzv_conf",
    "heartbeat_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60",
)


def last_attempt(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    final = max(record["attempt"] for record in records)
    return sorted((record for record in records if record["attempt"] == final), key=lambda record: record["rank"])


def assert_world(records: list[dict[str, Any]], world: int) -> None:
    """Every worker of an attempt saw the same world of contiguous ranks, and all-reduced over it."""
    assert [record["rank"] for record in records] == list(range(world)), records
    assert {(record["world"], record["env_world"], record["sum"]) for record in records} == {
        (world, world, sum(range(world)))
    }, records


def start_c10d_nodes(
    nodes: Nodes, out_dir: Path, port: int, count: int, nnodes: str, *extra: str
) -> list[subprocess.Popen]:
    """``count`` agents; the first serves the store (it binds the endpoint's port before the others come)."""
    agents = []
    for _ in range(count):
        agents.append(nodes.start(*c10d(port, "elastic", nnodes, 1), *CONF, *extra, ELASTIC, out_dir, "1"))
        wait_for(lambda: listeners(port), f"the store to listen on port {port}")
    return agents


def wait_for_a_spare(port: int, run_id: str) -> None:
    """Until one node waits in torch's round for a place, as the job's store counts it."""
    store = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=30))
    wait_for(lambda: int(store.add(f"xlarun/{run_id}/unseated", 0)) == 1, "the spare node to wait for a place")


def restart_lines(run: Run) -> list[str]:
    return [line for line in lines(run) if "restarting with" in line]


def test_a_lost_node_leaves_the_survivors_running_with_the_nodes_they_have(
    nodes: Nodes, out_dir: Path, tmp_path: Path, port: int
) -> None:
    summary = tmp_path / "summary.json"
    host, *others = start_c10d_nodes(
        nodes, out_dir, port, 3, "2:3", "--max_restarts", "3", "--summary-file", str(summary)
    )
    nodes.wait_for_records(3)
    victim, survivor = others
    victim_workers = [child.pid for child in psutil.Process(victim.pid).children(recursive=True)]
    [victim_node] = {record["node"] for record in nodes.records() if record["pid"] in victim_workers}
    kill_machine(victim.pid)
    runs = nodes.finish_all([host, survivor])

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    final = last_attempt(nodes.records())
    assert_world(final, 2)
    # A new round: the count one higher, ranks contiguous again, a fresh workers' store.
    assert {record["attempt"] for record in final} == {1}
    assert len({record["master"] for record in nodes.records()}) == 2
    for run in runs:
        assert restart_lines(run) == [
            f"xlarun: node {victim_node} ({socket.getfqdn()}) left; restarting with 2 nodes (2..3)"
        ], both(runs)
        assert any(
            line.startswith("xlarun: attempt 0 failed (") and line.endswith("(restart 1 of 3)") for line in lines(run)
        ), both(runs)
    attempts = json.loads(summary.read_text())["attempts"]
    assert [(attempt["attempt"], attempt["world_size"], len(attempt["nodes"])) for attempt in attempts] == [
        (0, 3, 3),
        (1, 2, 2),
    ]


def test_a_late_node_is_let_in_by_a_restart_that_costs_no_restart(
    nodes: Nodes, out_dir: Path, tmp_path: Path, port: int
) -> None:
    summary = tmp_path / "summary.json"
    first = start_c10d_nodes(nodes, out_dir, port, 2, "2:3", "--summary-file", str(summary))
    nodes.wait_for_records(2)
    late = nodes.start(*c10d(port, "elastic", "2:3", 1), *CONF, ELASTIC, out_dir, "1")
    runs = nodes.finish_all([*first, late])

    # No restarts were allowed: letting a waiting node in is not a failure.
    assert [run.returncode for run in runs] == [0, 0, 0], both(runs)
    final = last_attempt(nodes.records())
    assert_world(final, 3)
    assert {record["attempt"] for record in final} == {1}
    for run in runs:
        [change] = restart_lines(run)
        assert re.fullmatch(r"xlarun: \S+ joined as node [0-2]; restarting with 3 nodes \(2\.\.3\)", change), both(runs)
    attempts = json.loads(summary.read_text())["attempts"]
    assert [(attempt["attempt"], attempt["world_size"], len(attempt["nodes"])) for attempt in attempts] == [
        (0, 2, 2),
        (1, 3, 3),
    ]


def test_a_replacement_takes_the_place_of_a_lost_node(nodes: Nodes, out_dir: Path, port: int) -> None:
    host, victim = start_c10d_nodes(nodes, out_dir, port, 2, "2", "--max_restarts", "3")
    nodes.wait_for_records(2)
    kill_machine(victim.pid)
    replacement = nodes.start(*c10d(port, "elastic", 2, 1), *CONF, "--max_restarts", "3", ELASTIC, out_dir, "1")
    runs = nodes.finish_all([host, replacement])

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    final = last_attempt(nodes.records())
    assert_world(final, 2)
    assert {record["attempt"] for record in final} == {1}


def test_a_static_node_restarted_with_its_rank_rejoins(nodes: Nodes, out_dir: Path, port: int) -> None:
    agents = [
        nodes.start(*static(port, node_rank, 2, 1), *CONF, "--max_restarts", "2", ELASTIC, out_dir, "1")
        for node_rank in (0, 1)
    ]
    nodes.wait_for_records(2)
    kill_machine(agents[1].pid)
    replacement = nodes.start(*static(port, 1, 2, 1), *CONF, "--max_restarts", "2", ELASTIC, out_dir, "1")
    runs = nodes.finish_all([agents[0], replacement])

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    final = last_attempt(nodes.records())
    assert_world(final, 2)
    assert [(record["attempt"], record["node"]) for record in final] == [(1, 0), (1, 1)]
    # Attempt 0 used the job's store; attempt 1 a fresh one that node 0 serves at the master address.
    masters = {record["attempt"]: record["master"] for record in nodes.records()}
    assert masters[0] == f"{HOST}:{port}" and masters[1].startswith(f"{HOST}:") and masters[1] != masters[0]


def test_a_node_waiting_for_a_place_when_the_job_ends_exits_0(nodes: Nodes, tmp_path: Path, port: int) -> None:
    """As torchrun's graceful exit: a spare node of a full job has nothing to run, and nothing failed."""
    release = tmp_path / "release"
    until_released = ("--no-python", "sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done")
    summary = tmp_path / "spare.json"
    running = []
    for _ in range(2):
        running.append(nodes.start(*c10d(port, "full", 2, 1), *CONF, *until_released))
        wait_for(lambda: listeners(port), f"the store to listen on port {port}")
    wait_for(
        lambda: all(
            any(child.name() == "sh" for child in psutil.Process(agent.pid).children(recursive=True))
            for agent in running
        ),
        "both nodes' workers",
    )
    spare = nodes.start(*c10d(port, "full", 2, 1), *CONF, "--summary-file", str(summary), *until_released)
    wait_for_a_spare(port, "full")
    release.touch()
    runs = nodes.finish_all([*running, spare])

    assert [run.returncode for run in runs] == [0, 0, 0], both(runs)
    assert lines(runs[2]) == [
        f"xlarun: the job of run id 'full' at {HOST}:{port} ended while this node waited for "
        "a place in it; nothing to run"
    ], both(runs)
    record = json.loads(summary.read_text())
    assert (record["result"], record["exit_code"], record["attempts"]) == ("not_needed", 0, [])


def test_a_spare_waiting_at_the_maximum_takes_the_place_of_a_lost_node(nodes: Nodes, out_dir: Path, port: int) -> None:
    host, victim = start_c10d_nodes(nodes, out_dir, port, 2, "2", "--max_restarts", "3")
    nodes.wait_for_records(2)
    spare = nodes.start(*c10d(port, "elastic", 2, 1), *CONF, "--max_restarts", "3", ELASTIC, out_dir, "1")
    wait_for_a_spare(port, "elastic")
    kill_machine(victim.pid)
    runs = nodes.finish_all([host, spare])

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    final = last_attempt(nodes.records())
    assert_world(final, 2)
    assert {record["attempt"] for record in final} == {1}
    for run in runs:
        [change] = restart_lines(run)
        assert re.fullmatch(r"xlarun: node \d \(\S+\) left, \S+ joined as node \d; restarting with 2 nodes", change), (
            both(runs)
        )
