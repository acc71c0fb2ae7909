"""Several nodes: each node is its own xlarun agent on 127.0.0.1, meeting over static or c10d rendezvous.

The workers (tests/workers/mn_*.py) join a gloo process group through the agent store and
record what they saw in the test's ``out_dir``: ``mn_allreduce.py`` writes ``<rank>.json``,
``mn_fail.py`` writes ``<rank>.<attempt>.json`` (with its pid) and then fails or waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import XLARUN, clean_env, files_exist, finish, is_alive, run_xlarun, slack_s, wait_for, worker
from multinode import HOST, Nodes, both, c10d, lines, listeners, static, without_warnings

ALLREDUCE = worker("mn_allreduce.py")
FAIL = worker("mn_fail.py")
LOOP = worker("mn_allreduce_loop.py")
# Agents killed or stopped in these tests are noticed through heartbeats: a short timeout keeps
# the tests short, and is still far above the agents' beat interval.
HEARTBEAT = "heartbeat_timeout=3"


def by_rank(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {record["rank"]: record for record in records}


def assert_all_reduced(records: list[dict[str, Any]], world: int) -> None:
    assert sorted(record["rank"] for record in records) == list(range(world))
    assert {(record["world"], record["sum"]) for record in records} == {(world, sum(range(world)))}
    for record in records:
        assert record["env"]["RANK"] == str(record["rank"]) and record["env"]["WORLD_SIZE"] == str(world)
        assert record["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def node_ranks(records: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Global ranks by node (GROUP_RANK), in order."""
    grouped: dict[int, list[int]] = {}
    for record in sorted(records, key=lambda item: item["rank"]):
        grouped.setdefault(int(record["env"]["GROUP_RANK"]), []).append(record["rank"])
    return grouped


# ---- running together


def test_static_two_nodes_with_different_worker_counts(nodes: Nodes, out_dir: Path, port: int) -> None:
    # Node 1 starts first: it waits for node 0's store to appear.
    node1 = nodes.start(*static(port, 1, 2, 2), ALLREDUCE, out_dir)
    node0 = nodes.start(*static(port, 0, 2, 1), ALLREDUCE, out_dir)
    runs = nodes.finish_all([node0, node1])

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    records = nodes.records()
    assert_all_reduced(records, 3)
    # As torchrun: node 0's workers come first, whatever the worker counts.
    assert node_ranks(records) == {0: [0], 1: [1, 2]}
    assert {(r["env"]["LOCAL_WORLD_SIZE"], r["env"]["LOCAL_RANK"]) for r in records} == {
        ("1", "0"),
        ("2", "0"),
        ("2", "1"),
    }
    # The workers' store is the job's: the agent on node 0 serves it at --master_addr:--master_port.
    assert {(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in records} == {(HOST, str(port))}
    # What the launcher sets to quieten its own c10d client is not passed on.
    assert {r["env"]["TORCH_CPP_LOG_LEVEL"] for r in records} == {None}


def test_static_three_nodes(nodes: Nodes, out_dir: Path, port: int) -> None:
    for node_rank in (2, 0, 1):
        nodes.start(*static(port, node_rank, 3, 1), "--rdzv_id", "three", ALLREDUCE, out_dir)
    runs = nodes.finish_all()

    assert [run.returncode for run in runs] == [0, 0, 0], both(runs)
    records = nodes.records()
    assert_all_reduced(records, 3)
    assert node_ranks(records) == {0: [0], 1: [1], 2: [2]}
    assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in records} == {"three"}


def test_c10d_two_nodes(nodes: Nodes, out_dir: Path, port: int) -> None:
    nodes.start(*c10d(port, "c10d-job", 2, 2), ALLREDUCE, out_dir)
    nodes.start(*c10d(port, "c10d-job", 2, 1), ALLREDUCE, out_dir)
    runs = nodes.finish_all()

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    records = nodes.records()
    assert_all_reduced(records, 3)
    # The handler picks the node ranks; ranks then follow them: node 0's workers first.
    grouped = node_ranks(records)
    assert sorted(grouped) == [0, 1]
    assert [rank for node in sorted(grouped) for rank in grouped[node]] == [0, 1, 2]
    sizes = {
        node: {by_rank(records)[rank]["env"]["LOCAL_WORLD_SIZE"] for rank in ranks} for node, ranks in grouped.items()
    }
    assert sorted(len(ranks) for ranks in grouped.values()) == [1, 2]
    assert sizes == {node: {str(len(ranks))} for node, ranks in grouped.items()}
    assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in records} == {"c10d-job"}
    # Every worker is told the same store, on this host.
    assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in records}) == 1
    assert records[0]["env"]["MASTER_ADDR"] == HOST


def test_tcp_init_method_finds_the_agent_store(nodes: Nodes, out_dir: Path, port: int) -> None:
    # tcp:// with TORCHELASTIC_USE_AGENT_STORE=True connects to the agent's store instead of serving one.
    nodes.start(*static(port, 0, 2, 1), ALLREDUCE, out_dir, "tcp")
    nodes.start(*static(port, 1, 2, 1), ALLREDUCE, out_dir, "tcp")
    runs = nodes.finish_all()

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    assert_all_reduced(nodes.records(), 2)


# ---- failures across nodes


def test_worker_failure_on_one_node_stops_every_node(nodes: Nodes, out_dir: Path, port: int) -> None:
    # Global rank 2 is local rank 1 of node 1; it exits 3 once every worker has all-reduced.
    nodes.start(*static(port, 0, 2, 1), FAIL, out_dir, "2")
    nodes.start(*static(port, 1, 2, 2), FAIL, out_dir, "2")
    runs = nodes.finish_all()
    pids = nodes.worker_pids()

    assert [run.returncode for run in runs] == [3, 3], both(runs)
    assert len(pids) == 3 and not [pid for pid in pids if is_alive(pid)]
    for run in runs:
        root_cause = run.stderr.split("Root Cause (first observed failure):", 1)[-1]
        assert re.search(rf"^\s*host\s*:\s*{re.escape(socket.getfqdn())} \(node_rank: 1\)$", root_cause, re.M), both(
            runs
        )
        assert re.search(r"^\s*rank\s*:\s*2 \(local_rank: 1\)$", root_cause, re.M), both(runs)
        assert re.search(r"^\s*exitcode\s*:\s*3 ", root_cause, re.M), both(runs)


@pytest.mark.parametrize(
    "backend, killed",
    [("static", 1), ("static", 0), ("c10d", 0)],
    ids=["static-node1", "static-node0-store-host", "c10d-store-host"],
)
def test_agent_killed_with_sigkill_stops_the_other_node(
    nodes: Nodes, out_dir: Path, port: int, backend: str, killed: int
) -> None:
    agents = []
    for node_rank in (0, 1):
        flags = static(port, node_rank, 2, 1) if backend == "static" else c10d(port, "job", 2, 1)
        agents.append(nodes.start(*flags, "--rdzv_conf", HEARTBEAT, FAIL, out_dir, "-1"))
        # c10d: the first agent on the endpoint's host serves the store.
        wait_for(lambda: listeners(port), f"the store to listen on port {port}")
    nodes.wait_for_records(2)
    victim, survivor = agents[killed], agents[1 - killed]
    # Only the launcher: its watchdog (same command line, own pid) must stop its workers.
    left_behind = [child.pid for child in psutil.Process(victim.pid).children()]
    [victim_node] = {record["node"] for record in nodes.records() if record["pid"] in left_behind}
    os.kill(victim.pid, signal.SIGKILL)
    run = finish(survivor)
    victim.communicate()
    pids = nodes.worker_pids()

    assert run.returncode != 0, run.stderr
    last = lines(run)[-1]
    if killed == 1:
        assert last == (
            f"xlarun: node {victim_node} ({socket.getfqdn()}) stopped responding: no heartbeat for 3 s "
            "(its launcher is gone, or its host stopped or was cut off)"
        ), run.stderr
    else:
        assert last.startswith(f"xlarun: lost the rendezvous store at {HOST}:{port} "), run.stderr
        assert last.endswith(f"): node {victim_node}, which hosted it, stopped"), run.stderr
    for pid in [*pids, *left_behind]:
        wait_for(lambda: not is_alive(pid), f"process {pid} of the job to end")  # noqa: B023


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_lost_node_is_named_as_the_root_cause_within_the_heartbeat_timeout(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int, backend: str
) -> None:
    """The victim's peers fail at once in their next all-reduce (gloo: connection closed by
    peer); the root cause is still the node whose launcher vanished, and the store's host says
    so within the heartbeat timeout plus a second, without waiting out the close timeout."""
    summary = tmp_path / "summary.json"
    agents = []
    for node_rank in (0, 1):
        flags = static(port, node_rank, 2, 1) if backend == "static" else c10d(port, "job", 2, 1)
        own = ["--summary-file", summary] if node_rank == 0 else []
        agents.append(nodes.start(*flags, "--rdzv_conf", HEARTBEAT, *own, LOOP, out_dir))
        # c10d: the first agent on the endpoint's host serves the store.
        wait_for(lambda: listeners(port), f"the store to listen on port {port}")
    nodes.wait_for_records(2)
    survivor, victim = agents
    [lost] = [
        record["node"]
        for record in nodes.records()
        if record["pid"] in [child.pid for child in psutil.Process(victim.pid).children()]
    ]
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    run = finish(survivor)
    took = time.monotonic() - killed
    victim.communicate()

    assert took < 3 + slack_s(1), f"{took:.1f} s from the loss to the exit\n{run.stderr}"
    assert run.returncode == 1, run.stderr
    named = (
        f"xlarun: node {lost} ({socket.getfqdn()}) stopped responding: no heartbeat for 3 s "
        "(its launcher is gone, or its host stopped or was cut off)"
    )
    assert lines(run)[-1] == named, run.stderr
    record = json.loads(summary.read_text())
    assert (record["result"], record["exit_code"]) == ("failed", 1)
    assert record["root_cause"] == {
        "reason": "node_lost",
        "node_rank": lost,
        "host": socket.getfqdn(),
        "silent_for": 3,
        "message": named.removeprefix("xlarun: "),
        "exit_status": 1,
    }


def test_a_frozen_store_host_is_given_up_when_heartbeats_go_unanswered(nodes: Nodes, out_dir: Path, port: int) -> None:
    """A host that hangs, or is cut off without a reset, never closes its connections: the
    other node stops its workers and exits once its beats go unanswered for ``read_timeout``
    (30 s unless given)."""
    agents = [
        nodes.start(*static(port, node_rank, 2, 1), "--rdzv_conf", f"{HEARTBEAT},read_timeout=4", FAIL, out_dir, "-1")
        for node_rank in (0, 1)
    ]
    nodes.wait_for_records(2)
    frozen = [agents[0].pid, *(child.pid for child in psutil.Process(agents[0].pid).children(recursive=True))]
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        run = finish(agents[1], timeout=120)
        pids = [record["pid"] for record in nodes.records() if record["pid"] not in frozen]
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)

    assert run.returncode == 1, run.stderr
    assert lines(run)[-1] == (
        f"xlarun: lost the rendezvous store at {HOST}:{port} (no answer to a heartbeat "
        "for 4 s): node 0, which hosted it, stopped"
    ), run.stderr
    assert pids and not [pid for pid in pids if is_alive(pid)]


def test_a_store_host_paused_past_the_read_timeout_blames_no_one_for_its_own_pause(
    nodes: Nodes, out_dir: Path, port: int
) -> None:
    """Node 0's launcher is stopped (SIGSTOP) for longer than ``read_timeout``: node 1 gives its
    store up, rightly; node 0, once continued, names node 1, which went silent, never the store it
    serves itself."""
    agents = [
        nodes.start(*static(port, node_rank, 2, 1), "--rdzv_conf", f"{HEARTBEAT},read_timeout=4", FAIL, out_dir, "-1")
        for node_rank in (0, 1)
    ]
    nodes.wait_for_records(2)
    os.kill(agents[0].pid, signal.SIGSTOP)
    try:
        other = finish(agents[1], timeout=60)
    finally:
        os.kill(agents[0].pid, signal.SIGCONT)
    run = finish(agents[0])

    assert other.returncode == 1 and "node 0, which hosted it, stopped" in lines(other)[-1], other.stderr
    assert run.returncode == 1, run.stderr
    assert lines(run)[-1] == (
        f"xlarun: node 1 ({socket.getfqdn()}) stopped responding: no heartbeat for 3 s "
        "(its launcher is gone, or its host stopped or was cut off)"
    ), run.stderr
    assert "node 0" not in run.stderr and "store" not in without_warnings(run.stderr), run.stderr


@pytest.mark.parametrize("stopped", [1, 0], ids=["node1", "node0-store-host"])
def test_sigterm_to_one_agent_stops_the_other_node(nodes: Nodes, out_dir: Path, port: int, stopped: int) -> None:
    agents = [
        nodes.start(*static(port, node_rank, 2, 1), "--rdzv_conf", HEARTBEAT, FAIL, out_dir, "-1")
        for node_rank in (0, 1)
    ]
    nodes.wait_for_records(2)
    agents[stopped].send_signal(signal.SIGTERM)
    runs = nodes.finish_all(agents)
    pids = nodes.worker_pids()

    assert runs[stopped].returncode == 143, both(runs)
    assert "xlarun: received SIGTERM and stopped the workers" in lines(runs[stopped])
    other = runs[1 - stopped]
    assert other.returncode != 0, both(runs)
    assert lines(other) == [f"xlarun: node {stopped} left the job before its workers finished"], both(runs)
    assert len(pids) == 2 and not [pid for pid in pids if is_alive(pid)]


def test_nodes_restart_together(nodes: Nodes, out_dir: Path, port: int) -> None:
    # Rank 1 (node 1) fails attempts 0 and 1; attempt 2 succeeds everywhere.
    for node_rank in (0, 1):
        nodes.start(*static(port, node_rank, 2, 1), "--max_restarts", "2", FAIL, out_dir, "1", "2")
    runs = nodes.finish_all()

    assert [run.returncode for run in runs] == [0, 0], both(runs)
    records = nodes.records()
    assert sorted((r["attempt"], r["node"], r["rank"]) for r in records) == [
        (attempt, rank, rank) for attempt in (0, 1, 2) for rank in (0, 1)
    ]
    # Every attempt all-reduced (so each had a working store) with the same two ranks.
    assert {r["sum"] for r in records} == {1}
    for run in runs:
        restarts = [line for line in lines(run) if "restarting the worker group" in line]
        assert len(restarts) == 2, both(runs)
        for number, line in enumerate(restarts):
            assert f"attempt {number} failed (rank 1 on node 1 exited with code 3)" in line, both(runs)
            assert f"(restart {number + 1} of 2)" in line


@pytest.mark.parametrize("last_node", ["finishes", "is-stopped"])
def test_a_node_done_first_waits_for_the_others_past_the_join_timeout(
    nodes: Nodes, out_dir: Path, port: int, last_node: str
) -> None:
    # Node 0's worker ends at once; node 1's runs well past the join timeout, which bounds joining only.
    command = [
        "--rdzv_conf",
        f"join_timeout=2,{HEARTBEAT}",
        "--no-python",
        "sh",
        "-c",
        f"touch {out_dir}/started.$GROUP_RANK; sleep $((GROUP_RANK * 6)); touch {out_dir}/ended.$GROUP_RANK",
    ]
    agents = [nodes.start(*static(port, node_rank, 2, 1), *command) for node_rank in (0, 1)]
    if last_node == "is-stopped":
        wait_for(files_exist(out_dir / "ended.0", out_dir / "started.1"), "node 0's worker to end")
        agents[1].send_signal(signal.SIGTERM)
    runs = nodes.finish_all(agents)

    if last_node == "finishes":
        assert [run.returncode for run in runs] == [0, 0], both(runs)
        assert (out_dir / "ended.1").exists()
    else:
        assert [run.returncode for run in runs] == [1, 143], both(runs)
        assert lines(runs[0]) == ["xlarun: node 1 left the job before its workers finished"], both(runs)


# ---- joining


def test_join_timeout_names_the_missing_nodes(out_dir: Path, port: int) -> None:
    run = run_xlarun(*static(port, 0, 2, 1), "--rdzv_conf", "join_timeout=3", ALLREDUCE, out_dir)

    assert run.returncode == 1
    assert lines(run) == ["xlarun: 1 of 2 nodes joined in 3 s; missing node ranks: 1"]
    assert list(out_dir.iterdir()) == []


def test_a_launcher_error_still_leaves_the_summary_file(tmp_path: Path, out_dir: Path, port: int) -> None:
    summary = tmp_path / "summary.json"
    run = run_xlarun(
        *static(port, 0, 2, 1), "--rdzv_conf", "join_timeout=2", "--summary-file", summary, ALLREDUCE, out_dir
    )

    assert run.returncode == 1
    record = json.loads(summary.read_text())
    assert (record["exit_code"], record["result"]) == (1, "launcher_error")
    assert record["error"] == "1 of 2 nodes joined in 2 s; missing node ranks: 1"
    assert record["attempts"] == []


def test_c10d_join_timeout_is_one_line(out_dir: Path, port: int) -> None:
    # c10d hands out node ranks only once enough nodes came, so the line says what to start instead.
    run = run_xlarun(*c10d(port, "late", 2, 1), "--rdzv_conf", "join_timeout=3", ALLREDUCE, out_dir)

    assert run.returncode == 1
    assert lines(run) == [
        f"xlarun: 1 of 2 nodes joined in 3 s at {HOST}:{port} (run id 'late'): start the missing "
        "nodes with the same --rdzv-endpoint and --rdzv-id"
    ]
    assert list(out_dir.iterdir()) == []


def test_waiting_on_a_terminal_is_one_status_line(out_dir: Path, port: int) -> None:
    primary, secondary = os.openpty()
    process = subprocess.Popen(
        [*XLARUN, *static(port, 0, 2, 1), "--rdzv_conf", "join_timeout=2", ALLREDUCE, out_dir],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=secondary,
    )
    os.close(secondary)
    terminal = without_warnings(read_terminal(primary))
    process.wait()

    assert process.returncode == 1
    # The status line rewrites itself in place; the timeout's line replaces it.
    shown, final = terminal.rstrip("\r\n").rsplit("\r", 1)
    assert "\n" not in shown and "xlarun: waiting for nodes: 1/2 (" in shown, terminal
    assert final == "\x1b[Kxlarun: 1 of 2 nodes joined in 2 s; missing node ranks: 1", terminal


def read_terminal(primary: int) -> str:
    """All a process wrote to the pseudo-terminal ``primary`` until it closed its side."""
    chunks = []
    with os.fdopen(primary, "rb", buffering=0) as terminal:
        while True:
            try:
                chunk = terminal.read(4096)
            except OSError:  # EIO: every writer has closed the other side
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode()


def test_unreachable_store_is_one_line(out_dir: Path, port: int) -> None:
    run = run_xlarun(*static(port, 1, 2, 1), "--rdzv_conf", "join_timeout=2", ALLREDUCE, out_dir)

    assert run.returncode == 1
    [line] = lines(run)
    assert line.startswith(f"xlarun: cannot reach the rendezvous store at {HOST}:{port} after 2 s ")
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize(
    "job_conf, job_env, stray_flags, stray_env, reason",
    [
        ((), {}, ("--rdzv_id", "other"), {}, "serves run id 'job', not 'other'"),
        (("--rdzv_conf", "token=s3cret"), {}, ("--rdzv_conf", "token=guess"), {}, "token does not match"),
        ((), {"XLARUN_RDZV_TOKEN": "s3cret"}, (), {}, "token does not match"),
    ],
    ids=["run-id", "token-flag", "token-env"],
)
def test_stray_agent_is_refused_and_the_job_goes_on(
    nodes: Nodes, out_dir: Path, port: int, job_conf, job_env, stray_flags, stray_env, reason
) -> None:
    node0 = nodes.start(*static(port, 0, 2, 1), "--rdzv_id", "job", *job_conf, ALLREDUCE, out_dir, env=job_env)
    stray = run_xlarun(*static(port, 1, 2, 1), "--rdzv_id", "job", *stray_flags, ALLREDUCE, out_dir, env=stray_env)
    node1 = nodes.start(*static(port, 1, 2, 1), "--rdzv_id", "job", *job_conf, ALLREDUCE, out_dir, env=job_env)
    runs = nodes.finish_all([node0, node1])

    assert stray.returncode == 1
    [refusal] = lines(stray)
    assert refusal.startswith("xlarun: refused: ") and reason in refusal
    assert [run.returncode for run in runs] == [0, 0], both(runs)
    assert len([line for line in lines(runs[0]) if line.startswith("xlarun: refused an agent")]) == 1, both(runs)
    assert_all_reduced(nodes.records(), 2)


def test_a_node_that_plans_another_node_count_is_refused_as_a_usage_error(
    nodes: Nodes, out_dir: Path, port: int
) -> None:
    node0 = nodes.start(*static(port, 0, 2, 1), ALLREDUCE, out_dir)
    misplanned = run_xlarun(*static(port, 1, 3, 1), ALLREDUCE, out_dir)
    node1 = nodes.start(*static(port, 1, 2, 1), ALLREDUCE, out_dir)
    runs = nodes.finish_all([node0, node1])

    assert misplanned.returncode == 2, misplanned.stderr
    assert lines(misplanned) == [
        "xlarun: error: node 1 plans 3 nodes but node 0 plans 2: give every node the same --nnodes"
    ]
    assert [run.returncode for run in runs] == [0, 0], both(runs)
    assert (
        len(
            [
                line
                for line in lines(runs[0])
                if line.startswith("xlarun: refused an agent: ")
                and line.endswith("node 1 plans 3 nodes but node 0 plans 2: give every node the same --nnodes")
            ]
        )
        == 1
    )
    assert_all_reduced(nodes.records(), 2)


def test_second_agent_with_a_taken_node_rank_is_refused_and_the_job_goes_on(
    nodes: Nodes, out_dir: Path, port: int
) -> None:
    node0 = nodes.start(*static(port, 0, 3, 1), ALLREDUCE, out_dir)
    # Two agents claim node rank 1: whichever comes second is turned away.
    claimants = [nodes.start(*static(port, 1, 3, 1), ALLREDUCE, out_dir) for _ in range(2)]
    node2 = nodes.start(*static(port, 2, 3, 1), ALLREDUCE, out_dir)
    runs = nodes.finish_all([node0, *claimants, node2])

    refused = [run for run in runs if run.returncode != 0]
    assert len(refused) == 1, both(runs)
    assert lines(refused[0]) == ["xlarun: node rank 1 already joined run 'none': give each node its own --node-rank"]
    assert runs[0].returncode == runs[3].returncode == 0, both(runs)
    assert_all_reduced(nodes.records(), 3)


def test_taken_port_is_one_line_and_starts_nothing(out_dir: Path, port: int) -> None:
    marker = out_dir / "ran"
    with socket.socket() as taken:
        taken.bind((HOST, port))
        taken.listen()
        run = run_xlarun(*static(port, 0, 2, 1), worker("marker.py"), marker)

    assert run.returncode == 2
    [line] = lines(run)
    assert line.startswith(f"xlarun: error: cannot serve the rendezvous store on {HOST}:{port}: ")
    assert not marker.exists()


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_store_listens_only_on_the_given_address(nodes: Nodes, out_dir: Path, port: int, backend: str) -> None:
    flags = static(port, 0, 2, 1) if backend == "static" else c10d(port, "job", 2, 1)
    node0 = nodes.start(*flags, ALLREDUCE, out_dir)
    wait_for(lambda: listeners(port), f"the store to listen on port {port}")

    assert listeners(port) == [(HOST, node0.pid)]
    # Still waiting for node 1: a stop signal ends the wait at once.
    node0.send_signal(signal.SIGTERM)
    run = finish(node0)
    assert run.returncode == 143
    assert lines(run)[-1] == "xlarun: received SIGTERM while waiting for the other nodes"


def test_the_rendezvous_needs_neither_the_report_nor_the_supervisor() -> None:
    """Failure records pass between nodes without pulling in the process supervision."""
    code = (
        "import sys, xlarun.rendezvous; "
        "print(sorted(name for name in ('xlarun.supervision.report', 'xlarun.supervision.group') if name in sys.modules))"
    )
    completed = subprocess.run([XLARUN[0], "-c", code], capture_output=True, text=True, env=clean_env())
    assert completed.stdout.strip() == "[]", completed.stderr
