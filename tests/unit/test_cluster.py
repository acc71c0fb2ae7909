"""--cluster: each cluster's variables, read from environments recorded in tests/fixtures/cluster."""

from __future__ import annotations

import json
import re
from typing import get_args

import pytest
from helpers import TESTS, prepare, refusal

from xlarun.cli.options import CLUSTER_KINDS
from xlarun.exceptions import UsageError
from xlarun.planning.cluster import (
    SLURM_PORT_BASE,
    SLURM_PORT_BLOCK,
    SLURM_PORT_BLOCKS,
    ClusterSettings,
    SchedulerKind,
    detect_cluster,
    slurm_master_port,
)

FIXTURES = TESTS / "fixtures" / "cluster"


def fixture(name: str, **changes: str | None) -> dict[str, str]:
    """The environment recorded in ``name``.json, with variables changed (None removes one)."""
    environ = json.loads((FIXTURES / f"{name}.json").read_text())["environ"]
    for variable, value in changes.items():
        if value is None:
            environ.pop(variable, None)
        else:
            environ[variable] = value
    return environ


# ---- Slurm


def test_slurm_step_of_a_two_node_job():
    settings = detect_cluster("slurm", fixture("slurm_step_node1"))
    assert settings == ClusterSettings(
        kind="slurm", nnodes=2, node_rank=1, master_addr="n1", master_port=slurm_master_port(5, 1), run_id="5.1"
    )


def test_slurm_step_on_part_of_the_job_reads_the_steps_nodes():
    settings = detect_cluster("slurm", fixture("slurm_substep_n2"))
    assert settings == ClusterSettings(
        kind="slurm", nnodes=1, node_rank=0, master_addr="n2", master_port=slurm_master_port(5, 0), run_id="5.0"
    )
    settings = detect_cluster("slurm", fixture("slurm_step_subset_trn004"))
    assert settings == ClusterSettings(
        kind="slurm",
        nnodes=3,
        node_rank=1,
        master_addr="trn003",
        master_port=slurm_master_port(4242, 3),
        run_id="4242.3",
    )


def test_slurm_step_node_count_survives_srun_preserve_env():
    # srun --preserve-env leaves SLURM_NNODES at the job's node count.
    settings = detect_cluster("slurm", fixture("slurm_step_subset_trn004", SLURM_NNODES="5"))
    assert settings.nnodes == 3


def test_slurm_step_without_step_node_count_falls_back_to_slurm_nnodes():
    settings = detect_cluster("slurm", fixture("slurm_step_subset_trn004", SLURM_STEP_NUM_NODES=None))
    assert (settings.nnodes, settings.node_rank) == (3, 1)


def test_slurm_every_node_of_a_step_computes_the_same_master():
    nodes = [detect_cluster("slurm", fixture("slurm_step_subset_trn004", SLURM_NODEID=str(rank))) for rank in range(3)]
    assert [node.node_rank for node in nodes] == [0, 1, 2]
    assert {(node.master_addr, node.master_port, node.run_id, node.nnodes) for node in nodes} == {
        ("trn003", slurm_master_port(4242, 3), "4242.3", 3)
    }


def test_slurm_step_with_several_tasks_per_node_is_refused():
    with pytest.raises(UsageError, match=r"SLURM_STEP_TASKS_PER_NODE=2\(x2\).*--ntasks-per-node=1"):
        detect_cluster("slurm", fixture("slurm_step_two_tasks_per_node"))


@pytest.mark.parametrize("tasks", ["1", "1(x3)", "1,1(x2)"])
def test_slurm_one_task_per_node_forms_are_accepted(tasks):
    settings = detect_cluster("slurm", fixture("slurm_step_subset_trn004", SLURM_STEP_TASKS_PER_NODE=tasks))
    assert settings.node_rank == 1


def test_slurm_uneven_tasks_per_node_are_refused():
    with pytest.raises(UsageError, match="once per node"):
        detect_cluster("slurm", fixture("slurm_step_subset_trn004", SLURM_STEP_TASKS_PER_NODE="1(x2),2"))


def test_slurm_one_node_batch_script_runs_as_node_0():
    settings = detect_cluster("slurm", fixture("slurm_batch_one_node"))
    assert settings == ClusterSettings(
        kind="slurm", nnodes=1, node_rank=0, master_addr="n1", master_port=slurm_master_port(6, 0), run_id="6"
    )


def test_slurm_multi_node_batch_script_outside_srun_is_refused():
    with pytest.raises(UsageError, match=r"2 nodes but xlarun runs outside a job step.*srun --ntasks-per-node=1"):
        detect_cluster("slurm", fixture("slurm_batch_two_nodes"))


def test_slurm_old_variable_names_are_read():
    environ = fixture("slurm_batch_one_node", SLURM_JOB_ID=None, SLURM_JOB_NUM_NODES=None, SLURM_JOB_NODELIST=None)
    settings = detect_cluster("slurm", environ)
    assert (settings.run_id, settings.nnodes, settings.master_addr) == ("6", 1, "n1")


def test_slurm_missing_variables_are_all_named():
    environ = fixture("slurm_step_node1", SLURM_JOB_ID=None, SLURM_JOBID=None, SLURM_NODEID=None)
    with pytest.raises(UsageError) as refused:
        detect_cluster("slurm", environ)
    message = str(refused.value)
    assert "SLURM_JOB_ID (or SLURM_JOBID)" in message
    assert "SLURM_NODEID" in message
    assert "SLURM_STEP_NODELIST" not in message


@pytest.mark.parametrize(
    "changes, complaint",
    [
        ({"SLURM_NODEID": "3"}, "SLURM_NODEID=3 is not below the node count 3"),
        ({"SLURM_NODEID": "-1"}, "SLURM_NODEID='-1' is not a whole number"),
        ({"SLURM_STEP_NUM_NODES": "0"}, "SLURM_STEP_NUM_NODES='0' is not a positive whole number"),
        ({"SLURM_STEP_NODELIST": "trn[003-004,010"}, "never closed"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x)"}, "not Slurm's counts form"),
    ],
)
def test_slurm_malformed_variables_are_refused(changes, complaint):
    with pytest.raises(UsageError, match=re.escape(complaint)):
        detect_cluster("slurm", fixture("slurm_step_subset_trn004", **changes))


def test_slurm_master_port_rule():
    assert slurm_master_port(0, 0) == 15000
    assert slurm_master_port(4242, 3) == 15000 + 4 * ((4242 + 97 * 3) % 2500)
    ports = [slurm_master_port(job, step) for job in range(5000) for step in range(4)]
    assert min(ports) == SLURM_PORT_BASE
    assert max(ports) == SLURM_PORT_BASE + SLURM_PORT_BLOCK * (SLURM_PORT_BLOCKS - 1)
    assert all(port % SLURM_PORT_BLOCK == 0 for port in ports)


def test_slurm_ports_of_neighbouring_jobs_and_steps_do_not_collide():
    first_steps = {slurm_master_port(job, 0) for job in range(10_000, 10_000 + SLURM_PORT_BLOCKS)}
    assert len(first_steps) == SLURM_PORT_BLOCKS
    steps_of_one_job = {slurm_master_port(77_123, step) for step in range(SLURM_PORT_BLOCKS)}
    assert len(steps_of_one_job) == SLURM_PORT_BLOCKS
    # Their blocks are disjoint too, so ports derived as MASTER_PORT+1..+3 stay the step's own.
    blocks = {port + offset for port in first_steps for offset in range(SLURM_PORT_BLOCK)}
    assert len(blocks) == SLURM_PORT_BLOCK * SLURM_PORT_BLOCKS


# ---- Kubeflow PyTorchJob


def test_k8s_master_pod_names_itself_by_pod_name_not_localhost():
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_master"))
    assert settings == ClusterSettings(
        kind="k8s", nnodes=3, node_rank=0, master_addr="bert-master-0", master_port=23456, run_id=None, nproc_per_node=4
    )


def test_k8s_worker_pod_reads_the_pet_variables():
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_worker1"))
    assert settings == ClusterSettings(
        kind="k8s", nnodes=3, node_rank=2, master_addr="bert-master-0", master_port=23456, run_id=None, nproc_per_node=4
    )


def test_k8s_world_size_counting_processes_is_not_taken_for_nodes():
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", PET_NPROC_PER_NODE="4"))
    assert settings.nnodes == 3  # not WORLD_SIZE=12
    with pytest.raises(UsageError, match="missing PET_NNODES;"):
        detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", PET_NNODES=None))


def test_k8s_operator_without_nproc_per_node_counts_pods():
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_legacy_worker0"))
    assert settings == ClusterSettings(
        kind="k8s",
        nnodes=3,
        node_rank=1,
        master_addr="resnet-master-0",
        master_port=23456,
        run_id=None,
        nproc_per_node=None,
    )


@pytest.mark.parametrize("value", ["auto", "gpu", "cpu"])
def test_k8s_symbolic_nproc_per_node_is_left_to_the_launcher(value):
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", PET_NPROC_PER_NODE=value))
    assert settings.nproc_per_node is None


def test_k8s_master_without_hostname_keeps_the_operators_address():
    settings = detect_cluster("k8s", fixture("k8s_pytorchjob_master", HOSTNAME=None))
    assert settings.master_addr == "localhost"


def test_k8s_single_pod_job_keeps_localhost():
    environ = fixture("k8s_pytorchjob_master", PET_NNODES="1", WORLD_SIZE="4")
    assert detect_cluster("k8s", environ).master_addr == "localhost"


def test_k8s_fixed_size_range_counts_as_static():
    assert detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", PET_NNODES="3:3")).nnodes == 3


def test_k8s_elastic_job_is_refused_when_asked_for():
    with pytest.raises(UsageError, match="PET_NNODES=1:3 is an elastic PyTorchJob"):
        detect_cluster("k8s", fixture("k8s_pytorchjob_elastic"))


def test_k8s_missing_variables_are_all_named():
    with pytest.raises(
        UsageError,
        match=r"missing PET_NNODES \(or WORLD_SIZE\), PET_NODE_RANK \(or RANK\),"
        r" PET_MASTER_ADDR \(or MASTER_ADDR\)",
    ):
        detect_cluster("k8s", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


@pytest.mark.parametrize(
    "changes, complaint",
    [
        ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT=70000 is not a TCP port"),
        ({"PET_NODE_RANK": "3"}, "PET_NODE_RANK=3 is not below the node count 3"),
        ({"PET_NNODES": "three"}, "PET_NNODES='three' is not a positive whole number"),
    ],
)
def test_k8s_malformed_variables_are_refused(changes, complaint):
    with pytest.raises(UsageError, match=re.escape(complaint)):
        detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", **changes))


# ---- GKE TPU


def test_gke_tpu_worker_reads_its_slice():
    settings = detect_cluster("gke-tpu", fixture("gke_tpu_worker1"))
    assert settings == ClusterSettings(
        kind="gke-tpu", nnodes=4, node_rank=1, master_addr="llama-slice-job-0-0.llama", master_port=None, run_id=None
    )


def multislice_host(slice_id: int, worker: int, **changes: str | None) -> dict[str, str]:
    """The pod of worker ``worker`` of slice ``slice_id`` in the recorded 2 slices x 2 hosts JobSet."""
    hosts = f"llama-slice-{slice_id}-0.llama,llama-slice-{slice_id}-1.llama"
    return fixture(
        "gke_tpu_multislice_slice1_worker0",
        MEGASCALE_SLICE_ID=str(slice_id),
        TPU_WORKER_ID=str(worker),
        TPU_WORKER_HOSTNAMES=hosts,
        **changes,
    )


def test_gke_tpu_multislice_numbers_the_nodes_slice_by_slice_with_node_0_at_the_coordinator():
    found = [detect_cluster("gke-tpu", multislice_host(slice_id, worker)) for slice_id in (0, 1) for worker in (0, 1)]
    assert [settings.node_rank for settings in found] == [0, 1, 2, 3]
    assert {(settings.nnodes, settings.master_addr, settings.run_id) for settings in found} == {
        (4, "llama-slice-0-0.llama", None)
    }
    assert found[2].read_from["node_rank"] == "MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID, TPU_WORKER_ID"
    assert detect_cluster("gke-tpu", fixture("gke_tpu_worker1", MEGASCALE_NUM_SLICES="1")).nnodes == 4


def test_auto_finds_a_gke_multislice_job():
    found = detect_cluster("auto", multislice_host(1, 1))
    assert found is not None and (found.kind, found.node_rank, found.nnodes) == ("gke-tpu", 3, 4)


def test_gke_tpu_multislice_without_a_coordinator_knows_node_0_on_slice_0_only():
    assert detect_cluster("gke-tpu", multislice_host(0, 1, MEGASCALE_COORDINATOR_ADDRESS=None)).master_addr == (
        "llama-slice-0-0.llama"
    )
    settings = detect_cluster("gke-tpu", multislice_host(1, 1, MEGASCALE_COORDINATOR_ADDRESS=None))
    assert (settings.node_rank, settings.master_addr) == (3, None)
    with pytest.raises(UsageError, match="cannot tell where node 0 runs; pass --master-addr"):
        settings.resolve_master_addr(None)


@pytest.mark.parametrize(
    "changes, complaint",
    [
        (
            {"MEGASCALE_COORDINATOR_ADDRESS": "llama-slice-0-0.llama"},
            "MEGASCALE_COORDINATOR_ADDRESS='llama-slice-0-0.llama' has no port",
        ),
        ({"MEGASCALE_SLICE_ID": "2"}, "MEGASCALE_SLICE_ID=2 is outside"),
        ({"MEGASCALE_SLICE_ID": None}, "MEGASCALE_SLICE_ID is unset"),
        ({"MEGASCALE_PORT": "70000"}, "MEGASCALE_PORT=70000 is not a TCP port"),
        ({"SKIP_MEGASCALE_PJRT_CLIENT": "1"}, "SKIP_MEGASCALE_PJRT_CLIENT is set"),
        ({"TPU_WORKER_HOSTNAMES": "a,b,c"}, "slice 1 lists 3 hosts but its host bounds 1,1,2 make 2: every slice"),
    ],
)
def test_gke_tpu_multislice_bad_settings_are_refused(changes, complaint):
    with pytest.raises(UsageError, match="^--cluster gke-tpu: " + re.escape(complaint)):
        detect_cluster("gke-tpu", fixture("gke_tpu_multislice_slice1_worker0", **changes))


@pytest.mark.parametrize(
    "changes, complaint",
    [
        ({"TPU_WORKER_ID": "4"}, "TPU_WORKER_ID=4 is not below the node count 4"),
        ({"TPU_WORKER_HOSTNAMES": "a,,b"}, "has an empty entry"),
        ({"TPU_WORKER_ID": None}, "missing TPU_WORKER_ID;"),
    ],
)
def test_gke_tpu_bad_variables_are_refused(changes, complaint):
    with pytest.raises(UsageError, match=re.escape(complaint)):
        detect_cluster("gke-tpu", fixture("gke_tpu_worker1", **changes))


# ---- Open MPI


def test_mpi_one_rank_per_node():
    settings = detect_cluster("mpi", fixture("mpi_npernode1_rank1"))
    assert settings == ClusterSettings(
        kind="mpi", nnodes=2, node_rank=1, master_addr=None, master_port=None, run_id="1234370561"
    )


def test_mpi_needs_an_explicit_master_addr():
    settings = detect_cluster("mpi", fixture("mpi_npernode1_rank1"))
    assert settings.resolve_master_addr("node-a") == "node-a"
    with pytest.raises(UsageError, match="--cluster mpi cannot tell where node 0 runs; pass --master-addr"):
        settings.resolve_master_addr(None)


def test_cluster_master_addr_is_used_when_none_is_given():
    settings = detect_cluster("gke-tpu", fixture("gke_tpu_worker1"))
    assert settings.resolve_master_addr(None) == "llama-slice-job-0-0.llama"
    assert settings.resolve_master_addr("10.1.2.3") == "10.1.2.3"


def test_mpi_two_ranks_on_a_node_are_refused():
    with pytest.raises(UsageError, match="mpirun started 2 xlarun processes on this node.*--npernode 1"):
        detect_cluster("mpi", fixture("mpi_two_per_node"))


def test_mpi_run_id_falls_back_to_the_open_mpi_job_id():
    environ = fixture("mpi_npernode1_rank1", PMIX_NAMESPACE=None, OMPI_MCA_ess_base_jobid="99")
    assert detect_cluster("mpi", environ).run_id == "99"
    bare = fixture("mpi_npernode1_rank1", PMIX_NAMESPACE=None, OMPI_MCA_ess_base_jobid=None)
    assert detect_cluster("mpi", bare).run_id is None


def test_mpi_missing_variables_are_all_named():
    with pytest.raises(UsageError, match=r"missing OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK; .*--npernode 1"):
        detect_cluster("mpi", {})


def test_none_reads_nothing():
    assert detect_cluster("none", fixture("slurm_step_node1")) is None


@pytest.mark.parametrize(
    "name, kind",
    [
        ("slurm_step_node1", "slurm"),
        ("slurm_substep_n2", "slurm"),
        ("slurm_batch_one_node", "slurm"),
        ("k8s_pytorchjob_master", "k8s"),
        ("k8s_pytorchjob_legacy_worker0", "k8s"),
        ("gke_tpu_worker1", "gke-tpu"),
        ("mpi_npernode1_rank1", "mpi"),
    ],
)
def test_auto_finds_each_cluster(name, kind):
    assert detect_cluster("auto", fixture(name)) == detect_cluster(kind, fixture(name))


@pytest.mark.parametrize("name", ["workstation", "k8s_pytorchjob_elastic"])
def test_auto_finds_nothing_outside_a_static_cluster_job(name):
    assert detect_cluster("auto", fixture(name)) is None


def test_auto_takes_mpirun_inside_a_slurm_allocation():
    environ = {**fixture("slurm_batch_two_nodes"), **fixture("mpi_npernode1_rank1")}
    found = detect_cluster("auto", environ)
    assert found is not None and found.kind == "mpi"


def test_auto_takes_the_tpu_slice_over_its_pod():
    environ = {**fixture("gke_tpu_worker1"), "MASTER_ADDR": "somewhere", "RANK": "0", "WORLD_SIZE": "1"}
    found = detect_cluster("auto", environ)
    assert found is not None and found.kind == "gke-tpu"


def test_auto_reports_a_broken_environment_of_the_kind_it_found():
    with pytest.raises(UsageError, match="runs outside a job step"):
        detect_cluster("auto", fixture("slurm_batch_two_nodes"))


def test_the_scheduler_kinds_are_the_options_less_none_and_auto():
    assert ("none", "auto", *get_args(SchedulerKind)) == CLUSTER_KINDS


def test_explicit_kind_on_an_empty_environment_names_its_variables():
    # tpu-vm reads its metadata server, not variables (tests/unit/test_tpu_vm.py).
    for kind in [kind for kind in CLUSTER_KINDS[2:] if kind != "tpu-vm"]:
        with pytest.raises(UsageError, match=f"--cluster {kind}: missing "):
            detect_cluster(kind, {})


# ---- Where each value came from


@pytest.mark.parametrize(
    "kind, environ, read_from",
    [
        (
            "slurm",
            fixture("slurm_step_node1"),
            {
                "nnodes": "SLURM_STEP_NUM_NODES",
                "node_rank": "SLURM_NODEID",
                "master_addr": "SLURM_STEP_NODELIST",
                "master_port": "SLURM_JOB_ID, SLURM_STEP_ID",
                "run_id": "SLURM_JOB_ID, SLURM_STEP_ID",
            },
        ),
        (
            "slurm",
            fixture("slurm_step_node1", SLURM_STEP_NUM_NODES=None, SLURM_JOB_ID=None, SLURM_STEP_ID=None),
            {
                "nnodes": "SLURM_NNODES",
                "node_rank": "SLURM_NODEID",
                "master_addr": "SLURM_STEP_NODELIST",
                "master_port": "SLURM_JOBID, SLURM_STEPID",
                "run_id": "SLURM_JOBID, SLURM_STEPID",
            },
        ),
        # Outside a step the job's one node is node 0: its node count says so.
        (
            "slurm",
            fixture("slurm_batch_one_node"),
            {
                "nnodes": "SLURM_JOB_NUM_NODES",
                "node_rank": "SLURM_JOB_NUM_NODES",
                "master_addr": "SLURM_JOB_NODELIST",
                "master_port": "SLURM_JOB_ID",
                "run_id": "SLURM_JOB_ID",
            },
        ),
        (
            "k8s",
            fixture("k8s_pytorchjob_worker1"),
            {
                "nnodes": "PET_NNODES",
                "node_rank": "PET_NODE_RANK",
                "master_addr": "PET_MASTER_ADDR",
                "master_port": "PET_MASTER_PORT",
                "nproc_per_node": "PET_NPROC_PER_NODE",
            },
        ),
        (
            "k8s",
            fixture("k8s_pytorchjob_master"),
            {
                "nnodes": "PET_NNODES",
                "node_rank": "PET_NODE_RANK",
                "master_addr": "HOSTNAME",
                "master_port": "PET_MASTER_PORT",
                "nproc_per_node": "PET_NPROC_PER_NODE",
            },
        ),
        (
            "k8s",
            fixture("k8s_pytorchjob_legacy_worker0"),
            {"nnodes": "WORLD_SIZE", "node_rank": "RANK", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"},
        ),
        (
            "gke-tpu",
            fixture("gke_tpu_worker1"),
            {"nnodes": "TPU_WORKER_HOSTNAMES", "node_rank": "TPU_WORKER_ID", "master_addr": "TPU_WORKER_HOSTNAMES"},
        ),
        (
            "mpi",
            fixture("mpi_npernode1_rank1"),
            {"nnodes": "OMPI_COMM_WORLD_SIZE", "node_rank": "OMPI_COMM_WORLD_RANK", "run_id": "PMIX_NAMESPACE"},
        ),
        (
            "mpi",
            fixture("mpi_npernode1_rank1", PMIX_NAMESPACE=None, OMPI_MCA_ess_base_jobid=None),
            {"nnodes": "OMPI_COMM_WORLD_SIZE", "node_rank": "OMPI_COMM_WORLD_RANK"},
        ),
    ],
)
def test_each_value_names_the_variable_it_was_read_from(kind, environ, read_from):
    settings = detect_cluster(kind, environ)
    assert settings.read_from == read_from
    # Every field the cluster sets, and only those, says where it came from.
    fields = {"nnodes", "node_rank", "master_addr", "master_port", "run_id", "nproc_per_node"}
    assert set(read_from) == {name for name in fields if getattr(settings, name) is not None}


def test_k8s_blank_master_address_is_refused():
    with pytest.raises(UsageError, match=re.escape("--cluster k8s: PET_MASTER_ADDR=' ' names no host")):
        detect_cluster("k8s", fixture("k8s_pytorchjob_worker1", PET_MASTER_ADDR=" "))


def test_a_refusal_names_the_scheduler_variable_behind_a_value():
    message = refusal("--cluster", "auto", "--standalone", "t.py", env=fixture("slurm_step_node1"))
    assert message == (
        "--standalone runs a single node, but --nnodes=2 (from --cluster slurm: SLURM_STEP_NUM_NODES): drop one of them"
    )
    message = refusal("--cluster", "slurm", "--nnodes", "1", "t.py", env=fixture("slurm_step_node1"))
    assert (
        message == "--node-rank=1 (from --cluster slurm: SLURM_NODEID) is out of range: with --nnodes=1 it must be 0..0"
    )

    environ = fixture("mpi_npernode1_rank1", PMIX_NAMESPACE="job/1")
    message = refusal("--cluster", "mpi", "--master-addr", "a", "t.py", env=environ)
    assert message.startswith("--rdzv-id (from --cluster mpi: PMIX_NAMESPACE)='job/1' cannot be a run id")


@pytest.mark.parametrize(
    "flags, env, expected",
    [
        # The scheduler wins over the PET_* variables ...
        (
            (),
            {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_MASTER_PORT": "1234", "PET_RDZV_ID": "pet"},
            (2, 1, "n1", slurm_master_port(5, 1), "5.1"),
        ),
        # ... and an explicit flag over the scheduler.
        (
            ("--nnodes", "3", "--node-rank", "2", "--master-addr", "a", "--master-port", "1234", "--rdzv-id", "mine"),
            {},
            (3, 2, "a", 1234, "mine"),
        ),
    ],
)
def test_the_scheduler_stands_between_the_flags_and_the_pet_variables(flags, env, expected):
    config = prepare("--cluster", "slurm", *flags, "t.py", env={**fixture("slurm_step_node1"), **env}).config
    assert (config.max_nodes, config.node_rank, config.master_addr, config.master_port, config.rdzv_id) == expected


def test_a_pet_variable_the_scheduler_leaves_alone_still_counts():
    environ = fixture("slurm_step_node1", PET_NPROC_PER_NODE="3")
    assert prepare("--cluster", "slurm", "t.py", env=environ).config.nproc_per_node == 3
