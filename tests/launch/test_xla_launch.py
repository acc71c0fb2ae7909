"""XLA devices through the real ``xlarun`` command: workers on torch_xla 2.9 (CPU) and plans for every device.

Real launches run the examples with PJRT's CPU client; every other device is checked
through ``--dry-run``, which plans for the flags given without this host's packages or
chips. Device detection reads the fake host trees in ``tests/fixtures/hosts``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest
from helpers import PYTHON, REPO, TESTS, plan, run_command, run_xlarun, worker

XLA_ALLREDUCE = str(REPO / "examples" / "xla_allreduce.py")
SPMD_FSDP = str(REPO / "examples" / "spmd_fsdp.py")
HOSTS = TESTS / "fixtures" / "hosts"
# The script every plan names; planning never runs it.
NEVER_RUN = (worker("marker.py"), "never-written")

# What the XLA translation may add; everything else in a worker's plan is torchrun's contract.
XLA_PREFIXES = ("PJRT_", "TPU_", "NEURON_", "XLA_", "CPU_NUM_DEVICES", "XRT_", "XLARUN_SPMD")

MASTER_ADDR = "10.1.2.3"
MASTER_PORT = 29500
# xlarun's documented rule: 1024 + (MASTER_PORT - 1024 + 32256) mod 64512.
COORDINATOR_PORT = 61756
TWO_NODES = ["--nnodes", "2", "--master_addr", MASTER_ADDR, "--master_port", str(MASTER_PORT), "--rdzv_id", "job7"]
V4_16_SLICE = {"TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}

SPLIT_WORLD_MESSAGE = (
    "SplitWorldError: PJRT's CPU client has no cross-process collectives: "
    "each of the 2 processes would train alone as rank 0 of 1"
)


def xla_part(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(XLA_PREFIXES)}


def json_line(stdout: str) -> dict:
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1, stdout
    return reports[0]


def launcher_lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


# --- real workers on torch_xla 2.9's CPU client -------------------------------------------------------


@pytest.mark.torch_xla
@pytest.mark.parametrize("init", ["xlarun", "torch"])
def test_one_cpu_process_joins_a_world_of_one_and_all_reduces(init: str, port: int) -> None:
    result = run_xlarun(
        "--nproc_per_node", "1", "--master_port", port, "--device", "cpu", XLA_ALLREDUCE, "--init", init
    )
    assert result.returncode == 0, result.stderr
    assert json_line(result.stdout) == {"rank": 0, "world_size": 1, "sum": 1.0}
    assert launcher_lines(result.stderr, "xlarun: warning:") == []


@pytest.mark.torch_xla
def test_two_cpu_processes_are_caught_as_a_split_world(tmp_path: Path, port: int) -> None:
    out = tmp_path / "errors"
    out.mkdir()
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--device",
        "cpu",
        worker("xla_split_world.py"),
        out,
        XLA_ALLREDUCE,
    )

    assert result.returncode != 0
    for rank in (0, 1):
        record = out / f"{rank}.txt"
        assert record.exists(), f"rank {rank} did not raise SplitWorldError\n{result.stderr}"
        assert record.read_text().startswith(SPLIT_WORLD_MESSAGE)
        assert "--spmd --virtual-devices" in record.read_text()
    assert '"sum"' not in result.stdout, "a worker all-reduced alone"

    report = result.stderr[result.stderr.index("=" * 60) :]
    assert "xla_split_world.py FAILED" in report
    assert "Root Cause (first observed failure):" in report
    assert SPLIT_WORLD_MESSAGE in report

    [warning] = launcher_lines(result.stderr, "xlarun: warning:")
    assert "2 CPU processes" in warning and "--spmd --virtual-devices" in warning


@pytest.mark.torch_xla
def test_spmd_on_four_virtual_cpu_devices_trains_a_sharded_model(port: int) -> None:
    args = [
        "--spmd",
        "--master_port",
        str(port),
        "--device",
        "cpu",
        "--virtual-devices",
        "4",
        SPMD_FSDP,
        "--steps",
        "4",
    ]
    planned = plan(*args)
    assert planned["nproc_per_node"] == 1
    [entry] = planned["workers"]
    assert xla_part(entry["env"]) == {"PJRT_DEVICE": "CPU", "XLARUN_SPMD": "1", "CPU_NUM_DEVICES": "4"}

    result = run_xlarun(*args)
    assert result.returncode == 0, result.stderr
    report = json_line(result.stdout)
    assert report["devices"] == 4
    losses = report["losses"]
    assert len(losses) == 4
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert report["shardings"]["_orig_module.0.weight"] == "{devices=[4,1]0,1,2,3}"
    assert all(spec.endswith("]0,1,2,3}") for spec in report["shardings"].values()), report["shardings"]


# --- every device's translation, planned -------------------------------------------------------------


def common(device: str, local_rank: int, local_count: int) -> dict[str, str]:
    return {
        "PJRT_DEVICE": device,
        "PJRT_LOCAL_PROCESS_RANK": str(local_rank),
        "PJRT_LOCAL_PROCESS_COUNT": str(local_count),
    }


def xrt_expected(kind: str, node_rank: int, local_rank: int) -> dict[str, str]:
    rank = 2 * node_rank + local_rank
    return {
        "XRT_LOCAL_WORKER": f"localservice:{rank}",
        "XRT_MULTI_PROCESSING_DEVICE": f"{kind}:{rank}",
        "XRT_SHARD_WORLD_SIZE": "4",
        "XRT_SHARD_ORDINAL": str(rank),
        "XRT_SHARD_LOCAL_ORDINAL": str(local_rank),
        "XRT_HOST_WORLD_SIZE": "2",
        "XRT_MESH_SERVICE_ADDRESS": f"{MASTER_ADDR}:{COORDINATOR_PORT}",
    }


# name: (flags, environment, plan's device and runtime, XLA variables of (node_rank, local_rank)). TPU's
# runtime is pinned: where torch_tpu is installed without torch_xla, auto takes TorchTPU (test_torchtpu.py).
TRANSLATIONS = {
    "tpu": (
        ["--device", "tpu", "--runtime", "pjrt", "--nproc_per_node", "2"],
        {},
        ("tpu", "pjrt"),
        lambda node, local: {
            **common("TPU", local, 2),
            "TPU_VISIBLE_CHIPS": str(local),
            "TPU_PROCESS_PORT": str(8476 + local),
        },
    ),
    "tpu with slice topology": (
        ["--device", "tpu", "--runtime", "pjrt", "--nproc_per_node", "4"],
        V4_16_SLICE,
        ("tpu", "pjrt"),
        lambda node, local: {
            **common("TPU", local, 4),
            "TPU_VISIBLE_CHIPS": str(local),
            "TPU_PROCESS_PORT": str(8476 + local),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": "2,2,2",
        },
    ),
    "tpu spmd": (
        ["--device", "tpu", "--spmd"],
        V4_16_SLICE,
        ("tpu", "pjrt"),
        lambda node, local: {
            **common("TPU", 0, 1),
            "XLARUN_SPMD": "1",
            "TPU_VISIBLE_CHIPS": "0,1,2,3",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
            "TPU_PROCESS_BOUNDS": "1,1,2",
        },
    ),
    "neuron": (
        ["--device", "neuron", "--nproc_per_node", "2"],
        {},
        ("neuron", "pjrt"),
        lambda node, local: {
            **common("NEURON", local, 2),
            "NEURON_RT_ROOT_COMM_ID": f"{MASTER_ADDR}:{COORDINATOR_PORT}",
            "NEURON_PJRT_PROCESS_INDEX": str(2 * node + local),
            "NEURON_PJRT_WORLD_SIZE": "4",
        },
    ),
    "cuda": (
        ["--device", "cuda", "--nproc_per_node", "2"],
        {},
        ("cuda", "pjrt"),
        lambda node, local: {**common("CUDA", local, 2), "XLA_COORDINATOR_PORT": str(COORDINATOR_PORT)},
    ),
    "cpu": (
        ["--device", "cpu", "--nproc_per_node", "2"],
        {},
        ("cpu", "pjrt"),
        lambda node, local: {"PJRT_DEVICE": "CPU"},
    ),
    "cpu spmd": (
        ["--device", "cpu", "--spmd", "--virtual-devices", "8"],
        {},
        ("cpu", "pjrt"),
        lambda node, local: {"PJRT_DEVICE": "CPU", "XLARUN_SPMD": "1", "CPU_NUM_DEVICES": "8"},
    ),
    "xpu": (
        ["--device", "xpu", "--nproc_per_node", "2"],
        {},
        ("xpu", "pjrt"),
        lambda node, local: common("XPU", local, 2),
    ),
    "cuda xrt": (
        ["--device", "cuda", "--runtime", "xrt", "--nproc_per_node", "2"],
        {},
        ("cuda", "xrt"),
        lambda node, local: xrt_expected("GPU", node, local),
    ),
    "cpu xrt": (
        ["--device", "cpu", "--runtime", "xrt", "--nproc_per_node", "2"],
        {},
        ("cpu", "xrt"),
        lambda node, local: xrt_expected("CPU", node, local),
    ),
}


@pytest.mark.parametrize("name", list(TRANSLATIONS))
@pytest.mark.parametrize("node_rank", [0, 1])
def test_dry_run_gives_each_worker_its_devices_variables(name: str, node_rank: int) -> None:
    flags, env, (device, runtime), expected = TRANSLATIONS[name]
    document = plan(*TWO_NODES, "--node_rank", node_rank, *flags, *NEVER_RUN, env=env)
    assert (document["device"], document["runtime"]) == (device, runtime)
    assert document["workers"], document
    for entry in document["workers"]:
        assert xla_part(entry["env"]) == expected(node_rank, entry["local_rank"])
        # torch_xla decides whether torchrun started it by this variable alone.
        assert entry["env"]["TORCHELASTIC_RUN_ID"] == "job7"


def coordinator_ports(document: dict) -> set[int]:
    """Every coordinator port the plan's workers are given, whichever variable carries it."""
    ports = set()
    for entry in document["workers"]:
        env = entry["env"]
        for name in ("NEURON_RT_ROOT_COMM_ID", "XRT_MESH_SERVICE_ADDRESS"):
            if name in env:
                host, port = env[name].rsplit(":", 1)
                assert host == document["master_addr"]
                ports.add(int(port))
        if "XLA_COORDINATOR_PORT" in env:
            ports.add(int(env["XLA_COORDINATOR_PORT"]))
    assert ports, "no coordinator in the plan"
    return ports


COORDINATED = {
    "neuron": ["--device", "neuron"],
    "cuda": ["--device", "cuda"],
    "cuda xrt": ["--device", "cuda", "--runtime", "xrt"],
    "cpu xrt": ["--device", "cpu", "--runtime", "xrt"],
}


@pytest.mark.parametrize("name", list(COORDINATED))
@pytest.mark.parametrize("master_port", [29500, 29501, 65535])
def test_every_node_plans_one_coordinator_port_that_is_not_the_master_port(name: str, master_port: int) -> None:
    ports = set()
    for node_rank in (0, 1):
        document = plan(
            "--nnodes",
            "2",
            "--node_rank",
            node_rank,
            "--nproc_per_node",
            "2",
            "--master_addr",
            MASTER_ADDR,
            "--master_port",
            master_port,
            *COORDINATED[name],
            *NEVER_RUN,
        )
        ports |= coordinator_ports(document)
    assert len(ports) == 1, ports
    assert master_port not in ports


@pytest.mark.parametrize("name", list(COORDINATED))
def test_coordinator_port_flag_overrides_the_rule_on_every_node(name: str) -> None:
    for node_rank in (0, 1):
        document = plan(
            *TWO_NODES,
            "--node_rank",
            node_rank,
            "--nproc_per_node",
            "2",
            "--coordinator-port",
            "40123",
            *COORDINATED[name],
            *NEVER_RUN,
        )
        assert coordinator_ports(document) == {40123}


# --- size: the same at 2 nodes and at 32,768 nodes of 32 workers --------------------------------------

WORLD_COUNT_VARIABLES = ("WORLD_SIZE", "ROLE_WORLD_SIZE", "NEURON_PJRT_WORLD_SIZE", "XRT_SHARD_WORLD_SIZE")
NODE_COUNT_VARIABLES = ("GROUP_WORLD_SIZE", "XRT_HOST_WORLD_SIZE")
SIZED = {
    "tpu": ["--device", "tpu", "--runtime", "pjrt"],
    "neuron": ["--device", "neuron"],
    "cuda": ["--device", "cuda"],
    "cpu": ["--device", "cpu"],
    "xpu": ["--device", "xpu"],
    "cuda xrt": ["--device", "cuda", "--runtime", "xrt"],
}


@pytest.mark.parametrize("name", list(SIZED))
def test_added_environment_does_not_grow_with_the_world(name: str) -> None:
    def sized(nnodes: int) -> dict:
        return plan(
            "--nnodes",
            nnodes,
            "--node_rank",
            "1",
            "--nproc_per_node",
            "32",
            "--master_addr",
            MASTER_ADDR,
            *SIZED[name],
            *NEVER_RUN,
        )

    small, huge = sized(2), sized(32768)
    assert (small["world_size"], huge["world_size"]) == (64, 1048576)
    # Node 1 holds ranks 32..63 in both plans; only the world's and the node count's digits differ.
    world_digits = len("1048576") - len("64")
    node_digits = len("32768") - len("2")

    for few, many in zip(small["workers"], huge["workers"], strict=True):
        assert few["local_rank"] == many["local_rank"] and few["rank"] == many["rank"]
        assert set(few["env"]) == set(many["env"])
        differing = {variable for variable in few["env"] if few["env"][variable] != many["env"][variable]}
        assert differing <= set(WORLD_COUNT_VARIABLES + NODE_COUNT_VARIABLES), differing
        assert max(map(len, few["env"].values())) == max(map(len, many["env"].values()))

    env = small["workers"][0]["env"]
    world_variables = sum(variable in env for variable in WORLD_COUNT_VARIABLES)
    node_variables = sum(variable in env for variable in NODE_COUNT_VARIABLES)
    assert world_variables >= 2 and node_variables >= 1
    assert huge["env_bytes"] - small["env_bytes"] == world_variables * world_digits + node_variables * node_digits
    # Linux refuses a single variable over 128 KiB; the whole addition stays a small fraction of it.
    assert small["env_bytes"] < huge["env_bytes"] < 2048


# --- a user's own setting wins ------------------------------------------------------------------------


def test_users_neuron_root_address_stays_out_of_the_plan() -> None:
    document = plan(
        *TWO_NODES,
        "--node_rank",
        "1",
        "--nproc_per_node",
        "2",
        "--device",
        "neuron",
        *NEVER_RUN,
        env={"NEURON_RT_ROOT_COMM_ID": "1.2.3.4:5"},
    )
    for entry in document["workers"]:
        assert "NEURON_RT_ROOT_COMM_ID" not in entry["env"]  # the worker inherits the user's value
        assert entry["env"]["NEURON_PJRT_PROCESS_INDEX"] == str(entry["rank"])


@pytest.mark.torch_xla  # the notices are torch_xla's variables
@pytest.mark.parametrize(
    "variable, value, flags, noticed",
    [
        ("PJRT_DEVICE", "CPU", [], False),  # xlarun's own value: nothing to say
        ("CPU_NUM_DEVICES", "2", ["--device", "cpu", "--virtual-devices", "4"], True),
    ],
)
def test_users_setting_wins_with_one_notice_line_where_it_differs(
    tmp_path: Path, port: int, variable: str, value: str, flags: list[str], noticed: bool
) -> None:
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        *flags,
        worker("dump_env.py"),
        env={variable: value, "DUMP_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if "keeping your own" in line]
    assert len(notices) == noticed, result.stderr
    assert all(notice.startswith("xlarun: keeping your own ") and variable in notice for notice in notices)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}_0.json").read_text())["env"]
        assert seen[variable] == value


# --- bad input: exit 2, one line, nothing started -------------------------------------------------------

BAD_XLA_INPUTS = {
    "unknown device": (["--device", "bogus"], "--device='bogus'"),
    "unknown runtime": (["--runtime", "bogus"], "--runtime='bogus'"),
    "zero virtual devices": (["--device", "cpu", "--virtual-devices", "0"], "--virtual-devices='0'"),
    "virtual devices off cpu": (
        ["--virtual-devices", "2", "--device", "tpu"],
        "virtual devices exist on the cpu device only, not on tpu",
    ),
    "spmd with several processes": (["--spmd", "--nproc_per_node", "4"], "--nproc-per-node='4' cannot run under SPMD"),
    "xrt with torch_xla 2.9": (["--runtime", "xrt"], "2.1 removed XRT"),
    "cuda with torch_xla 2.9": (["--device", "cuda"], "removed in 2.9"),
    "coordinator port is the master port": (
        ["--master_port", "29533", "--coordinator-port", "29533"],
        "is the master port",
    ),
}


@pytest.mark.torch_xla  # refusals worded for the installed torch_xla 2.9
@pytest.mark.parametrize("case", list(BAD_XLA_INPUTS))
def test_bad_xla_input_is_refused_with_one_line(tmp_path: Path, case: str) -> None:
    flags, expected = BAD_XLA_INPUTS[case]
    marker = tmp_path / "marker"
    result = run_xlarun(*flags, worker("marker.py"), marker, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("xlarun: error: ") and expected in line
    assert result.stdout == ""
    assert not marker.exists(), "a worker ran"


def test_dry_run_refuses_coordinator_port_equal_to_master_port_too() -> None:
    result = run_xlarun(
        "--dry-run",
        "--device",
        "neuron",
        "--master_port",
        "29533",
        "--coordinator-port",
        "29533",
        worker("marker.py"),
        "never-written",
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "coordinator port 29533 is the master port" in line


# --- device auto on fake hosts, without torch at start-up ------------------------------------------------

# Without torch_xla but with torch_tpu (the second stack) auto takes TorchTPU on a TPU host.
TPU_AUTO = (
    (lambda local: {"TORCH_TPU_TOPOLOGY": "2,2,1", "TORCH_TPU_DEVICES_PER_HOST": "4"})
    if importlib.util.find_spec("torch_xla") is None and importlib.util.find_spec("torch_tpu") is not None
    else lambda local: {"PJRT_DEVICE": "TPU", "TPU_VISIBLE_CHIPS": str(local)}
)


@pytest.mark.parametrize(
    "host, device, units, per_worker",
    [
        ("tpu-v4-vm", "tpu", 4, TPU_AUTO),
        ("trn1-32xlarge", "neuron", 32, lambda local: {"PJRT_DEVICE": "NEURON", "NEURON_PJRT_WORLD_SIZE": "32"}),
        ("inf2-xlarge", "neuron", 2, lambda local: {"PJRT_DEVICE": "NEURON", "NEURON_PJRT_WORLD_SIZE": "2"}),
    ],
)
def test_auto_device_and_nproc_from_the_host_without_importing_torch(host, device, units, per_worker) -> None:
    result = run_command(
        [
            PYTHON,
            "-X",
            "importtime",
            "-m",
            "xlarun",
            "--dry-run",
            "--device",
            "auto",
            "--nproc_per_node",
            "auto",
            worker("marker.py"),
            "never-written",
        ],
        env={"XLARUN_HOST_ROOT": str(HOSTS / host)},
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["device"], document["nproc_per_node"]) == (device, units)
    for entry in document["workers"]:
        wanted = per_worker(entry["local_rank"])
        assert {name: entry["env"][name] for name in wanted} == wanted

    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    assert "xlarun.launching.node" in imported
    assert [name for name in imported if re.match(r"torch(_xla)?(\.|$)", name)] == []
