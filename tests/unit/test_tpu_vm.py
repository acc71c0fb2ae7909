"""--cluster tpu-vm: a TPU VM's metadata server gives the node rank, node 0, the host list and the slice's
shape, for torch_xla and TorchTPU alike; here the server is a stub on 127.0.0.1 (``tests/metadata.py``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from helpers import TESTS, prepare, refusal, slack_s
from metadata import HANGING_NAME, PREFIX, Behaviour, hanging_lookup, serve_metadata, slice_attributes

from xlarun.exceptions import UsageError
from xlarun.host.metadata import MetadataError, instance_attributes
from xlarun.planning.cluster import TPU_VM_ATTRIBUTES, ClusterSettings, detect_cluster
from xlarun.ranks import NodeAssignment

V4_HOST = str(TESTS / "fixtures" / "hosts" / "tpu-v4-vm")
IPS = ["10.130.0.2", "10.130.0.3"]


def test_the_metadata_gives_node_rank_nodes_node_0_and_the_slice() -> None:
    with serve_metadata(slice_attributes(1, IPS)) as served:
        settings = detect_cluster("tpu-vm", {"GCE_METADATA_HOST": served.host})
    assert settings == ClusterSettings(
        kind="tpu-vm",
        nnodes=2,
        node_rank=1,
        master_addr="10.130.0.2",
        master_port=None,
        run_id=None,
        device_environ={
            "TPU_WORKER_ID": "1",
            "TPU_WORKER_HOSTNAMES": "10.130.0.2,10.130.0.3",
            "TPU_ACCELERATOR_TYPE": "v4-16",
            "TPU_HOST_BOUNDS": "1,1,2",
            "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        },
    )
    # Every request carried the header the real server demands (the stub refuses others with 403).
    assert {flavor for _, flavor in served.requests} == {"Google"}
    assert sorted(path.rsplit("/", 1)[1] for path, _ in served.requests) == [
        "agent-worker-number",
        "tpu-env",
        "worker-network-endpoints",
    ]


def test_each_value_names_the_metadata_attribute_it_was_read_from() -> None:
    with serve_metadata(slice_attributes(1, IPS)) as served:
        settings = detect_cluster("tpu-vm", {"GCE_METADATA_HOST": served.host})
        # A master port keeps the lone node static, where its rank is checked against the node count
        # (torchrun 2.12+ runs a lone node without one as --standalone, whose rendezvous reads no rank).
        message = refusal(
            "--cluster",
            "tpu-vm",
            "--nnodes",
            "1",
            "--master-port",
            "29400",
            "t.py",
            env={"GCE_METADATA_HOST": served.host},
        )
    assert settings is not None and settings.read_from == {
        "nnodes": "worker-network-endpoints",
        "node_rank": "agent-worker-number",
        "master_addr": "worker-network-endpoints",
    }
    assert message.startswith("--node-rank=1 (from --cluster tpu-vm: agent-worker-number) is out of range")


def test_torch_xlas_own_tpu_env_keys_stand_in_for_the_host_bounds() -> None:
    tpu_env = "ACCELERATOR_TYPE: 'v5litepod-16'\nTPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'\nTPU_PROCESS_BOUNDS: '2,2,1'\n"
    with serve_metadata(slice_attributes(0, [*IPS, "10.130.0.4", "10.130.0.5"], tpu_env)) as served:
        settings = detect_cluster("tpu-vm", {"GCE_METADATA_HOST": served.host})
    assert settings is not None
    assert settings.device_environ["TPU_HOST_BOUNDS"] == "2,2,1"
    assert settings.device_environ["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({}, "answered 404 for agent-worker-number"),
        (
            {**slice_attributes(0, IPS), "worker-network-endpoints": "10.130.0.2,10.130.0.3"},
            "is not a list of <name>:<uid>:<ip> entries",
        ),
        (slice_attributes(2, IPS), "agent-worker-number=2 is not below the node count 2"),
        ({**slice_attributes(0, IPS), "agent-worker-number": "one"}, "agent-worker-number='one' is not a whole number"),
    ],
)
def test_a_broken_metadata_server_is_one_line(attributes: dict[str, str], message: str) -> None:
    with serve_metadata(attributes) as served, pytest.raises(UsageError) as refused:
        detect_cluster("tpu-vm", {"GCE_METADATA_HOST": served.host})
    assert str(refused.value).startswith("--cluster tpu-vm: ") and message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_no_metadata_server_is_one_line_naming_where_it_looked() -> None:
    with serve_metadata({}) as served:
        gone = served.host
    message = refusal("--cluster", "tpu-vm", "t.py", env={"GCE_METADATA_HOST": gone})
    assert f"cannot reach the metadata server at {gone} for agent-worker-number" in message
    assert "run on a TPU VM (or point GCE_METADATA_HOST at its metadata server)" in message


def test_torch_xla_workers_get_the_slices_bounds_from_the_metadata() -> None:
    with serve_metadata(slice_attributes(1, IPS)) as served:
        prepared = prepare(
            "--cluster",
            "tpu-vm",
            "--runtime",
            "pjrt",
            "--nproc-per-node",
            "4",
            "--dry-run",
            "t.py",
            env={"GCE_METADATA_HOST": served.host, "XLARUN_HOST_ROOT": V4_HOST},
        )
    config = prepared.config
    assert (config.node_rank, config.max_nodes, config.master_addr) == (1, 2, "10.130.0.2")
    node = NodeAssignment.single_node("job", 4, "10.130.0.2", 29500, node_rank=1, nnodes=2)
    variables = prepared.device.variables(node, 3)
    assert variables["TPU_PROCESS_BOUNDS"] == "2,2,2" and variables["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    # What the metadata says plans the device; the workers do not get it as variables.
    assert "TPU_HOST_BOUNDS" not in variables and "TPU_WORKER_ID" not in variables


def test_torchtpu_workers_get_the_slices_topology_and_the_worker_number_checked() -> None:
    with serve_metadata(slice_attributes(1, IPS)) as served:
        env = {"GCE_METADATA_HOST": served.host, "XLARUN_HOST_ROOT": V4_HOST}
        prepared = prepare(
            "--cluster", "tpu-vm", "--runtime", "torchtpu", "--nproc-per-node", "auto", "--dry-run", "t.py", env=env
        )
        mismatch = refusal(
            "--cluster",
            "tpu-vm",
            "--runtime",
            "torchtpu",
            "--nproc-per-node",
            "auto",
            "--node-rank",
            "0",
            "--dry-run",
            "t.py",
            env=env,
        )
    node = NodeAssignment(
        run_id="job",
        node_rank=1,
        nnodes=2,
        local_world_size=4,
        rank_offset=4,
        world_size=8,
        master_addr="10.130.0.2",
        master_port=29500,
        hosts=tuple(IPS),
        job_started_ns=7,
    )
    variables = prepared.device.variables(node, 0)
    assert variables["TORCH_TPU_TOPOLOGY"] == "2,2,2"  # the slice's, not this host's 2,2,1
    assert variables["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")[4] == "10.130.0.3:8070"
    assert "this host is worker 1 of its TPU slice but node rank 0" in mismatch


MULTISLICE_TPU_ENV = "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '{slice_id}'\nMEGASCALE_PORT: '8081'\n"
"""The ``tpu-env`` keys of a host of a queued resource of two slices, without a coordinator."""
SLICE_1_IPS = ["10.130.1.2", "10.130.1.3"]


def test_a_multislice_tpu_env_places_the_host_slice_by_slice_and_its_workers_get_the_megascale_settings() -> None:
    from metadata import V4_16_TPU_ENV

    tpu_env = V4_16_TPU_ENV + MULTISLICE_TPU_ENV.format(slice_id=1)
    with serve_metadata(slice_attributes(1, SLICE_1_IPS, tpu_env)) as served:
        settings = detect_cluster("tpu-vm", {"GCE_METADATA_HOST": served.host})
        env = {"GCE_METADATA_HOST": served.host, "XLARUN_HOST_ROOT": V4_HOST}
        prepared = prepare(
            "--cluster",
            "tpu-vm",
            "--runtime",
            "torchtpu",
            "--nproc-per-node",
            "auto",
            "--master-addr",
            "10.130.0.2",
            "--dry-run",
            "t.py",
            env=env,
        )
        without_master = refusal("--cluster", "tpu-vm", "--dry-run", "t.py", env=env)
    assert (settings.nnodes, settings.node_rank, settings.master_addr) == (4, 3, None)
    assert settings.read_from["node_rank"] == "MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID, agent-worker-number"
    assert "cannot tell where node 0 runs" in without_master
    hosts = ("10.130.0.2", "10.130.0.3", *SLICE_1_IPS)
    node = NodeAssignment(
        run_id="job",
        node_rank=3,
        nnodes=4,
        local_world_size=4,
        rank_offset=12,
        world_size=16,
        master_addr="10.130.0.2",
        master_port=29500,
        hosts=hosts,
        job_started_ns=7,
    )
    variables = prepared.device.variables(node, 0)
    # The workers get the settings the metadata holds, which the launcher's environment lacks, and the
    # coordinator at node 0 on MEGASCALE_PORT.
    assert {name: value for name, value in variables.items() if name.startswith("MEGASCALE_")} == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.130.0.2:8081",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8081",
    }
    # The slice builder joins this slice's chips: the list names its two hosts, the topology is its own.
    assert variables["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
        f"{ip}:{8070 + index}" for ip in SLICE_1_IPS for index in range(4)
    )
    assert variables["TORCH_TPU_TOPOLOGY"] == "2,2,2"


@pytest.mark.parametrize(
    ("tpu_env", "message"),
    [
        (
            "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '10.130.0.2'\n",
            "MEGASCALE_COORDINATOR_ADDRESS='10.130.0.2' has no port",
        ),
        ("MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '5'\n", "MEGASCALE_SLICE_ID=5 is outside"),
        (
            "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: 'a b:1'\n",
            "tpu-env's MEGASCALE_COORDINATOR_ADDRESS='a b:1' is not an address",
        ),
    ],
)
def test_a_multislice_tpu_env_xlarun_cannot_plan_is_one_line(tpu_env: str, message: str) -> None:
    with serve_metadata(slice_attributes(0, IPS, tpu_env)) as served:
        assert refusal("--cluster", "tpu-vm", "--dry-run", "t.py", env={"GCE_METADATA_HOST": served.host}).startswith(
            f"--cluster tpu-vm: {message}"
        )


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("drip", "did not answer agent-worker-number within 0.5 s"),
        ("endless", "sent more than 1 MiB for agent-worker-number"),
        ("redirect", "answered 302 for agent-worker-number"),
    ],
)
def test_a_server_that_misbehaves_is_one_reason_within_the_deadline(behaviour: Behaviour, message: str) -> None:
    with serve_metadata(slice_attributes(1, IPS), behaviour) as served:
        started = time.monotonic()
        with pytest.raises(MetadataError) as failed:
            instance_attributes(TPU_VM_ATTRIBUTES, {"GCE_METADATA_HOST": served.host}, deadline_s=0.5)
        took = time.monotonic() - started
    assert str(failed.value) == f"the metadata server at {served.host} {message}"
    assert took < 0.5 + slack_s(1.5), took
    assert [path for path, _ in served.requests] == [PREFIX + "agent-worker-number"]


def test_a_name_whose_lookup_never_ends_is_one_reason_within_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hanging_lookup(tmp_path) as aliases:
        monkeypatch.setenv("HOSTALIASES", aliases)
        started = time.monotonic()
        with pytest.raises(MetadataError) as failed:
            instance_attributes(TPU_VM_ATTRIBUTES, {"GCE_METADATA_HOST": f"{HANGING_NAME}:8080"}, deadline_s=0.5)
        took = time.monotonic() - started
    assert str(failed.value) == f"the metadata server's name {HANGING_NAME} did not resolve within 0.5 s"
    assert took < 0.5 + slack_s(1.5), took


def test_the_name_is_looked_up_once_for_all_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []
    resolver = socket.getaddrinfo

    def look_up(name: str, *query: object, **options: object) -> object:
        looked_up.append(name)
        return resolver(name, *query, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", look_up)
    with serve_metadata(slice_attributes(1, IPS)) as served:
        instance_attributes(TPU_VM_ATTRIBUTES, {"GCE_METADATA_HOST": served.host.replace("127.0.0.1", "localhost")})
    assert looked_up == ["localhost"]


@pytest.mark.parametrize(
    "host", ["127.0.0.1 --evil", "127.0.0.1:http", "a\r\nX-Forwarded-For: b", "xlarun..invalid", "a" * 64 + ".invalid"]
)
def test_a_metadata_host_that_is_not_host_and_port_is_refused(host: str) -> None:
    with pytest.raises(MetadataError, match=r"^GCE_METADATA_HOST=.* is not host\[:port\]$"):
        instance_attributes(TPU_VM_ATTRIBUTES, {"GCE_METADATA_HOST": host})
