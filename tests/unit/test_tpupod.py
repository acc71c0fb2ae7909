"""--tpu-pod's pieces (xlarun.remote.tpupod): the workers listed by the stub gcloud, the refusals, the ssh template."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from gcloud import pod_description, stub_gcloud

from xlarun.exceptions import UsageError
from xlarun.remote.tpupod import describe_argv, endpoint_addresses, pod_hosts, pod_rsh_template
from xlarun.remote.transport import remote_command, transport_argv

IPS = ["10.130.0.2", "10.130.0.3", "10.130.0.4", "10.130.0.5"]


@pytest.fixture
def gcloud_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stub = stub_gcloud(
        tmp_path,
        {
            "pod": {"zone": "us-central2-b", "describe": pod_description(IPS), "metadata_hosts": []},
            "empty": {"zone": "us-central2-b", "describe": pod_description([], "CREATING"), "metadata_hosts": []},
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
