"""TorchTPU and TorchNeuron without torch_xla: the runtimes' choice, their checks and what a worker gets.

The translations are checked here as data; ``tests/launch/test_torchtpu.py`` compares them with what
torch_tpu's own ``set_tpu_launch_env`` builds, and launches workers that report them. torch_tpu's own
topology table is read from its installed file where there is one.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from helpers import TESTS, prepare, refusal

from xlarun import structs
from xlarun.exceptions import PlanError, UsageError
from xlarun.planning import packages
from xlarun.planning.dryrun import plan_document
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, megascale, torchtpu, xla_env
from xlarun.runtimes.torchtpu import TpuSlice
from xlarun.runtimes.tpu import TpuTopology

HOSTS = TESTS / "fixtures" / "hosts"
V4_HOST = {"XLARUN_HOST_ROOT": str(HOSTS / "tpu-v4-vm")}
V4 = XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(chip="0x005e"))
V4_16 = TpuTopology("1,1,2", "2,2,1", generation=4)
TORCH_XLA_PREFIXES = ("PJRT_", "TPU_", "XLA_", "XRT_", "NEURON_")


def one_host(nproc: int, ports: tuple[int, ...]) -> NodeAssignment:
    node = NodeAssignment.single_node("job", nproc, "127.0.0.1", 29500)
    return structs.replace(node, worker_ports=ports, job_started_ns=17)


def across(hosts: tuple[str, ...], nproc: int, node_rank: int) -> NodeAssignment:
    node = NodeAssignment.single_node("job", nproc, hosts[0], 29500, node_rank=node_rank, nnodes=len(hosts))
    return structs.replace(node, hosts=hosts, job_started_ns=17)


def torch_tpu_hardware() -> ModuleType:
    """torch_tpu's ``hardware.py``, loaded from its file alone (importing torch_tpu would load libtpu)."""
    spec = importlib.util.find_spec("torch_tpu")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch_tpu is not installed in this Python (the .venv stack): its table cannot be read")
    path = Path(list(spec.submodule_search_locations)[0]) / "_internal" / "utils" / "hardware.py"
    module_spec = importlib.util.spec_from_file_location("torch_tpu_hardware", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


# --- what a worker gets ------------------------------------------------------------------------------


def test_one_host_gets_its_picked_ports_the_table_topology_and_the_jobs_session() -> None:
    env = xla_env(V4, one_host(4, (41001, 41002, 41003, 41004)), local_rank=2)
    assert env == {
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(f"localhost:{port}" for port in range(41001, 41005)),
        "TORCH_TPU_TOPOLOGY": "2,2,1",
        "TORCH_TPU_XPROF_SESSION_ID": "17",
        "TORCH_TPU_DEVICES_PER_HOST": "4",
    }
    # torch_tpu derives TPU_VISIBLE_DEVICES and the rest from LOCAL_RANK and the list: none of torch_xla's.
    assert not [name for name in env if name.startswith(TORCH_XLA_PREFIXES)]


def test_every_rank_of_every_host_gets_the_same_list_host_major_in_node_rank_order() -> None:
    hosts = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    options = XlaOptions(
        "tpu", "torchtpu", tpu_topology=TpuTopology("1,1,3", "2,2,1"), tpu_slice=TpuSlice(chip="0x005e", base_port=9000)
    )
    lists = {
        xla_env(options, across(hosts, 4, rank), local_rank)["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
        for rank in range(3)
        for local_rank in range(4)
    }
    assert lists == {",".join(f"{host}:{9000 + index}" for host in hosts for index in range(4))}
    assert xla_env(options, across(hosts, 4, 1), 0)["TORCH_TPU_TOPOLOGY"] == "2,2,3"


def test_a_restart_with_other_nodes_plans_the_list_again() -> None:
    options = XlaOptions("tpu", "torchtpu", tpu_topology=V4_16, tpu_slice=TpuSlice(chip="0x005e"))
    before = xla_env(options, across(("10.0.0.1", "10.0.0.2"), 4, 0), 0)["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
    after = xla_env(options, across(("10.0.0.1", "10.0.0.9"), 4, 0), 0)["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
    assert "10.0.0.2:" in before and "10.0.0.2:" not in after and after.endswith("10.0.0.9:8073")


def test_tpu7x_counts_two_devices_per_chip_and_adds_them_to_the_slices_topology() -> None:
    options = XlaOptions(
        "tpu", "torchtpu", tpu_topology=TpuTopology("1,1,2", "2,2,1", generation=7), tpu_slice=TpuSlice(chip="0x0076")
    )
    assert xla_env(options, across(("a", "b"), 8, 0), 0)["TORCH_TPU_TOPOLOGY"] == "2,2,2,2"
    assert xla_env(options, one_host(8, tuple(range(8))), 0)["TORCH_TPU_TOPOLOGY"] == "2,2,1,2"


def test_across_hosts_without_the_slices_shape_the_topology_is_left_out() -> None:
    env = xla_env(XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(chip="0x005e")), across(("a", "b"), 4, 1), 0)
    assert "TORCH_TPU_TOPOLOGY" not in env


@pytest.mark.parametrize(
    "options, node, message",
    [
        (V4, one_host(3, (1, 2, 3)), "no topology for 3 devices on one v4 host: run 1, 2, 4, 8 workers"),
        (
            XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(chip="0x0056")),
            one_host(4, (1, 2, 3, 4)),
            "no topology for TPU chips of PCI id 0x0056",
        ),
        (
            XlaOptions("tpu", "torchtpu", tpu_topology=V4_16, tpu_slice=TpuSlice(chip="0x005e")),
            across(("a", "b"), 2, 0),
            "runs one worker per device, 4 on each host of the slice, not 2",
        ),
        (
            XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(worker=0)),
            across(("a", "b"), 4, 1),
            "this host is worker 0 of its TPU slice but node rank 1",
        ),
        (
            XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(worker_hostnames=("a", "b", "c"))),
            across(("a", "b"), 4, 1),
            "TPU_WORKER_HOSTNAMES names 3 hosts, but 2 nodes joined",
        ),
        (V4, across(("10.0.0.1", "fe80::2"), 4, 0), "node address fe80::2 cannot be one"),
        (V4, NodeAssignment("job", 0, 2, 4, 0, 7, "a", 1, hosts=("a", "b")), "7 workers on 2 nodes are not 4 each"),
    ],
)
def test_a_plan_torch_tpu_cannot_run_is_refused(options: XlaOptions, node: NodeAssignment, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        xla_env(options, node, 0)
    assert message in str(refused.value)


def test_the_list_is_refused_past_linuxs_limit_naming_its_size() -> None:
    # 12-character addresses, 4 devices each: 18 bytes an entry (the reference's measurement, §6).
    def hosts(count: int) -> tuple[str, ...]:
        return tuple(f"h{index:011d}" for index in range(count))

    options = XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(chip="0x005e"))
    fits = xla_env(options, across(hosts(1819), 4, 0), 0)["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
    assert len(fits) == 130_967
    with pytest.raises(UsageError) as refused:
        xla_env(options, across(hosts(1820), 4, 0), 0)
    assert str(refused.value) == (
        "TORCH_TPU_SLICEBUILDER_ADDRESSES for 7280 devices on 1820 hosts would take 131,073 bytes, past Linux's "
        "128 KiB limit on one environment variable (131,072 bytes, MAX_ARG_STRLEN), so no worker could start: "
        "split the job"
    )


def test_torchneuron_adds_nothing_to_torchruns_contract() -> None:
    node = NodeAssignment.single_node("job", 64, "10.0.0.1", 29500, node_rank=1, nnodes=2)
    assert xla_env(XlaOptions("neuron", "torchneuron"), node, 63) == {}


# --- torch_tpu's own table ---------------------------------------------------------------------------


def test_the_topologies_are_torch_tpus_own() -> None:
    hardware = torch_tpu_hardware()
    assert {chip: dict(table) for chip, table in hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID.items()} == {
        chip: dict(table) for chip, table in torchtpu.TOPOLOGY_BY_CHIP.items()
    }
    names = {chip: name.removeprefix("TPU ") for chip, name in hardware._PCI_DEVICE_ID_TO_NAME.items()}
    assert names == {**torchtpu.CHIP_NAMES, "0x0076": "v7"}
    devices_per_chip = {version.value: count for version, count in hardware._DEVICES_PER_CHIP.items()}
    assert devices_per_chip == {"TPU v7": torchtpu.DEVICES_PER_CHIP["0x0076"]}


# --- which runtime, and the packages it needs ------------------------------------------------------

NATIVE_DEVICE = {"torchtpu": "tpu", "torchneuron": "neuron"}


def versions(**installed: str) -> packages.VersionLookup:
    """A version lookup that finds these distributions only (named with ``_``, as their folders are)."""
    return lambda name: installed.get(name.replace("-", "_"))


def no_torch_requirement(distribution: str) -> None:
    """The requirement lookup of the fake packages :func:`versions` finds: their metadata pins no torch
    (the installed packages' own requirements, read by default, belong to another world)."""
    return None


@pytest.mark.parametrize(
    "device, installed, runtime",
    [
        ("tpu", {"torch_tpu": "0.2.0"}, "torchtpu"),
        ("neuron", {"torch_neuronx": "2.12.0"}, "torchneuron"),
        ("tpu", {"torch_tpu": "0.2.0", "torch_xla": "2.9.0"}, "pjrt"),
        ("neuron", {"torch_neuronx": "2.9.0", "torch_xla": "2.9.0"}, "pjrt"),
        ("cpu", {"torch_tpu": "0.2.0"}, "pjrt"),
        ("tpu", {}, "pjrt"),
    ],
)
def test_auto_takes_the_devices_own_backend_where_torch_xla_is_absent(
    device: str, installed: dict[str, str], runtime: str
) -> None:
    lookup = versions(**installed)
    assert packages.resolve_runtime("auto", lookup("torch_xla"), device, version_of=lookup) == runtime
    # SPMD is torch_xla's: auto leaves it to PJRT, whose check then names torch_xla as missing.
    assert packages.resolve_runtime("auto", lookup("torch_xla"), device, spmd=True, version_of=lookup) == "pjrt"


@pytest.mark.parametrize(
    "runtime, installed, environ, message",
    [
        ("torchtpu", {}, {}, "the torchtpu runtime needs torch_tpu, which is not installed"),
        ("torchneuron", {}, {}, "the torchneuron runtime needs torch-neuronx, which is not installed"),
        (
            "torchneuron",
            {"torch_neuronx": "2.9.0", "torch_xla": "2.9.0"},
            {},
            "torch-neuronx 2.9.0 beside torch_xla 2.9.0 is AWS's PyTorch/XLA library",
        ),
        (
            "torchtpu",
            {"torch_tpu": "0.2.0"},
            {"TPU_LIBRARY_PATH": "/nowhere/libtpu.so"},
            "TPU_LIBRARY_PATH=/nowhere/libtpu.so is not a file",
        ),
    ],
)
def test_a_native_runtime_without_its_package_is_refused(
    runtime: str, installed: dict[str, str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        packages.preflight(
            NATIVE_DEVICE[runtime],
            runtime,
            tpu_library_path=environ.get("TPU_LIBRARY_PATH"),
            version_of=versions(**installed),
            torch_requirement_of=no_torch_requirement,
        )
    assert message in str(refused.value)


def test_a_native_runtime_with_its_package_passes() -> None:
    packages.preflight(
        "tpu", "torchtpu", version_of=versions(torch_tpu="0.2.0"), torch_requirement_of=no_torch_requirement
    )
    packages.preflight(
        "neuron", "torchneuron", version_of=versions(torch_neuronx="2.12.0"), torch_requirement_of=no_torch_requirement
    )


# --- planning on the fixture hosts ----------------------------------------------------------------


def test_the_runtime_names_its_device_and_a_dry_run_plans_for_a_tpu_vm_elsewhere() -> None:
    prepared = prepare("--dry-run", "--runtime", "torchtpu", "--nproc-per-node", "auto", "t.py")
    assert (prepared.device.device, prepared.config.nproc_per_node) == ("tpu", 4)
    assert prepared.device.assumed and "a TPU VM host with 4 chips" in prepared.device.assumed[0]
    eight = prepare("--dry-run", "--runtime", "torchtpu", "--nproc-per-node", "8", "t.py")
    assert eight.device.variables(one_host(8, tuple(range(8))), 0)["TORCH_TPU_TOPOLOGY"] == "2,4,1"  # a v6e-8


def test_values_the_user_set_are_kept_with_one_line() -> None:
    prepared = prepare(
        "--dry-run",
        "--runtime",
        "torchtpu",
        "--nproc-per-node",
        "auto",
        "t.py",
        env={**V4_HOST, "TORCH_TPU_XPROF_SESSION_ID": "mine", "TORCH_TPU_TOPOLOGY": "2,2,1"},
    )
    assert [notice for notice in prepared.notices if "keeping your own" in notice] == [
        "keeping your own TORCH_TPU_XPROF_SESSION_ID from the environment instead of the values xlarun would set"
    ]
    variables = prepared.device.variables(one_host(4, (1, 2, 3, 4)), 0)
    assert "TORCH_TPU_XPROF_SESSION_ID" not in variables and "TORCH_TPU_TOPOLOGY" not in variables


def test_a_tpu7x_host_runs_two_workers_per_chip(tmp_path: Path) -> None:
    root = tmp_path / "tpu7x"
    shutil.copytree(HOSTS / "tpu-v4-vm", root)
    for device in (root / "sys" / "bus" / "pci" / "devices").glob("*/device"):
        if device.read_text().strip() == "0x005e":
            device.write_text("0x0076\n")
    prepared = prepare(
        "--dry-run", "--runtime", "torchtpu", "--nproc-per-node", "auto", "t.py", env={"XLARUN_HOST_ROOT": str(root)}
    )
    assert prepared.config.nproc_per_node == 8
    assert prepared.device.variables(one_host(8, tuple(range(8))), 0)["TORCH_TPU_TOPOLOGY"] == "2,2,1,2"


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--runtime", "torchtpu", "--device", "cuda"], {}, "the torchtpu runtime runs on device tpu, not cuda"),
        (["--runtime", "torchtpu", "--spmd"], {}, "SPMD is torch_xla's"),
        (
            ["--runtime", "torchtpu", "--nnodes", "2", "--master-addr", "10.0.0.1", "--nproc-per-node", "auto"],
            {},
            "TorchTPU across hosts needs the slice's topology",
        ),
        (
            [
                "--runtime",
                "torchtpu",
                "--nnodes",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "10.0.0.1:29400",
                "--nproc-per-node",
                "auto",
            ],
            {"TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"},
            "a c10d rendezvous would hand them out by arrival",
        ),
        (
            [
                "--runtime",
                "torchtpu",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--master-addr",
                "10.0.0.1",
                "--nproc-per-node",
                "auto",
            ],
            {"TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "1"},
            "this host is worker 1 of its TPU slice but node rank 0",
        ),
        (["--runtime", "torchtpu"], {"TORCH_TPU_BASE_PORT": "70000"}, "TORCH_TPU_BASE_PORT=70000 is not a TCP port"),
        (
            [
                "--runtime",
                "torchtpu",
                "--nnodes",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "10.0.0.1:29400",
                "--nproc-per-node",
                "auto",
            ],
            {"TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "JOB_COMPLETION_INDEX": "2"},
            "this host is worker 2 of its TPU slice, past the job's 2 nodes",
        ),
    ],
)
def test_a_torchtpu_launch_the_slice_cannot_run_is_refused_in_one_line(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    assert message in refusal("--dry-run", *argv, "t.py", env={**V4_HOST, **env})


def test_on_gke_the_slices_topology_is_its_tpu_topology() -> None:
    environ = json.loads((TESTS / "fixtures" / "cluster" / "gke_tpu_worker1.json").read_text())["environ"]
    prepared = prepare(
        "--dry-run",
        "--cluster",
        "gke-tpu",
        "--runtime",
        "torchtpu",
        "--nproc-per-node",
        "4",
        "t.py",
        env={**V4_HOST, **environ},
    )
    hosts = tuple(environ["TPU_WORKER_HOSTNAMES"].split(","))
    variables = prepared.device.variables(across(hosts, 4, 1), 0)
    assert variables["TORCH_TPU_TOPOLOGY"] == "2,4,4"  # TPU_TOPOLOGY=2x4x4 of the v5p-32
    assert variables["TORCH_TPU_SLICEBUILDER_ADDRESSES"].startswith("llama-slice-job-0-0.llama:8070,")
    flat = prepare(
        "--dry-run",
        "--cluster",
        "gke-tpu",
        "--runtime",
        "torchtpu",
        "--nproc-per-node",
        "4",
        "t.py",
        env={**V4_HOST, **environ, "TPU_TOPOLOGY": "4x4", "TPU_ACCELERATOR_TYPE": "v5litepod-16"},
    )
    assert flat.device.variables(across(hosts, 4, 1), 0)["TORCH_TPU_TOPOLOGY"] == "4,4,1"  # a v5e's two fields
    assert "TPU_TOPOLOGY='4xfour' is not a slice's chip mesh" in refusal(
        "--dry-run",
        "--cluster",
        "gke-tpu",
        "--runtime",
        "torchtpu",
        "--nproc-per-node",
        "4",
        "t.py",
        env={**V4_HOST, **environ, "TPU_TOPOLOGY": "4xfour"},
    )


def test_a_c10d_node_on_a_slice_takes_its_worker_number_as_node_rank() -> None:
    env = {**V4_HOST, "TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "JOB_COMPLETION_INDEX": "1"}
    prepared = prepare(
        "--dry-run",
        "--runtime",
        "torchtpu",
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29400",
        "--nproc-per-node",
        "auto",
        "t.py",
        env=env,
    )
    document = plan_document(prepared.config, prepared.device, env)
    # The rendezvous ranks the nodes by their worker numbers: the node rank is no stand-in.
    assert document["node_rank"] == 1 and "node_rank" not in document["decided_at_rendezvous"]
    assert [worker["env"]["RANK"] for worker in document["workers"]] == ["4", "5", "6", "7"]


def test_torchneuron_plans_one_worker_per_logical_neuroncore() -> None:
    for host, cores in (("trn1-32xlarge", 32), ("trn2-48xlarge", 64)):
        prepared = prepare(
            "--dry-run",
            "--runtime",
            "torchneuron",
            "--nproc-per-node",
            "auto",
            "t.py",
            env={"XLARUN_HOST_ROOT": str(HOSTS / host)},
        )
        assert (prepared.device.device, prepared.config.nproc_per_node) == ("neuron", cores)


# --- several slices (MegaScale) ----------------------------------------------------------------------

TWO_SLICES = ("10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2")


def test_each_slice_gets_its_own_hosts_list_and_topology_and_the_job_one_session() -> None:
    plans = []
    for node_rank in range(4):
        options = XlaOptions(
            "tpu",
            "torchtpu",
            tpu_topology=V4_16,
            tpu_slice=TpuSlice(chip="0x005e"),
            megascale=megascale.MegaScale(slices=2, slice_id=node_rank // 2),
        )
        plans.append(xla_env(options, across(TWO_SLICES, 4, node_rank), 1))
    for node_rank, variables in enumerate(plans):
        slice_hosts = TWO_SLICES[node_rank // 2 * 2 :][:2]
        assert variables["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
            f"{host}:{8070 + index}" for host in slice_hosts for index in range(4)
        )
        assert variables["TORCH_TPU_TOPOLOGY"] == "2,2,2"
        assert variables["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.1:8080"
        assert variables["MEGASCALE_SLICE_ID"] == str(node_rank // 2)
    assert len({variables["TORCH_TPU_XPROF_SESSION_ID"] for variables in plans}) == 1


@pytest.mark.parametrize(
    "nnodes, node_rank, slice_id, message",
    [
        (3, 2, 1, "3 nodes do not make 2 TPU slices of as many hosts each"),
        (4, 0, 1, "node rank 0 is not one of slice 1's (2 to 3, 2 hosts a slice)"),
    ],
)
def test_nodes_that_do_not_split_into_the_slices_are_refused(
    nnodes: int, node_rank: int, slice_id: int, message: str
) -> None:
    options = XlaOptions(
        "tpu",
        "torchtpu",
        tpu_topology=V4_16,
        tpu_slice=TpuSlice(chip="0x005e"),
        megascale=megascale.MegaScale(slices=2, slice_id=slice_id),
    )
    with pytest.raises(PlanError, match=re.escape(message)):
        xla_env(options, across(TWO_SLICES[:nnodes], 4, node_rank), 0)


def test_the_megascale_rules_are_torch_tpus_own() -> None:
    spec = importlib.util.find_spec("torch_tpu")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch_tpu is not installed in this Python (the .venv stack): its rules cannot be read")
    text = (Path(list(spec.submodule_search_locations)[0]) / "_internal" / "distributed" / "device_mesh.py").read_text()
    # Its messages as the parser joins their adjacent literals (an f-string's fixed parts, in order).
    messages = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            messages.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            messages.append("".join(str(part.value) for part in node.values if isinstance(part, ast.Constant)))
    said = "\n".join(messages)
    assert f"Give the coordinator address a port, e.g. <MASTER_ADDR>:{megascale.DEFAULT_PORT}" in said
    assert (
        f"libtpu sets --megascale_port to {megascale.PORT} once {megascale.COORDINATOR}, {megascale.SLICE_ID} "
        f"and {megascale.NUM_SLICES} are set" in said
    )
    assert f"{megascale.SKIP_CLIENT} is unset; do not set it at launch" in said
