"""``--rdzv-endpoint`` on one node, as torchrun reads it: the same gloo job under both launchers.

- static: the endpoint, when given, is where the workers' store is (MASTER_ADDR and MASTER_PORT),
  over ``--master-addr`` and ``--master-port`` (pytorch/examples' ``distributed/ddp/run_example.sh``);
- c10d at port 0 (what torchrun's ``--standalone`` expands to): the store takes a free port on
  the endpoint's host; several nodes could never reach it, so that is refused before anything starts.

Each case all-reduces the ranks over gloo with ``env://`` and compares the exit code, what the
workers saw and the time taken with torchrun's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import free_port, run_torchrun, run_xlarun, worker

# A launcher slower than torchrun by more than this has waited for something torchrun does not.
SLACK_S = 10.0


def run_both(tmp_path: Path, args: list[object]) -> dict[str, tuple[float, dict[int, dict]]]:
    """Run ``mn_allreduce.py`` under each launcher with ``args``: the seconds taken and each rank's record."""
    outcomes = {}
    for name, run in (("torchrun", run_torchrun), ("xlarun", run_xlarun)):
        out = tmp_path / name
        out.mkdir()
        started = time.monotonic()
        result = run(*args, "--nproc_per_node", "2", worker("mn_allreduce.py"), out)
        elapsed = time.monotonic() - started
        assert result.returncode == 0, f"{name} exited {result.returncode} after {elapsed:.0f} s:\n{result.stderr}"
        outcomes[name] = (elapsed, {int(path.stem): json.loads(path.read_text()) for path in out.glob("*.json")})
    torchrun_s, xlarun_s = outcomes["torchrun"][0], outcomes["xlarun"][0]
    assert xlarun_s < torchrun_s + SLACK_S, f"xlarun took {xlarun_s:.1f} s, torchrun {torchrun_s:.1f} s"
    for _, records in outcomes.values():
        assert sorted(records) == [0, 1]
        assert {record["sum"] for record in records.values()} == {1}
    return outcomes


def store_of(records: dict[int, dict]) -> set[tuple[str, str]]:
    return {(record["env"]["MASTER_ADDR"], record["env"]["MASTER_PORT"]) for record in records.values()}


@pytest.mark.parametrize("master_port", [False, True], ids=["endpoint", "endpoint over a master port"])
def test_static_endpoint_on_one_node_is_the_workers_store(tmp_path: Path, master_port: bool) -> None:
    port = free_port()
    args: list[object] = ["--nnodes=1", "--rdzv_id=101", f"--rdzv_endpoint=localhost:{port}"]
    if master_port:
        args += ["--master_port", free_port()]
    outcomes = run_both(tmp_path, args)
    for _, records in outcomes.values():
        assert store_of(records) == {("localhost", str(port))}


def test_c10d_endpoint_at_port_0_runs_on_a_free_port(tmp_path: Path) -> None:
    outcomes = run_both(tmp_path, ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"])
    for _, records in outcomes.values():
        ((host, port),) = store_of(records)
        assert host == "localhost" and 0 < int(port) < 65536


@pytest.mark.parametrize(
    "args",
    [
        ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"],
        ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"],
        ["--nnodes", "2", "--node_rank", "0", "--rdzv-endpoint", "localhost:0"],
        ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "is_host=0"],
    ],
    ids=["c10d, two nodes", "c10d, up to two nodes", "static, two nodes", "c10d, another host serves"],
)
def test_a_store_at_port_0_that_another_launcher_must_reach_is_refused(tmp_path: Path, args: list[str]) -> None:
    """Only the launcher serving the store learns the port it takes: no other one can reach it.

    torchrun starts, and its nodes each serve a store of their own and wait out the join
    timeout (600 s by default); xlarun says why at once.
    """
    marker = tmp_path / "marker"
    started = time.monotonic()
    result = run_xlarun(*args, worker("marker.py"), marker)
    assert time.monotonic() - started < SLACK_S
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "localhost:0" in line and "--rdzv-endpoint" in line
    assert not marker.exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.0.2.1:0"], "192.0.2.1"),
        (["--nnodes", "1", "--rdzv-endpoint", "localhost", "--master_port", "0"], "'localhost'"),
    ],
    ids=["port 0 on another host", "static endpoint without a port"],
)
def test_an_endpoint_torchrun_cannot_start_from_is_refused(tmp_path: Path, args: list[str], named: str) -> None:
    """torchrun fails on each: it reaches for a store at another host's port 0, or raises "port is
    missing in endpoint" with a traceback. xlarun says why in one line, exit 2, nothing started."""
    marker = tmp_path / "marker"
    result = run_xlarun(*args, worker("marker.py"), marker)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert named in line and "--rdzv-endpoint" in line
    assert not marker.exists()
