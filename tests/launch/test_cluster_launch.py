"""--cluster on the command line: the plan ``--dry-run`` prints for each cluster's recorded environment.

Each environment comes from tests/fixtures/cluster/<name>.json (what the scheduler sets on one
node); the plan must show the node's place in the job derived from it, with explicit flags and
``--cluster none`` taking precedence.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import REPO, TESTS, plan, run_xlarun

from xlarun.planning.cluster import slurm_master_port
from xlarun.planning.dryrun import DECIDED_AT_RENDEZVOUS
from xlarun.planning.packages import LONE_NODE_ON_A_FREE_PORT, followed_torchrun

FIXTURES = TESTS / "fixtures" / "cluster"
SCRIPT = str(REPO / "examples" / "allreduce.py")


def cluster_env(name: str) -> dict[str, str]:
    return json.loads((FIXTURES / f"{name}.json").read_text())["environ"]


def node_plan(*flags: str, fixture: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The dry-run plan for ``xlarun FLAGS SCRIPT`` on the node ``fixture`` describes, ``env`` added."""
    return plan(*flags, SCRIPT, env={**cluster_env(fixture), **(env or {})})


def place(document: dict[str, Any]) -> dict[str, Any]:
    """The fields the cluster derives, and the global ranks of this node's workers."""
    return {
        "nnodes": document["nnodes"],
        "node_rank": document["node_rank"],
        "master_addr": document["master_addr"],
        "master_port": document["master_port"],
        "run_id": document["run_id"],
        "ranks": [spec["rank"] for spec in document["workers"]],
    }


@pytest.mark.parametrize(
    "kind, fixture, flags, expected",
    [
        (
            "slurm",
            "slurm_step_node1",
            ("--nproc_per_node", "2"),
            {
                "nnodes": [2, 2],
                "node_rank": 1,
                "master_addr": "n1",
                "master_port": slurm_master_port(5, 1),
                "run_id": "5.1",
                "ranks": [2, 3],
            },
        ),
        # The operator's nprocPerNode (4) sets the worker count when no flag does.
        (
            "k8s",
            "k8s_pytorchjob_worker1",
            (),
            {
                "nnodes": [3, 3],
                "node_rank": 2,
                "master_addr": "bert-master-0",
                "master_port": 23456,
                "run_id": "none",
                "ranks": [8, 9, 10, 11],
            },
        ),
        (
            "gke-tpu",
            "gke_tpu_worker1",
            ("--nproc_per_node", "2"),
            {
                "nnodes": [4, 4],
                "node_rank": 1,
                "master_addr": "llama-slice-job-0-0.llama",
                "master_port": 29500,
                "run_id": "none",
                "ranks": [2, 3],
            },
        ),
        # Open MPI names no master: the address is a flag, the rest comes from mpirun.
        (
            "mpi",
            "mpi_npernode1_rank1",
            ("--nproc_per_node", "2", "--master_addr", "node-a"),
            {
                "nnodes": [2, 2],
                "node_rank": 1,
                "master_addr": "node-a",
                "master_port": 29500,
                "run_id": "1234370561",
                "ranks": [2, 3],
            },
        ),
    ],
)
def test_dry_run_shows_the_place_the_cluster_gives_this_node(kind, fixture, flags, expected):
    assert place(node_plan("--cluster", kind, *flags, fixture=fixture)) == expected


def test_auto_finds_the_cluster_it_runs_in():
    found = place(node_plan("--cluster", "auto", "--nproc_per_node", "2", fixture="slurm_step_node1"))
    assert (found["nnodes"], found["node_rank"], found["run_id"]) == ([2, 2], 1, "5.1")


def test_explicit_flags_win_over_the_clusters_values():
    document = node_plan(
        "--cluster",
        "slurm",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "10.1.2.3",
        "--master_port",
        "12345",
        "--rdzv_id",
        "mine",
        fixture="slurm_step_node1",
    )
    assert place(document) == {
        "nnodes": [2, 2],
        "node_rank": 1,
        "master_addr": "10.1.2.3",
        "master_port": 12345,
        "run_id": "mine",
        "ranks": [2, 3],
    }


def test_explicit_worker_count_wins_over_the_operators():
    document = node_plan("--cluster", "k8s", "--nproc_per_node", "1", fixture="k8s_pytorchjob_worker1")
    assert (document["nproc_per_node"], document["world_size"], place(document)["ranks"]) == (1, 3, [2])


def test_cluster_from_the_environment_variable():
    document = node_plan("--nproc_per_node", "2", fixture="slurm_step_node1", env={"XLARUN_CLUSTER": "slurm"})
    assert (document["nnodes"], document["node_rank"], document["run_id"]) == ([2, 2], 1, "5.1")


def test_flag_wins_over_the_environment_variable():
    document = node_plan(
        "--cluster",
        "none",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29500",
        fixture="slurm_step_node1",
        env={"XLARUN_CLUSTER": "slurm"},
    )
    assert (document["nnodes"], document["node_rank"], document["run_id"]) == ([1, 1], 0, "none")


def test_without_cluster_a_slurm_job_runs_as_plain_torchrun_would():
    document = node_plan("--nproc_per_node", "2", fixture="slurm_step_node1")
    # As the installed torch's torchrun: a lone node without a master port takes 29500 before 2.12,
    # a free port and a fresh run id from 2.12 on.
    lone = (
        {"master_addr": "127.0.0.1", "master_port": 29500, "run_id": "none"}
        if followed_torchrun() < LONE_NODE_ON_A_FREE_PORT
        else {"master_addr": "localhost", "master_port": DECIDED_AT_RENDEZVOUS, "run_id": DECIDED_AT_RENDEZVOUS}
    )
    assert place(document) == {"nnodes": [1, 1], "node_rank": 0, **lone, "ranks": [0, 1]}


@pytest.mark.parametrize(
    "flags, env, source",
    [
        (("--cluster", "bogus"), {}, "--cluster"),
        ((), {"XLARUN_CLUSTER": "bogus"}, "--cluster (from XLARUN_CLUSTER)"),
    ],
)
def test_unknown_cluster_is_a_usage_error(flags, env, source):
    run = run_xlarun(
        "--dry-run", *flags, "--nproc_per_node", "2", SCRIPT, env={**cluster_env("slurm_step_node1"), **env}
    )
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"xlarun: error: {source}='bogus' is invalid: expected one of none, auto, slurm, k8s, gke-tpu, tpu-vm, mpi"
    ]


def test_a_refusal_names_the_scheduler_variable_that_set_a_value():
    # Nobody typed --nnodes: the step's node count did, and the refusal says so.
    run = run_xlarun("--cluster", "auto", "--standalone", SCRIPT, env=cluster_env("slurm_step_node1"))
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        "xlarun: error: --standalone runs a single node, but --nnodes=2 (from --cluster slurm: SLURM_STEP_NUM_NODES): "
        "drop one of them"
    ]


def test_cluster_settings_that_do_not_fit_are_a_usage_error():
    # Two tasks per node would start two agents per node: refused in one line.
    run = run_xlarun("--dry-run", "--cluster", "slurm", SCRIPT, env=cluster_env("slurm_step_two_tasks_per_node"))
    assert run.returncode == 2
    [line] = run.stderr.splitlines()
    assert line.startswith("xlarun: error: ") and "--ntasks-per-node=1" in line


# ---- TPU multislice (MegaScale) on GKE: a JobSet of 2 slices x 2 hosts

MEGASCALE = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID")


def multislice_pod(slice_id: int, worker: int, **changes: str) -> dict[str, str]:
    """The environment of worker ``worker`` of slice ``slice_id`` in the recorded JobSet, ``changes`` applied."""
    environ = {
        **cluster_env("gke_tpu_multislice_slice1_worker0"),
        "MEGASCALE_SLICE_ID": str(slice_id),
        "TPU_WORKER_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": f"llama-slice-{slice_id}-0.llama,llama-slice-{slice_id}-1.llama",
        **changes,
    }
    return {name: value for name, value in environ.items() if value}


@pytest.mark.parametrize(
    "changes, flags, coordinator",
    [
        ({}, (), "llama-slice-0-0.llama:8080"),
        # No coordinator: node 0 is it, at MegaScale's default port; slices past 0 are given node 0's address.
        (
            {"MEGASCALE_COORDINATOR_ADDRESS": ""},
            ("--master-addr", "llama-slice-0-0.llama"),
            "llama-slice-0-0.llama:8080",
        ),
        (
            {"MEGASCALE_COORDINATOR_ADDRESS": "", "MEGASCALE_PORT": "8081"},
            ("--master-addr", "llama-slice-0-0.llama"),
            "llama-slice-0-0.llama:8081",
        ),
    ],
)
def test_the_four_hosts_of_a_gke_multislice_job_plan_one_job(changes, flags, coordinator):
    plans = [
        plan(
            "--cluster",
            "gke-tpu",
            "--device",
            "tpu",
            "--nproc-per-node",
            "4",
            *flags,
            SCRIPT,
            env=multislice_pod(slice_id, worker, **changes),
        )
        for slice_id in (0, 1)
        for worker in (0, 1)
    ]
    assert [document["node_rank"] for document in plans] == [0, 1, 2, 3]
    assert {(tuple(document["nnodes"]), document["master_addr"], document["run_id"]) for document in plans} == {
        ((4, 4), "llama-slice-0-0.llama", "none")
    }
    assert [spec["rank"] for spec in plans[3]["workers"]] == [12, 13, 14, 15]
    for index, document in enumerate(plans):
        assert [{name: spec["env"][name] for name in MEGASCALE} for spec in document["workers"]] == [
            {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": str(index // 2),
            }
        ] * 4


@pytest.mark.parametrize(
    "changes, complaint",
    [
        (
            {"MEGASCALE_COORDINATOR_ADDRESS": "llama-slice-0-0.llama"},
            "MEGASCALE_COORDINATOR_ADDRESS='llama-slice-0-0.llama' has no port",
        ),
        ({"MEGASCALE_SLICE_ID": "2"}, "MEGASCALE_SLICE_ID=2 is outside"),
        ({"SKIP_MEGASCALE_PJRT_CLIENT": "1"}, "SKIP_MEGASCALE_PJRT_CLIENT is set"),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "launch"])
def test_a_gke_multislice_job_xlarun_cannot_plan_is_refused_in_one_line(changes, complaint, dry_run, tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w')\n")
    result = run_xlarun(
        "--cluster",
        "gke-tpu",
        "--device",
        "tpu",
        *(["--dry-run"] if dry_run else []),
        script,
        env=multislice_pod(1, 0, **changes),
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"xlarun: error: --cluster gke-tpu: {complaint}"), result.stderr
    assert not marker.exists()
