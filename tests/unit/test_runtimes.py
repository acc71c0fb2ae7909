"""Pure translation of a worker's place into XLA variables, and runtime/package checks."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

from xlarun.exceptions import UsageError
from xlarun.host.ports import host_port
from xlarun.planning import packages
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, apply_user_precedence, coordinator_port, megascale, releases, tpu, xla_env
from xlarun.runtimes.tpu import TpuTopology

MASTER_PORT = 29500
COORDINATOR_PORT = 61756  # the rule's value for MASTER_PORT 29500


def nodes(
    nnodes: int, nproc: int, node_rank: int, master_addr: str = "10.0.0.1", master_port: int = MASTER_PORT
) -> NodeAssignment:
    return NodeAssignment.single_node("job", nproc, master_addr, master_port, node_rank=node_rank, nnodes=nnodes)


PJRT_COMMON = {"PJRT_DEVICE", "PJRT_LOCAL_PROCESS_RANK", "PJRT_LOCAL_PROCESS_COUNT"}
V4_16 = TpuTopology(host_bounds="1,1,2", chips_per_host_bounds="2,2,1", generation=4)


# --- PJRT, every device ---------------------------------------------------------------


@pytest.mark.parametrize("device, pjrt_name", [("tpu", "TPU"), ("neuron", "NEURON"), ("cuda", "CUDA"), ("xpu", "XPU")])
def test_every_pjrt_worker_gets_device_and_local_place(device, pjrt_name):
    env = xla_env(XlaOptions(device, "pjrt"), nodes(2, 4, node_rank=1), local_rank=3)
    assert env["PJRT_DEVICE"] == pjrt_name
    assert env["PJRT_LOCAL_PROCESS_RANK"] == "3"
    assert env["PJRT_LOCAL_PROCESS_COUNT"] == "4"
    assert "XLA_USE_SPMD" not in env


def test_cpu_workers_get_no_local_place_which_their_world_of_one_would_contradict():
    assert xla_env(XlaOptions("cpu", "pjrt"), nodes(2, 4, node_rank=1), local_rank=3) == {"PJRT_DEVICE": "CPU"}


def test_xpu_needs_only_the_common_variables():
    assert set(xla_env(XlaOptions("xpu", "pjrt"), nodes(1, 2, 0), 1)) == PJRT_COMMON


def test_torchrun_contract_variables_are_left_to_the_launcher():
    env = xla_env(XlaOptions("neuron", "pjrt"), nodes(2, 2, 1), 0)
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"} & set(env)


# --- TPU --------------------------------------------------------------------------------


def test_tpu_one_chip_per_process_with_known_topology():
    env = xla_env(XlaOptions("tpu", "pjrt", tpu_topology=V4_16), nodes(2, 4, node_rank=1), local_rank=2)
    assert env == {
        "PJRT_DEVICE": "TPU",
        "PJRT_LOCAL_PROCESS_RANK": "2",
        "PJRT_LOCAL_PROCESS_COUNT": "4",
        "TPU_VISIBLE_CHIPS": "2",
        "TPU_PROCESS_PORT": "8478",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "2,2,2",
    }


def test_tpu_without_topology_leaves_bounds_to_torch_xla():
    env = xla_env(XlaOptions("tpu", "pjrt"), nodes(4, 4, node_rank=3), local_rank=1)
    assert env["TPU_VISIBLE_CHIPS"] == "1"
    assert env["TPU_PROCESS_PORT"] == "8477"
    assert "TPU_PROCESS_BOUNDS" not in env and "TPU_CHIPS_PER_PROCESS_BOUNDS" not in env


def test_tpu_never_gets_per_process_address_list_or_task_id():
    env = xla_env(XlaOptions("tpu", "pjrt", tpu_topology=V4_16), nodes(2, 4, 1), 3)
    assert "TPU_PROCESS_ADDRESSES" not in env
    assert "CLOUD_TPU_TASK_ID" not in env


def test_tpu_single_local_process_bounds_are_left_to_torch_xla():
    env = xla_env(XlaOptions("tpu", "pjrt", tpu_topology=V4_16), nodes(2, 1, node_rank=1), local_rank=0)
    assert env["TPU_VISIBLE_CHIPS"] == "0"
    assert "TPU_PROCESS_BOUNDS" not in env and "TPU_CHIPS_PER_PROCESS_BOUNDS" not in env


def test_tpu7x_bounds_are_left_to_torch_xla():
    topology = TpuTopology("1,1,1", "2,2,1", generation=7)
    env = xla_env(XlaOptions("tpu", "pjrt", tpu_topology=topology), nodes(1, 4, 0), 0)
    assert "TPU_PROCESS_BOUNDS" not in env and "TPU_CHIPS_PER_PROCESS_BOUNDS" not in env
    assert env["TPU_VISIBLE_CHIPS"] == "0"


def test_tpu_more_processes_than_chips_is_a_usage_error():
    with pytest.raises(UsageError, match="exceeds the 4 TPU chips"):
        xla_env(XlaOptions("tpu", "pjrt", tpu_topology=V4_16), nodes(2, 8, 0), 0)


def test_tpu_spmd_presets_the_whole_host():
    options = XlaOptions("tpu", "pjrt", spmd=True, tpu_topology=TpuTopology("1,1,1", "2,4,1"))
    env = xla_env(options, nodes(1, 1, 0), 0)
    assert env["XLARUN_SPMD"] == "1" and "XLA_USE_SPMD" not in env  # deprecated since torch_xla 2.1
    assert env["TPU_VISIBLE_CHIPS"] == "0,1,2,3,4,5,6,7"
    assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,4,1"
    assert env["TPU_PROCESS_BOUNDS"] == "1,1,1"
    assert "TPU_PROCESS_PORT" not in env


def test_tpu_spmd_without_topology_is_a_usage_error():
    with pytest.raises(UsageError, match="TPU_HOST_BOUNDS"):
        xla_env(XlaOptions("tpu", "pjrt", spmd=True), nodes(2, 1, 0), 0)


def test_topology_from_the_environment_wins():
    environ = {"TPU_HOST_BOUNDS": "2,2,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_ACCELERATOR_TYPE": "v5p-64"}
    assert tpu.topology(environ, local_chips=4, nnodes=4) == TpuTopology("2,2,1", "2,2,1", 5)


@pytest.mark.parametrize("chips, bounds", [(1, "1,1,1"), (4, "2,2,1"), (8, "2,4,1")])
def test_single_host_topology_from_chip_count(chips, bounds):
    assert tpu.topology({}, local_chips=chips, nnodes=1, generation=6) == TpuTopology("1,1,1", bounds, 6)


def test_multi_host_topology_is_unknown_without_the_environment():
    assert tpu.topology({}, local_chips=4, nnodes=2) is None
    assert tpu.topology({}, local_chips=None, nnodes=1) is None


@pytest.mark.parametrize(
    "accelerator, generation", [("v4-8", 4), ("v5litepod-16", 5), ("v6e-8", 6), ("tpu7x-8", 7), ("mystery", None)]
)
def test_generation_of_accelerator_type(accelerator, generation):
    assert tpu.generation_of(accelerator) == generation


def test_malformed_bounds_are_a_usage_error():
    with pytest.raises(UsageError, match="three positive integers"):
        tpu.topology({"TPU_HOST_BOUNDS": "2x2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}, 4, 4)


# --- Neuron -------------------------------------------------------------------------------


def test_neuron_gets_one_root_address_and_global_place():
    env = xla_env(XlaOptions("neuron", "pjrt"), nodes(2, 32, node_rank=1), local_rank=5)
    assert env["NEURON_RT_ROOT_COMM_ID"] == f"10.0.0.1:{COORDINATOR_PORT}"
    assert env["NEURON_PJRT_PROCESS_INDEX"] == "37"
    assert env["NEURON_PJRT_WORLD_SIZE"] == "64"
    assert env["PJRT_LOCAL_PROCESS_COUNT"] == "32"


def test_neuron_never_gets_the_per_process_list_nor_a_core_choice():
    env = xla_env(XlaOptions("neuron", "pjrt"), nodes(2, 32, 1), 5)
    assert "NEURON_PJRT_PROCESSES_NUM_DEVICES" not in env
    assert "NEURON_RT_VISIBLE_CORES" not in env


def test_neuron_root_address_brackets_ipv6():
    env = xla_env(XlaOptions("neuron", "pjrt"), nodes(1, 2, 0, master_addr="fd00::1"), 0)
    assert env["NEURON_RT_ROOT_COMM_ID"] == f"[fd00::1]:{COORDINATOR_PORT}"


def test_neuron_spmd_on_one_node_gets_only_the_root_address_and_the_spmd_flag():
    env = xla_env(XlaOptions("neuron", "pjrt", spmd=True, local_units=32), nodes(1, 1, 0), 0)
    assert env["XLA_USE_SPMD"] == "1"  # read by torch_xla's import-time Neuron set-up (2.5+)
    assert env["NEURON_RT_ROOT_COMM_ID"] == f"10.0.0.1:{COORDINATOR_PORT}"
    assert not {"NEURON_PJRT_PROCESS_INDEX", "NEURON_PJRT_WORLD_SIZE", "NEURON_PJRT_PROCESSES_NUM_DEVICES"} & set(env)


def test_neuron_spmd_across_nodes_gets_the_node_index_and_one_core_count_per_node():
    env = xla_env(XlaOptions("neuron", "pjrt", spmd=True, local_units=32), nodes(3, 1, 2), 0)
    assert env["NEURON_PJRT_PROCESS_INDEX"] == "2"
    assert env["NEURON_PJRT_PROCESSES_NUM_DEVICES"] == "32,32,32"
    assert "NEURON_PJRT_WORLD_SIZE" not in env


def test_neuron_spmd_across_nodes_without_a_core_count_is_refused():
    with pytest.raises(UsageError, match="NeuronCore count"):
        xla_env(XlaOptions("neuron", "pjrt", spmd=True), nodes(2, 1, 1), 0)


# --- CUDA, CPU ---------------------------------------------------------------------------------


def test_cuda_coordinator_port_follows_the_rule_and_the_override():
    node = nodes(2, 8, 1)
    assert xla_env(XlaOptions("cuda", "pjrt"), node, 0)["XLA_COORDINATOR_PORT"] == str(COORDINATOR_PORT)
    assert xla_env(XlaOptions("cuda", "pjrt", coordinator_port=9000), node, 0)["XLA_COORDINATOR_PORT"] == "9000"


def test_cpu_virtual_devices():
    env = xla_env(XlaOptions("cpu", "pjrt", spmd=True, virtual_devices=4), nodes(1, 1, 0), 0)
    assert env["CPU_NUM_DEVICES"] == "4"
    assert env["XLARUN_SPMD"] == "1" and "XLA_USE_SPMD" not in env
    assert "CPU_NUM_DEVICES" not in xla_env(XlaOptions("cpu", "pjrt"), nodes(1, 2, 0), 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device": "tpu", "runtime": "pjrt", "virtual_devices": 4}, "cpu device only"),
        ({"device": "cuda", "runtime": "xrt", "spmd": True}, "PJRT"),
    ],
)
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        XlaOptions(**kwargs)


# --- XRT ------------------------------------------------------------------------------------------


def test_xrt_gets_per_process_values_and_one_mesh_address():
    env = xla_env(XlaOptions("cuda", "xrt"), nodes(2, 4, node_rank=1), local_rank=3)
    assert env == {
        "XRT_LOCAL_WORKER": "localservice:7",
        "XRT_MULTI_PROCESSING_DEVICE": "GPU:7",
        "XRT_SHARD_WORLD_SIZE": "8",
        "XRT_SHARD_ORDINAL": "7",
        "XRT_SHARD_LOCAL_ORDINAL": "3",
        "XRT_HOST_WORLD_SIZE": "2",
        "XRT_MESH_SERVICE_ADDRESS": f"10.0.0.1:{COORDINATOR_PORT}",
    }


def test_xrt_on_cpu_names_the_cpu_device():
    assert xla_env(XlaOptions("cpu", "xrt"), nodes(1, 2, 0), 1)["XRT_MULTI_PROCESSING_DEVICE"] == "CPU:1"


def test_xrt_on_tpu_is_a_usage_error():
    with pytest.raises(UsageError, match="the XRT runtime runs on device cuda or cpu, not tpu"):
        xla_env(XlaOptions("tpu", "xrt"), nodes(1, 4, 0), 0)


# --- coordinator port ------------------------------------------------------------------------------


def test_coordinator_port_rule_examples():
    assert coordinator_port(29500) == 61756
    assert coordinator_port(29501) == 61757
    assert coordinator_port(40000) == 7744


def test_coordinator_port_is_a_distinct_unprivileged_port_for_every_master_port():
    seen = set()
    for master_port in range(1, 65536):
        port = coordinator_port(master_port)
        assert port != master_port
        assert 1024 <= port <= 65535
        seen.add(port)
    assert len(seen) == 65535 - 1024 + 1  # one-to-one over the unprivileged master ports


def test_every_node_computes_the_same_coordinator_address():
    options = XlaOptions("neuron", "pjrt")
    addresses = {
        xla_env(options, nodes(4, 2, node_rank), local_rank)["NEURON_RT_ROOT_COMM_ID"]
        for node_rank in range(4)
        for local_rank in range(2)
    }
    assert addresses == {f"10.0.0.1:{COORDINATOR_PORT}"}


def test_coordinator_port_override():
    assert coordinator_port(29500, 12345) == 12345
    with pytest.raises(UsageError, match="is the master port"):
        coordinator_port(29500, 29500)
    with pytest.raises(UsageError, match="not a TCP port"):
        coordinator_port(0)


def test_host_port():
    assert host_port("node-0", 1) == "node-0:1"
    assert host_port("::1", 2) == "[::1]:2"
    assert host_port("[::1]", 2) == "[::1]:2"


# --- size -------------------------------------------------------------------------------------------

PLANS = [
    XlaOptions("tpu", "pjrt"),
    XlaOptions("neuron", "pjrt"),
    XlaOptions("cuda", "pjrt"),
    XlaOptions("cpu", "pjrt"),
    XlaOptions("xpu", "pjrt"),
    XlaOptions("cuda", "xrt"),
    XlaOptions("cpu", "xrt"),
]


def byte_count(env: dict[str, str]) -> int:
    return sum(len(name) + len(value) for name, value in env.items())


def without_digits(env: dict[str, str]) -> dict[str, str]:
    return {name: re.sub(r"\d+", "#", value) for name, value in env.items()}


def digit_count(env: dict[str, str]) -> int:
    return sum(len(run) for value in env.values() for run in re.findall(r"\d+", value))


@pytest.mark.parametrize("options", PLANS, ids=lambda o: f"{o.device}-{o.runtime}")
def test_environment_size_does_not_grow_with_the_world(options):
    """2 nodes vs 32,768 nodes of 32 workers: the same variables and the same text.

    The byte counts differ only by the digits of the numbers themselves (world size
    64 vs 1048576, node count 2 vs 32768, ranks): a logarithmic few bytes, stated as
    an exact identity below, and the whole set stays under 1 KiB at a million workers.
    """
    local_rank = 5
    small = xla_env(options, nodes(2, 32, node_rank=1), local_rank)
    huge = xla_env(options, nodes(32768, 32, node_rank=32767), local_rank)
    assert without_digits(small) == without_digits(huge)
    assert byte_count(huge) - byte_count(small) == digit_count(huge) - digit_count(small)
    assert digit_count(huge) - digit_count(small) <= 4 * len(huge)  # at most a few digits per variable
    assert byte_count(huge) < 1024


def test_environment_size_with_comparable_ranks_is_identical():
    # Same digit counts in every number (1-digit node count, 2-digit ranks and sizes):
    # the byte counts are equal, whatever the node rank.
    options = XlaOptions("neuron", "pjrt")
    sizes = {byte_count(xla_env(options, nodes(5, 16, node_rank), 10)) for node_rank in range(1, 5)}
    assert len(sizes) == 1


# --- user precedence ----------------------------------------------------------------------------------


def test_users_setting_wins_with_one_notice_line():
    planned = xla_env(XlaOptions("neuron", "pjrt"), nodes(2, 2, 0), 1)
    environ = {"NEURON_RT_ROOT_COMM_ID": "10.9.9.9:7000", "NEURON_PJRT_WORLD_SIZE": "8", "HOME": "/root"}
    kept, notices = apply_user_precedence(planned, environ)
    assert "NEURON_RT_ROOT_COMM_ID" not in kept and "NEURON_PJRT_WORLD_SIZE" not in kept
    assert kept["NEURON_PJRT_PROCESS_INDEX"] == "1"
    assert len(notices) == 1
    assert "NEURON_RT_ROOT_COMM_ID" in notices[0] and "NEURON_PJRT_WORLD_SIZE" in notices[0]
    assert "\n" not in notices[0]


def test_a_users_value_equal_to_xlaruns_is_kept_without_a_notice():
    planned = xla_env(XlaOptions("neuron", "pjrt"), nodes(2, 2, 0), 1)
    kept, notices = apply_user_precedence(planned, {"PJRT_DEVICE": "NEURON", "NEURON_PJRT_WORLD_SIZE": "8"})
    assert "PJRT_DEVICE" not in kept
    assert len(notices) == 1 and "PJRT_DEVICE" not in notices[0]
    assert apply_user_precedence(planned, {"PJRT_DEVICE": "NEURON"})[1] == []


def test_no_notice_when_user_sets_nothing_of_ours():
    planned = xla_env(XlaOptions("cpu", "pjrt"), nodes(1, 1, 0), 0)
    kept, notices = apply_user_precedence(planned, {"HOME": "/root"})
    assert kept == planned
    assert notices == []


def test_notice_is_the_same_for_every_local_rank():
    environ = {"TPU_VISIBLE_CHIPS": "7"}
    notices = {
        tuple(apply_user_precedence(xla_env(XlaOptions("tpu", "pjrt"), nodes(1, 4, 0), rank), environ)[1])
        for rank in range(4)
    }
    assert len(notices) == 1


# --- packages: runtime resolution and preflight --------------------------------------------------------


def versions(**installed):
    """A version lookup for packages that need not be installed here."""
    return installed.get


@pytest.mark.parametrize(
    "requested, xla_version, runtime",
    [
        ("auto", "2.9.0", "pjrt"),
        ("auto", "2.1.0+libtpu", "pjrt"),
        ("auto", "2.0.0", "xrt"),
        ("auto", "1.13.1", "xrt"),
        ("auto", None, "pjrt"),
        ("xrt", "2.0", "xrt"),
        ("pjrt", "2.0.0", "pjrt"),
    ],
)
def test_resolve_runtime(requested, xla_version, runtime):
    assert packages.resolve_runtime(requested, xla_version) == runtime


def test_installed_version_reads_metadata():
    assert releases.installed_version("pytest") is not None
    assert releases.installed_version("no-such-distribution-xlarun") is None


def test_major_minor():
    assert releases.major_minor("2.10.0a0+git1234") == (2, 10)
    with pytest.raises(UsageError):
        releases.major_minor("nightly")


def test_preflight_accepts_matching_pair():
    packages.preflight("tpu", "pjrt", version_of=versions(torch="2.9.0+cpu", torch_xla="2.9.0", libtpu="0.0.21"))


def test_preflight_takes_a_libtpu_from_tpu_library_path_or_a_bundling_build():
    packages.preflight(
        "tpu", "pjrt", tpu_library_path="/opt/libtpu.so", version_of=versions(torch="2.9.0", torch_xla="2.9.0")
    )
    packages.preflight("tpu", "pjrt", version_of=versions(torch="2.1.0", torch_xla="2.1.0+libtpu"))


@pytest.mark.parametrize(
    "device, runtime, installed, kwargs, message",
    [
        ("tpu", "pjrt", {"torch": "2.9.0"}, {}, "needs torch_xla, which is not installed"),
        ("cpu", "pjrt", {"torch": "2.9.0"}, {"spmd": True}, "needs torch_xla"),
        ("cpu", "pjrt", {"torch": "2.9.0"}, {"virtual_devices": 4}, "needs torch_xla"),
        ("tpu", "pjrt", {"torch": "2.8.0", "torch_xla": "2.9.0"}, {}, "torch_xla 2.9.0 needs torch 2.9.x"),
        ("tpu", "pjrt", {"torch_xla": "2.9.0"}, {}, "needs torch 2.9.x, which is not installed"),
        ("cuda", "pjrt", {"torch": "2.9.0", "torch_xla": "2.9.0"}, {}, "no CUDA support"),
        ("cuda", "pjrt", {"torch": "2.1.2", "torch_xla": "2.1.0"}, {}, "needs torch_xla 2.2 to 2.8"),
        ("cuda", "xrt", {"torch": "2.9.0", "torch_xla": "2.9.0"}, {}, "2.1 removed XRT"),
        ("neuron", "pjrt", {"torch": "2.9.0", "torch_xla": "2.9.0"}, {}, "libneuronxla"),
        ("tpu", "pjrt", {"torch": "2.9.0", "torch_xla": "2.9.0"}, {}, r"needs libtpu.*torch_xla\[tpu\]==2.9.0"),
    ],
)
def test_preflight_refuses_with_one_line(device, runtime, installed, kwargs, message):
    with pytest.raises(UsageError, match=message) as caught:
        packages.preflight(device, runtime, version_of=versions(**installed), **kwargs)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "device, runtime, installed",
    [
        ("cpu", "pjrt", {"torch": "2.9.0"}),  # plain torch CPU workers need no XLA
        ("cuda", "pjrt", {"torch": "2.8.0", "torch_xla": "2.8.0"}),
        ("cuda", "xrt", {"torch": "2.0.1", "torch_xla": "2.0"}),
        ("cpu", "xrt", {"torch": "1.13.1", "torch_xla": "1.13"}),
        ("neuron", "pjrt", {"torch": "2.9.0", "torch_xla": "2.9.0", "libneuronxla": "2.2.0"}),
    ],
)
def test_preflight_accepts(device, runtime, installed):
    packages.preflight(device, runtime, version_of=versions(**installed))


def test_preflight_on_this_python_accepts_cpu():
    # This environment pairs torch 2.9 with torch_xla 2.9 (or has no torch_xla at all).
    packages.preflight("cpu", "pjrt")


# ---- MegaScale (several TPU slices)


@pytest.mark.parametrize(
    "address, split",
    [
        ("coordinator.svc:8080", ("coordinator.svc", 8080)),
        ("[fe80::1]:8081", ("fe80::1", 8081)),
        ("coordinator.svc", ("coordinator.svc", None)),
        ("fe80::1", ("fe80::1", None)),
    ],
)
def test_a_coordinator_address_splits_into_host_and_port(address, split):
    assert megascale.split_port(address) == split


def test_torch_xla_tpu_workers_get_the_megascale_settings_with_node_0_as_coordinator_by_default():
    joined = megascale.MegaScale(slices=2, slice_id=1)
    options = XlaOptions(device="tpu", runtime="pjrt", tpu_topology=V4_16, megascale=joined)
    variables = xla_env(options, nodes(4, 4, 3, master_addr="slice0-host0"), 2)
    assert {name: variables[name] for name in variables if name.startswith("MEGASCALE_")} == {
        "MEGASCALE_COORDINATOR_ADDRESS": "slice0-host0:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert variables["TPU_PROCESS_BOUNDS"] == "2,2,2"  # one slice's bounds: libtpu joins the slices
    given = megascale.MegaScale(slices=2, slice_id=1, coordinator="coord:9000", port=9001)
    assert given.variables("slice0-host0") == {
        "MEGASCALE_COORDINATOR_ADDRESS": "coord:9000",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "9001",
    }


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),
        ({"MEGASCALE_NUM_SLICES": "1", "MEGASCALE_SLICE_ID": "0"}, None),
        ({"MEGASCALE_SLICE_ID": "0"}, None),
        (
            {"MEGASCALE_NUM_SLICES": "3", "MEGASCALE_SLICE_ID": "2", "MEGASCALE_COORDINATOR_ADDRESS": "c:1"},
            megascale.MegaScale(slices=3, slice_id=2, coordinator="c:1"),
        ),
    ],
)
def test_megascale_settings_are_read_for_several_slices_only(environ, expected):
    assert megascale.read_megascale(environ) == expected


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"MEGASCALE_NUM_SLICES": "two"}, "MEGASCALE_NUM_SLICES='two' is not a whole number"),
        ({"MEGASCALE_NUM_SLICES": "2"}, "MEGASCALE_SLICE_ID is unset"),
        ({"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "2"}, "MEGASCALE_SLICE_ID=2 is outside"),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "MEGASCALE_COORDINATOR_ADDRESS": "c"},
            "MEGASCALE_COORDINATOR_ADDRESS='c' has no port",
        ),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "MEGASCALE_COORDINATOR_ADDRESS": "c:0"},
            "MEGASCALE_COORDINATOR_ADDRESS='c:0' has port 0, not a TCP port",
        ),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "MEGASCALE_PORT": "0"},
            "MEGASCALE_PORT=0 is not a TCP port",
        ),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "SKIP_MEGASCALE_PJRT_CLIENT": "true"},
            "SKIP_MEGASCALE_PJRT_CLIENT is set",
        ),
        ({"MEGASCALE_NUM_SLICES": "0", "MEGASCALE_SLICE_ID": "0"}, "MEGASCALE_NUM_SLICES=0 is no slice count"),
        ({"MEGASCALE_NUM_SLICES": "00"}, "MEGASCALE_NUM_SLICES=0 is no slice count"),
        ({"MEGASCALE_SLICE_ID": "1"}, "MEGASCALE_SLICE_ID=1 is set without MEGASCALE_NUM_SLICES"),
        ({"MEGASCALE_NUM_SLICES": "1", "MEGASCALE_SLICE_ID": "7"}, "MEGASCALE_SLICE_ID=7 is outside"),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "MEGASCALE_COORDINATOR_ADDRESS": "a b;c:8080"},
            "MEGASCALE_COORDINATOR_ADDRESS='a b;c:8080' names no host",
        ),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0", "MEGASCALE_COORDINATOR_ADDRESS": ":8080"},
            "MEGASCALE_COORDINATOR_ADDRESS=':8080' names no host",
        ),
        (
            {"MEGASCALE_NUM_SLICES": "1000000000", "MEGASCALE_SLICE_ID": "999999999"},
            "MEGASCALE_NUM_SLICES=1000000000 is more slices than any job has",
        ),
    ],
)
def test_megascale_settings_libtpu_cannot_join_are_refused(environ, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        megascale.read_megascale(environ)


def test_the_manual_names_the_most_slices_a_job_is_planned_with():
    assert f"over {megascale.MAX_SLICES} slices" in (REPO / "docs" / "multinode.md").read_text().replace("\n  ", " ")


@pytest.mark.parametrize(
    "coordinator",
    ["coord.svc.cluster.local:8080", "llama-slice-0-0.llama:8081", "10.0.0.3:8080", "[fe80::1]:8080", "c_1:1"],
)
def test_a_coordinator_named_by_host_or_address_is_taken(coordinator):
    environ = {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1", "MEGASCALE_COORDINATOR_ADDRESS": coordinator}
    assert megascale.read_megascale(environ) == megascale.MegaScale(slices=2, slice_id=1, coordinator=coordinator)
    most = {**environ, "MEGASCALE_NUM_SLICES": str(megascale.MAX_SLICES), "MEGASCALE_SLICE_ID": "0"}
    assert megascale.read_megascale(most) == megascale.MegaScale(megascale.MAX_SLICES, 0, coordinator)
