"""--tpu-pod's pieces (xlarun.remote.tpupod): the workers listed by the stub gcloud, the refusals, the ssh template."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from gcloud import group_instances, pod_description, stub_gcloud

from xlarun.exceptions import UsageError
from xlarun.remote.tpupod import (
    describe_argv,
    endpoint_addresses,
    find_pod,
    instance_names,
    instance_rsh_template,
    pod_hosts,
    pod_rsh_template,
)
from xlarun.remote.transport import remote_command, transport_argv

IPS = ["10.130.0.2", "10.130.0.3", "10.130.0.4", "10.130.0.5"]
INSTANCES = ["slice-7x-w0", "slice-7x-w1", "slice-7x-w2", "slice-7x-w3"]


@pytest.fixture
def gcloud_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stub = stub_gcloud(
        tmp_path,
        {
            "pod": {"zone": "us-central2-b", "describe": pod_description(IPS), "metadata_hosts": []},
            "empty": {"zone": "us-central2-b", "describe": pod_description([], "CREATING"), "metadata_hosts": []},
        },
        {
            "slice-7x": {
                "zone": "us-central2-b",
                "list": group_instances(INSTANCES, "us-central2-b"),
                "metadata_hosts": {},
            },
            "no-vms": {"zone": "us-central2-b", "list": [], "metadata_hosts": {}},
        },
    )
    for name, value in stub.env.items():
        monkeypatch.setenv(name, value)
    return stub.log


def test_the_workers_are_the_network_endpoints_in_order(gcloud_on_path: Path) -> None:
    assert pod_hosts("pod", "us-central2-b") == IPS
    assert pod_hosts("pod", None) == IPS  # gcloud's configured zone
    assert describe_argv("pod", "us-central2-b") == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "describe",
        "pod",
        "--zone",
        "us-central2-b",
        "--format=json",
    ]


def test_gclouds_failure_is_one_line_naming_the_pod(gcloud_on_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        pod_hosts("other", "us-central2-b")
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith(
        "--tpu-pod other: gcloud compute tpus tpu-vm describe other --zone us-central2-b "
        "--format=json failed: ERROR: (gcloud.compute.tpus.tpu-vm) NOT_FOUND"
    )
    assert raised.value.exit_code == 2
    with pytest.raises(
        UsageError,
        match=r"^--tpu-pod empty: .*: the pod has no workers \(networkEndpoints is "
        r"empty; state CREATING\)$",
    ):
        pod_hosts("empty", "us-central2-b")


def test_no_gcloud_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        UsageError,
        match=r"^--tpu-pod pod: gcloud is not installed \(not on PATH\): install the "
        r"Google Cloud CLI, or name the VMs with --hosts$",
    ):
        pod_hosts("pod", "z")


@pytest.mark.parametrize(
    ("node", "said"),
    [
        ([], "the description is not a JSON object"),
        ({"networkEndpoints": "10.0.0.1"}, "networkEndpoints is not a list"),
        (
            {"networkEndpoints": [{"ipAddress": "10.0.0.1"}, {"port": 8470}]},
            "worker 1 has no IP address (ipAddress='None')",
        ),
        ({"networkEndpoints": [{"ipAddress": "10.0.0.1; rm -rf ~"}]}, "worker 0 has no IP address"),
        ({"networkEndpoints": [{"ipAddress": "10.0.0.1"}, {"ipAddress": "10.0.0.1"}]}, "the workers' addresses repeat"),
    ],
)
def test_a_description_that_is_not_a_pods_is_refused(node: object, said: str) -> None:
    with pytest.raises(ValueError) as raised:
        endpoint_addresses(node)
    assert str(raised.value).startswith(said)


def test_each_worker_is_reached_by_its_number_without_a_terminal() -> None:
    command = remote_command("/opt/venv/bin/python")
    argv = transport_argv("10.130.0.4", 2, command, rsh_template=pod_rsh_template("my pod", "us-central2-b"))
    assert argv == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "my pod",
        "--zone",
        "us-central2-b",
        "--worker=2",
        "--quiet",
        "--command",
        command,
        "--",
        "-T",
    ]
    assert shlex.split(pod_rsh_template("pod", None))[6:] == [
        "--worker={index}",
        "--quiet",
        "--command",
        "{command}",
        "--",
        "-T",
    ]


def test_a_managed_instance_group_is_found_where_no_cloud_tpu_is(gcloud_on_path: Path) -> None:
    pod = find_pod("slice-7x", "us-central2-b")
    assert pod.hosts == INSTANCES
    assert pod.template == instance_rsh_template("us-central2-b")
    assert [call[:4] for call in map(json.loads, gcloud_on_path.read_text().splitlines())] == [
        ["compute", "tpus", "tpu-vm", "describe"],
        ["compute", "instance-groups", "managed", "list-instances"],
    ]
    # A Cloud TPU of the name comes first: no group is asked for.
    assert find_pod("pod", "us-central2-b").template == pod_rsh_template("pod", "us-central2-b")


def test_neither_a_cloud_tpu_nor_a_group_is_one_line_naming_both(gcloud_on_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        pod_hosts("other", "us-central2-b")
    assert str(raised.value) == (
        "--tpu-pod other: gcloud compute tpus tpu-vm describe other --zone us-central2-b --format=json failed: "
        "ERROR: (gcloud.compute.tpus.tpu-vm) NOT_FOUND: Resource 'projects/stub/locations/us-central2-b/nodes/other' "
        "was not found; nor a managed instance group: gcloud compute instance-groups managed list-instances other "
        "--zone us-central2-b --format=json failed: ERROR: (gcloud.compute.instance-groups.managed.list-instances) "
        "HTTPError 404: The resource 'projects/stub/zones/us-central2-b/instanceGroupManagers/other' was not found"
    )
    with pytest.raises(
        UsageError, match=r"^--tpu-pod no-vms: gcloud compute instance-groups .*: the group has no instances$"
    ):
        pod_hosts("no-vms", "us-central2-b")


@pytest.mark.parametrize(
    ("instances", "said"),
    [
        ({}, "the list is not a JSON array"),
        ([{"instance": "https://x/zones/z/instances/a"}, {"id": "1"}], "instance 1 has no instance name"),
        ([{"instance": "https://x/zones/z/instances/a;rm -rf ~"}], "instance 0 has no instance name"),
        ([{"name": "a"}, {"instance": "https://x/zones/z/instances/a"}], "the instances repeat"),
    ],
)
def test_a_list_that_is_not_a_groups_is_refused(instances: object, said: str) -> None:
    with pytest.raises(ValueError) as raised:
        instance_names(instances)
    assert str(raised.value).startswith(said)


def test_each_instance_is_reached_by_its_name_without_a_terminal() -> None:
    command = remote_command("/opt/venv/bin/python")
    argv = transport_argv("slice-7x-w2", 2, command, rsh_template=instance_rsh_template("us-central2-b"))
    assert argv == [
        "gcloud",
        "compute",
        "ssh",
        "slice-7x-w2",
        "--zone",
        "us-central2-b",
        "--quiet",
        "--command",
        command,
        "--",
        "-T",
    ]
    assert shlex.split(instance_rsh_template(None))[3:] == ["{host}", "--quiet", "--command", "{command}", "--", "-T"]
