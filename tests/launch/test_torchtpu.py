"""TorchTPU and TorchNeuron launches: real launchers on the fake hosts, torch_tpu's own code as the oracle.

- torch_tpu's ``set_tpu_launch_env`` (``python -m torch.tpu.distributed``, in a fresh environment per
  case: it reads each variable once) builds the same address list as xlarun for the same hosts, base
  port and device count, and the same single-host shape and topology.
- Workers started on the v4 fixture host, one host or two (127.0.0.1 and 127.0.0.2, placed by their
  stub metadata servers), all see the same three values and bind their own address; the agents'
  stderr carries none of libtpu's lines.
- A list past Linux's limit for one variable is refused in one line before anything starts, where
  ``exec`` itself would fail; TorchNeuron plans one worker per logical NeuronCore.

Tests that need torch_tpu skip where it is not installed (the .venv stack, whose torch is 2.9).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, TESTS, free_port, plan, run_xlarun, worker
from metadata import serve_metadata, slice_attributes
from multinode import Nodes, both, c10d

from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, xla_env
from xlarun.runtimes.torchtpu import TpuSlice
from xlarun.runtimes.tpu import TpuTopology

HOSTS = TESTS / "fixtures" / "hosts"
V4_HOST = {"XLARUN_HOST_ROOT": str(HOSTS / "tpu-v4-vm")}
THREE_VALUES = ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID")
# What libtpu and torch_tpu print on stderr when `import torch` loads them.
LIBTPU_LINES = re.compile(r"pjrt_api\.cc|absl::InitializeLog|TorchTpu|libtpu", re.IGNORECASE)
TORCH_XLA_PREFIXES = ("PJRT_", "XLA_", "XRT_", "NEURON_PJRT_")

needs_torch_tpu = pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None, reason="torch_tpu is not installed in this Python (the .venv stack)"
)


def oracle_environment(**variables: str) -> dict[str, str]:
    """A fresh environment holding only ``variables``, where ``import torch`` loads torch_tpu (autoload on)."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **variables}


def torch_tpu_launch_env(**variables: str) -> dict[str, str]:
    """The ``KEY="value"`` lines ``python -m torch.tpu.distributed`` prints where only ``variables`` are set."""
    result = subprocess.run(
        [PYTHON, "-m", "torch.tpu.distributed"],
        env=oracle_environment(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', result.stdout, flags=re.MULTILINE))


SINGLE_HOST_ORACLE = f"""
import json, os
import torch  # loads torch_tpu
from torch_tpu._internal.utils import hardware
# This machine has no TPU: the PCI scan finds the fixture host's 4 v4 chips instead.
hardware._scan_pci_tpus = lambda: (4, hardware._TOPOLOGY_BY_TPU_PCI_DEVICE_ID["0x005e"])
from torch.tpu import distributed
distributed.set_tpu_launch_env()
print(json.dumps({{name: os.environ[name] for name in {THREE_VALUES!r}}}))
"""


def records(directory: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def same_values(found: list[dict]) -> dict[str, str]:
    """The three values, which every worker must see alike."""
    values = {name: {record["env"][name] for record in found} for name in THREE_VALUES}
    assert all(len(seen) == 1 for seen in values.values()), values
    return {name: seen.pop() for name, seen in values.items()}


def free_base_port(*hosts: str, count: int = 4) -> int:
    """A port from which ``count`` ports are free on every one of ``hosts`` (TorchTPU's ports across hosts)."""
    for _ in range(50):
        base = free_port()
        try:
            for host in hosts:
                for port in range(base, base + count):
                    with socket.socket() as probe:
                        probe.bind((host, port))
        except OSError:
            continue
        return base
    pytest.fail("found no run of free ports")


# --- one host ------------------------------------------------------------------------------------------


@needs_torch_tpu
def test_one_v4_host_starts_four_workers_with_torch_tpus_three_values(tmp_path: Path) -> None:
    result = run_xlarun(
        "--nproc-per-node", "auto", worker("tpu_address.py"), env={**V4_HOST, "DUMP_DIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    found = records(tmp_path)
    assert len(found) == 4
    values = same_values(found)
    ports = [int(entry.split(":")[1]) for entry in values["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")]
    assert re.fullmatch(r"localhost:\d+(,localhost:\d+){3}", values["TORCH_TPU_SLICEBUILDER_ADDRESSES"])
    assert len(set(ports)) == 4
    # Each worker bound its own entry: the ports were free.
    assert sorted(record["bound"] for record in found) == sorted(f"localhost:{port}" for port in ports)
    assert values["TORCH_TPU_TOPOLOGY"] == "2,2,1"
    assert not [name for name in found[0]["env"] if name.startswith(TORCH_XLA_PREFIXES)]
    assert {record["env"]["TORCH_TPU_DEVICES_PER_HOST"] for record in found} == {"4"}

    # torch_tpu's own single-host plan for the same host: the same shape and topology.
    oracle = subprocess.run(
        [PYTHON, "-c", SINGLE_HOST_ORACLE], env=oracle_environment(), capture_output=True, text=True, timeout=120
    )
    assert oracle.returncode == 0, oracle.stderr
    theirs = json.loads(oracle.stdout.splitlines()[-1])
    assert re.fullmatch(r"localhost:\d+(,localhost:\d+){3}", theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"])
    assert len(set(theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","))) == 4
    assert theirs["TORCH_TPU_TOPOLOGY"] == values["TORCH_TPU_TOPOLOGY"]
    assert theirs["TORCH_TPU_XPROF_SESSION_ID"].isdigit() and values["TORCH_TPU_XPROF_SESSION_ID"].isdigit()


@needs_torch_tpu
def test_a_restart_picks_the_ports_again_and_keeps_the_jobs_session(tmp_path: Path) -> None:
    result = run_xlarun(
        "--max-restarts",
        "1",
        "--nproc-per-node",
        "2",
        worker("tpu_address.py"),
        "1",
        env={**V4_HOST, "DUMP_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert "attempt 0 failed" in result.stderr
    attempts = [
        [json.loads(path.read_text()) for path in sorted(tmp_path.glob(f"*_{attempt}.json"))] for attempt in (0, 1)
    ]
    assert [len(found) for found in attempts] == [2, 2]
    first, second = (same_values(found) for found in attempts)
    assert first["TORCH_TPU_XPROF_SESSION_ID"] == second["TORCH_TPU_XPROF_SESSION_ID"]
    # Every attempt's workers bound the ports picked for it.
    for found, values in zip(attempts, (first, second), strict=True):
        addresses = values["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
        assert sorted(record["bound"] for record in found) == sorted(addresses)


# --- several hosts -----------------------------------------------------------------------------------


@needs_torch_tpu
def test_two_tpu_vms_get_the_list_torch_tpu_builds_for_them_and_one_session(nodes: Nodes, port: int) -> None:
    ips = ["127.0.0.1", "127.0.0.2"]
    base = free_base_port(*ips)
    with serve_metadata(slice_attributes(0, ips)) as vm0, serve_metadata(slice_attributes(1, ips)) as vm1:
        started = [
            nodes.start(
                "--cluster",
                "tpu-vm",
                "--master-port",
                port,
                "--local-addr",
                ip,
                "--nproc-per-node",
                "auto",
                worker("tpu_address.py"),
                env={
                    **V4_HOST,
                    "GCE_METADATA_HOST": vm.host,
                    "TORCH_TPU_BASE_PORT": str(base),
                    "DUMP_DIR": str(nodes.out_dir),
                },
            )
            for ip, vm in zip(ips, (vm0, vm1), strict=True)
        ]
        runs = nodes.finish_all(started)
    assert [run.returncode for run in runs] == [0, 0], both(runs)
    found = records(nodes.out_dir)
    assert len(found) == 8
    values = same_values(found)
    assert values["TORCH_TPU_TOPOLOGY"] == "2,2,2"  # the v4-16 slice's, from its tpu-env
    assert sorted(record["bound"] for record in found) == sorted(values["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","))
    assert not [line for run in runs for line in run.stderr.splitlines() if LIBTPU_LINES.search(line)], both(runs)

    theirs = torch_tpu_launch_env(
        TPU_WORKER_HOSTNAMES=",".join(ips), TORCH_TPU_BASE_PORT=str(base), TORCH_TPU_DEVICES_PER_HOST="4", NODE_RANK="0"
    )
    assert values["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"]


@needs_torch_tpu
def test_c10d_ranks_the_nodes_by_their_worker_numbers_not_by_the_rounds_order(nodes: Nodes, port: int) -> None:
    # torch's round orders nodes by address: 127.0.0.1 first. Their worker numbers in the slice say the other way.
    base = free_base_port("127.0.0.1", "127.0.0.2")
    env = {
        **V4_HOST,
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TORCH_TPU_BASE_PORT": str(base),
        "DUMP_DIR": str(nodes.out_dir),
    }
    started = [
        nodes.start(
            *c10d(port, "slice", 2, 4),
            "--local-addr",
            ip,
            worker("tpu_address.py"),
            env={**env, "JOB_COMPLETION_INDEX": index},
        )
        for ip, index in (("127.0.0.1", "1"), ("127.0.0.2", "0"))
    ]
    runs = nodes.finish_all(started)
    assert [run.returncode for run in runs] == [0, 0], both(runs)
    found = records(nodes.out_dir)
    values = same_values(found)
    assert values["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
        f"{ip}:{base + index}" for ip in ("127.0.0.2", "127.0.0.1") for index in range(4)
    )
    ranks = {record["bound"].split(":")[0]: record["env"]["GROUP_RANK"] for record in found}
    assert ranks == {"127.0.0.2": "0", "127.0.0.1": "1"}


@needs_torch_tpu
def test_three_hosts_of_eight_devices_on_another_base_port_are_torch_tpus_list() -> None:
    hosts = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    options = XlaOptions(
        "tpu",
        "torchtpu",
        tpu_topology=TpuTopology("2,2,1", "2,4,1", generation=6),
        tpu_slice=TpuSlice(chip="0x006f", base_port=9000),
    )
    node = NodeAssignment(
        run_id="job",
        node_rank=2,
        nnodes=3,
        local_world_size=8,
        rank_offset=16,
        world_size=24,
        master_addr=hosts[0],
        master_port=29500,
        hosts=hosts,
    )
    ours = xla_env(options, node, 5)["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
    theirs = torch_tpu_launch_env(
        TPU_WORKER_HOSTNAMES=",".join(hosts), TORCH_TPU_BASE_PORT="9000", TORCH_TPU_DEVICES_PER_HOST="8", NODE_RANK="2"
    )
    assert ours == theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"]


# --- the size limit -------------------------------------------------------------------------------------


def exec_with(name: str, value: str) -> int | str:
    """Start /bin/true with ``name=value`` in its environment: its exit code, or the error exec raised."""
    try:
        return subprocess.run(["/bin/true"], env={name: value}).returncode
    except OSError as error:
        return os.strerror(error.errno or 0)


@pytest.mark.parametrize("dry_run", [True, pytest.param(False, marks=needs_torch_tpu)], ids=["dry run", "launch"])
def test_a_list_past_linuxs_limit_is_refused_before_anything_starts(dry_run: bool, tmp_path: Path) -> None:
    # 1820 hosts of 4 devices at 12-character addresses: 7280 entries of 18 bytes, one byte too many.
    flags = [
        "--runtime",
        "torchtpu",
        "--nnodes",
        "1820",
        "--node-rank",
        "0",
        "--master-addr",
        "10.130.0.123",
        "--nproc-per-node",
        "4",
        worker("marker.py"),
        tmp_path / "ran",
    ]
    env = {**V4_HOST, "TPU_HOST_BOUNDS": "4,5,91", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}
    result = run_xlarun(*(["--dry-run"] if dry_run else []), *flags, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "xlarun: error: TORCH_TPU_SLICEBUILDER_ADDRESSES for 7280 devices on 1820 hosts would take 131,073 bytes, "
        "past Linux's 128 KiB limit on one environment variable (131,072 bytes, MAX_ARG_STRLEN), so no worker "
        "could start: split the job"
    ]
    assert not (tmp_path / "ran").exists()
    entries = [f"10.130.0.123:{8070 + index}" for _ in range(1820) for index in range(4)]
    assert exec_with("TORCH_TPU_SLICEBUILDER_ADDRESSES", ",".join(entries)) == "Argument list too long"


def test_the_dry_run_shows_the_size_of_a_list_that_fits() -> None:
    env = {**V4_HOST, "TPU_HOST_BOUNDS": "1,17,107", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}
    document = plan(
        "--runtime",
        "torchtpu",
        "--nnodes",
        "1819",
        "--node-rank",
        "0",
        "--master-addr",
        "10.130.0.123",
        "--nproc-per-node",
        "4",
        "t.py",
        env=env,
    )
    addresses = document["workers"][0]["env"]["TORCH_TPU_SLICEBUILDER_ADDRESSES"]
    assert addresses == "<decided at rendezvous>"  # the nodes' real addresses come from the rendezvous
    assert document["env_bytes"] > 130_967 + len("TORCH_TPU_SLICEBUILDER_ADDRESSES") + 2
    assert any("every node's address is as long as 10.130.0.123" in line for line in document["assumed"])
    entries = [f"10.130.0.123:{8070 + index}" for _ in range(1819) for index in range(4)]
    assert exec_with("TORCH_TPU_SLICEBUILDER_ADDRESSES", ",".join(entries)) == 0


# --- TorchNeuron ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host, cores", [("trn1-32xlarge", 32), ("trn2-48xlarge", 64)])
def test_torchneuron_plans_one_worker_per_logical_neuroncore_without_torch_xlas_variables(
    host: str, cores: int
) -> None:
    document = plan(
        "--runtime", "torchneuron", "--nproc-per-node", "auto", "t.py", env={"XLARUN_HOST_ROOT": str(HOSTS / host)}
    )
    assert (document["device"], document["runtime"], len(document["workers"])) == ("neuron", "torchneuron", cores)
    for record in document["workers"]:
        assert not [name for name in record["env"] if name.startswith((*TORCH_XLA_PREFIXES, "NEURON_", "TPU_"))]
        assert record["env"]["WORLD_SIZE"] == str(cores)


def test_torchneuron_without_its_package_is_refused_in_one_line(tmp_path: Path) -> None:
    result = run_xlarun(
        "--runtime",
        "torchneuron",
        "--nproc-per-node",
        "auto",
        worker("marker.py"),
        tmp_path / "ran",
        env={"XLARUN_HOST_ROOT": str(HOSTS / "trn2-48xlarge")},
    )
    assert result.returncode == 2
    assert result.stderr == (
        "xlarun: error: the torchneuron runtime needs torch-neuronx, which is not installed in this Python\n"
    )
    assert not (tmp_path / "ran").exists()


# --- several slices (MegaScale) ------------------------------------------------------------------------


def multislice_tpu_env(slice_id: int) -> str:
    """The ``tpu-env`` of a host of slice ``slice_id`` in a queued resource of two v4-16 slices, whose
    coordinator is slice 0's worker 0 (127.0.0.1) at MegaScale's port."""
    from metadata import V4_16_TPU_ENV

    return (
        V4_16_TPU_ENV + f"MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '{slice_id}'\n"
        "MEGASCALE_COORDINATOR_ADDRESS: '127.0.0.1:8080'\n"
    )


SLICES = [["127.0.0.1", "127.0.0.2"], ["127.0.0.3", "127.0.0.4"]]
"""Two slices of two hosts each; slice 0's worker 0 (127.0.0.1) is node 0 and MegaScale's coordinator."""


def gke_multislice_pod(slice_id: int, worker_id: int) -> dict[str, str]:
    """What a JobSet's pod of two v4-16 slices holds (GKE's variables and the manifest's MegaScale settings)."""
    return {
        "TPU_WORKER_ID": str(worker_id),
        "TPU_WORKER_HOSTNAMES": ",".join(SLICES[slice_id]),
        "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": str(slice_id),
        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1:8080",
    }


@needs_torch_tpu
@pytest.mark.parametrize("cluster", ["tpu-vm", "gke-tpu"])
def test_two_slices_of_two_hosts_each_get_their_slices_list_and_the_jobs_megascale_settings(
    cluster: str, nodes: Nodes, port: int
) -> None:
    slices = SLICES
    base = free_base_port(*slices[0], *slices[1])
    places = [(slice_id, worker_id) for slice_id in range(2) for worker_id in range(2)]
    with contextlib.ExitStack() as servers:
        if cluster == "tpu-vm":
            hosts = [
                servers.enter_context(
                    serve_metadata(slice_attributes(worker_id, slices[slice_id], multislice_tpu_env(slice_id)))
                ).host
                for slice_id, worker_id in places
            ]
            environs = [{"GCE_METADATA_HOST": host} for host in hosts]
        else:
            environs = [gke_multislice_pod(slice_id, worker_id) for slice_id, worker_id in places]
        started = [
            nodes.start(
                "--cluster",
                cluster,
                "--master-port",
                port,
                "--local-addr",
                ip,
                "--nproc-per-node",
                "auto",
                worker("tpu_address.py"),
                env={**V4_HOST, **environ, "TORCH_TPU_BASE_PORT": str(base), "DUMP_DIR": str(nodes.out_dir)},
            )
            for ip, environ in zip(slices[0] + slices[1], environs, strict=True)
        ]
        runs = nodes.finish_all(started)
    assert [run.returncode for run in runs] == [0, 0, 0, 0], both(runs)
    found = records(nodes.out_dir)
    assert len(found) == 16
    by_host = {record["bound"].split(":")[0]: record["env"] for record in found}
    assert [by_host[ip]["GROUP_RANK"] for ip in slices[0] + slices[1]] == ["0", "1", "2", "3"]
    assert {record["env"]["MASTER_ADDR"] for record in found} == {"127.0.0.1"}
    megascale = {
        (record["env"]["MEGASCALE_COORDINATOR_ADDRESS"], record["env"]["MEGASCALE_NUM_SLICES"]) for record in found
    }
    assert megascale == {("127.0.0.1:8080", "2")}
    assert len({record["env"]["TORCH_TPU_XPROF_SESSION_ID"] for record in found}) == 1  # the job's, every slice's
    for slice_id, ips in enumerate(slices):
        mine = [record["env"] for record in found if record["bound"].split(":")[0] in ips]
        assert {env["MEGASCALE_SLICE_ID"] for env in mine} == {str(slice_id)}
        assert {env["TORCH_TPU_TOPOLOGY"] for env in mine} == {"2,2,2"}  # one v4-16 slice's, not the job's
        # torch_tpu builds one slice's list from that slice's hosts: the slice builder joins one slice's chips.
        theirs = torch_tpu_launch_env(
            TPU_WORKER_HOSTNAMES=",".join(ips),
            TORCH_TPU_BASE_PORT=str(base),
            TORCH_TPU_DEVICES_PER_HOST="4",
            NODE_RANK="0",
        )
        assert {env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] for env in mine} == {theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"]}


@pytest.mark.parametrize(
    "tpu_env, complaint",
    [
        (
            "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '127.0.0.1'\n",
            "MEGASCALE_COORDINATOR_ADDRESS='127.0.0.1' has no port",
        ),
        ("MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '2'\n", "MEGASCALE_SLICE_ID=2 is outside"),
    ],
)
def test_a_multislice_tpu_env_xlarun_cannot_plan_is_refused_in_one_line(
    tpu_env: str, complaint: str, tmp_path: Path
) -> None:
    from metadata import V4_16_TPU_ENV

    with serve_metadata(slice_attributes(0, ["127.0.0.1", "127.0.0.2"], V4_16_TPU_ENV + tpu_env)) as vm:
        result = run_xlarun(
            "--cluster",
            "tpu-vm",
            "--runtime",
            "torchtpu",
            "--nproc-per-node",
            "4",
            worker("tpu_address.py"),
            env={**V4_HOST, "GCE_METADATA_HOST": vm.host, "DUMP_DIR": str(tmp_path)},
        )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xlarun: error: --cluster tpu-vm: {complaint}"), result.stderr
    assert not list(tmp_path.iterdir())
