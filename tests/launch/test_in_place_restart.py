"""A container restarted in place (Kubernetes JobSet's in-place restart, the kubelet's ``RestartAllContainers``)
runs the same launch again in the same pod: the same command, run id, ports and log directory, on the same
network namespace and volumes. Nothing the first launch left (its run's log directory and summary file,
the store port's connections in TIME_WAIT, a launcher killed with its orphan guard still reaping) keeps the
second from running and exiting 0: on one node, and on two nodes under either rendezvous, whether the first
launch succeeded, failed (a worker's exit 3) or was killed; nor does a first launch still ending on the
store's host when another node's second launch reaches its store, under c10d even once its rendezvous closed
on that node: where no second launch of the host comes, that node fails in one line, having run nothing."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch.distributed as dist
from helpers import Run, files_exist, finish, run_xlarun, start_xlarun, wait_for, worker
from multinode import HOST, Nodes, both, c10d, kill_machine, lines, listeners, static

RUN_ID = "job-in-place"
FAILING_RANK = "1"


def leave_in_time_wait(port: int) -> None:
    """Leave a connection on ``port`` in TIME_WAIT, as a store that closed its clients' connections first does:
    it stays there for a minute, across the container's restart."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen()
        with socket.create_connection((HOST, port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first, so its end waits
            client.recv(1)
    assert any(
        connection.laddr.port == port and connection.status == psutil.CONN_TIME_WAIT
        for connection in psutil.net_connections(kind="tcp")
    )


def first_launch_fails(out_dir: Path, outcome: str) -> None:
    """Whether the workers' first launch fails: ``fails_first_launch.py`` succeeds once its marker is there."""
    if outcome == "succeeds":
        (out_dir / "failed").touch()


def first_launch_running(out_dir: Path, ranks: int) -> Callable[[], bool]:
    """Whether every rank of a first launch whose workers all stay (``fails_first_launch.py`` with rank -1)
    got past its marker check: touching the marker any earlier could make the next launch's part theirs."""
    return files_exist(*(out_dir / f"{rank}.waiting" for rank in range(ranks)))


def records(out_dir: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"{rank}.json").read_text()) for rank in range(ranks)]


def assert_second_run(
    out_dir: Path, log_dir: Path, summary_file: Path, master_port: int | None, ranks: int, ranks_here: list[int]
) -> None:
    """The second launch's workers formed the whole world under the same run id, on the same master port where
    the flags fix it (c10d's workers' store takes a port picked at the rendezvous); its logs went to a run
    directory of its own beside the first's; its summary is its own."""
    seen = records(out_dir, ranks)
    assert [(record["world"], record["sum"], record["run_id"]) for record in seen] == [
        (ranks, sum(range(ranks)), RUN_ID)
    ] * ranks
    if master_port is not None:
        assert {record["master_port"] for record in seen} == {str(master_port)}
    run_dirs = sorted(log_dir.iterdir())
    assert len(run_dirs) == 2 and all(path.name.startswith(f"{RUN_ID}_") for path in run_dirs), run_dirs
    summary = json.loads(summary_file.read_text())
    assert (summary["run_id"], summary["result"], summary["exit_code"]) == (RUN_ID, "succeeded", 0)
    assert sorted(worker["pid"] for worker in summary["attempts"][-1]["workers"]) == sorted(
        seen[rank]["pid"] for rank in ranks_here
    )


# --- one node -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["succeeds", "fails", "killed"])
def test_one_node_restarted_in_place_runs_again(tmp_path: Path, out_dir: Path, port: int, outcome: str) -> None:
    log_dir, summary_file = tmp_path / "logs", tmp_path / "summary.json"
    command = (
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--rdzv_id",
        RUN_ID,
        "--log-dir",
        log_dir,
        "--summary-file",
        summary_file,
        worker("fails_first_launch.py"),
        out_dir,
        "-1" if outcome == "killed" else FAILING_RANK,
    )
    first_launch_fails(out_dir, outcome)
    if outcome == "killed":
        # The kubelet's SIGKILL after the grace period; the orphan guard is left to reap the workers.
        launcher = start_xlarun(*command)
        wait_for(first_launch_running(out_dir, 2), "both workers of the first launch to run")
        os.kill(launcher.pid, signal.SIGKILL)
        finish(launcher)
        (out_dir / "failed").touch()
    else:
        first = run_xlarun(*command)
        assert first.returncode == (3 if outcome == "fails" else 0), first.stderr
    leave_in_time_wait(port)
    second = run_xlarun(*command)
    assert second.returncode == 0, second.stderr
    assert_second_run(out_dir, log_dir, summary_file, port, 2, [0, 1])


# --- two nodes ------------------------------------------------------------------------------------------


def run_two_nodes(nodes: Nodes, tmp_path: Path, out_dir: Path, backend: str, port: int) -> list[Run]:
    started: list[subprocess.Popen] = []
    for node in (0, 1):
        placement = (
            static(port, node, 2, 1) + ["--rdzv_id", RUN_ID] if backend == "static" else c10d(port, RUN_ID, 2, 1)
        )
        started.append(
            nodes.start(
                *placement,
                "--log-dir",
                tmp_path / f"logs{node}",
                "--summary-file",
                tmp_path / f"summary{node}.json",
                worker("fails_first_launch.py"),
                out_dir,
                FAILING_RANK,
            )
        )
    return nodes.finish_all(started)


@pytest.mark.parametrize("backend", ["static", "c10d"])
@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_two_nodes_restarted_in_place_run_again(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int, backend: str, outcome: str
) -> None:
    first_launch_fails(out_dir, outcome)
    first = run_two_nodes(nodes, tmp_path, out_dir, backend, port)
    assert [run.returncode for run in first] == [3 if outcome == "fails" else 0] * 2, both(first)
    leave_in_time_wait(port)
    second = run_two_nodes(nodes, tmp_path, out_dir, backend, port)
    assert [run.returncode for run in second] == [0, 0], both(second)
    for node in (0, 1):
        assert_second_run(
            out_dir,
            tmp_path / f"logs{node}",
            tmp_path / f"summary{node}.json",
            port if backend == "static" else None,
            2,
            [node],
        )


PATIENT_HEARTBEAT = "heartbeat_timeout=600"
"""Node 0's first launch declares the killed node 1 lost once its heartbeat is this long silent, and then ends,
and its store with it: node 1's second launch, which starts Python and imports torch before it connects, must
reach that store first. 5 s by default: too short for a loaded machine, and the test ends that launch itself."""


def connected_to(pid: int, port: int) -> bool:
    return any(
        connection.raddr and connection.raddr.port == port and connection.status == psutil.CONN_ESTABLISHED
        for connection in psutil.Process(pid).net_connections(kind="tcp")
    )


def test_a_node_restarted_before_the_store_host_joins_the_stores_next_launch(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int
) -> None:
    """The pods' containers restart one after another: node 1's second launch reaches the store of node 0's
    first, which is still running, and that store stops before node 1 has a seat. Node 1 then waits for the
    store node 0's second launch serves, rather than ending with the first's."""

    def start(node: int) -> subprocess.Popen:
        return nodes.start(
            *static(port, node, 2, 1),
            "--rdzv_id",
            RUN_ID,
            "--rdzv_conf",
            PATIENT_HEARTBEAT,
            worker("fails_first_launch.py"),
            out_dir,
            "-1",
        )

    old = [start(0), start(1)]
    wait_for(first_launch_running(out_dir, 2), "the worker of each node's first launch to run")
    (out_dir / "failed").touch()  # the next launch's workers succeed
    os.kill(old[1].pid, signal.SIGKILL)
    finish(old[1])
    new_1 = start(1)
    wait_for(lambda: connected_to(new_1.pid, port), "node 1's second launch to reach the first's store")
    os.kill(old[0].pid, signal.SIGTERM)
    finish(old[0])
    new_0 = start(0)
    second = nodes.finish_all([new_0, new_1])
    assert [run.returncode for run in second] == [0, 0], both(second)
    assert [record["sum"] for record in records(out_dir, 2)] == [1, 1]


# --- c10d: the first launch's rendezvous, closing ---------------------------------------------------------

CLOSING_CONF = "heartbeat_timeout=12,join_timeout=20"


def finished_first_launch(nodes: Nodes, tmp_path: Path, port: int) -> tuple[subprocess.Popen, dist.TCPStore]:
    """A first launch whose attempt ended (both nodes' workers finished) while its store's host (node 0) still
    waits to hear that node 1 left: node 1's container was restarted after its workers finished, so node 0
    finds it gone only when its heartbeat times out. Returns node 0's agent and a client of its store."""
    release = tmp_path / "release"
    old_0 = nodes.start(
        *c10d(port, RUN_ID, 2, 1),
        "--rdzv_conf",
        CLOSING_CONF,
        "--no-python",
        "sh",
        "-c",
        f"while [ ! -e {release} ]; do sleep 0.1; done",
    )
    wait_for(lambda: listeners(port), f"node 0 to serve the store on port {port}")
    old_1 = nodes.start(*c10d(port, RUN_ID, 2, 1), "--rdzv_conf", f"{CLOSING_CONF},is_host=0", "--no-python", "true")
    store = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=30))
    wait_for(lambda: int(store.add(f"xlarun/{RUN_ID}/attempt_0/done", 0)) == 1, "node 1's workers to finish")
    kill_machine(old_1.pid)
    finish(old_1)
    release.touch()
    wait_for(lambda: store.check([f"xlarun/{RUN_ID}/attempt_0/end"]), "the first launch's attempt to end")
    return old_0, store


def start_second_launch(nodes: Nodes, out_dir: Path, port: int, node: int) -> subprocess.Popen:
    conf = CLOSING_CONF if node == 0 else f"{CLOSING_CONF},is_host=0"
    return nodes.start(
        *c10d(port, RUN_ID, 2, 1), "--rdzv_conf", conf, worker("fails_first_launch.py"), out_dir, FAILING_RANK
    )


def test_a_c10d_node_reaching_the_first_launchs_closing_rendezvous_runs_in_the_next(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int
) -> None:
    """Node 1's second launch reaches the store of node 0's first launch after that launch's attempt ended,
    and waits in its rendezvous until node 0 closes it. That job is over, not one node 1 has a place in: it
    joins the rendezvous of node 0's second launch and runs its workers there."""
    (out_dir / "failed").touch()  # the second launch's workers succeed
    old_0, store = finished_first_launch(nodes, tmp_path, port)
    new_1 = start_second_launch(nodes, out_dir, port, 1)
    wait_for(
        lambda: int(store.add(f"xlarun/{RUN_ID}/unseated", 0)) == 1,
        "node 1's second launch to wait in the first launch's rendezvous",
    )
    finish(old_0)
    new_0 = start_second_launch(nodes, out_dir, port, 0)
    second = nodes.finish_all([new_0, new_1])
    assert [run.returncode for run in second] == [0, 0], both(second)
    assert [record["sum"] for record in records(out_dir, 2)] == [1, 1]


def test_a_c10d_node_finding_only_the_finished_first_launch_fails_in_one_line(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int
) -> None:
    """Where no next launch comes within its join timeout, the node that found only a finished job says so and
    fails: it ran nothing, so it never reports success."""
    (out_dir / "failed").touch()
    old_0, store = finished_first_launch(nodes, tmp_path, port)
    new_1 = start_second_launch(nodes, out_dir, port, 1)
    wait_for(
        lambda: int(store.add(f"xlarun/{RUN_ID}/unseated", 0)) == 1,
        "node 1's second launch to wait in the first launch's rendezvous",
    )
    finish(old_0)
    run = finish(new_1)
    assert run.returncode == 1, run.stderr
    assert lines(run) == [
        f"xlarun: found only a finished job of run id {RUN_ID!r} at {HOST}:{port}: it ended "
        "before this node came, and no next launch of it came within the join timeout (20 s)"
    ], run.stderr
    assert not list(out_dir.glob("*.json"))
