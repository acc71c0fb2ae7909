"""``--tpu-pod NAME --tpu-zone ZONE`` against a stub gcloud: the pod's workers listed once from its
description, each reached with ``gcloud compute tpus tpu-vm ssh --worker=N -- -T``, each node's rank
and node 0 read from its own VM's metadata server (here one stub server per worker). A TPU7x slice, a
managed instance group, where no Cloud TPU has the name: its instances listed once, each reached with
``gcloud compute ssh INSTANCE -- -T``.

The stub (``tests/fixtures/gcloud/gcloud``) runs ssh's command here with ``sh -c``, pointing it at the
worker's metadata server; the workers' addresses are loopback ones, so node 0 is reachable.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

import pytest
from gcloud import StubGcloud, group_instances, pod_description, stub_gcloud
from helpers import Run, files_exist, finish, free_port, is_alive, read_pid, run_xlarun, start_xlarun, wait_for
from metadata import Served, serve_metadata, slice_attributes

IPS = ["127.0.0.1", "127.0.0.2"]
INSTANCES = ["slice-7x-w0", "slice-7x-w1"]
ZONE = "us-central2-b"
WORKER = (
    "import os\nprint('rank', os.environ['RANK'], 'node', os.environ['GROUP_RANK'], 'of',\n"
    "      os.environ['WORLD_SIZE'], 'at', os.environ['MASTER_ADDR'] + ':' + os.environ['MASTER_PORT'], flush=True)\n"
)


class Pod(NamedTuple):
    gcloud: StubGcloud
    metadata: list[Served]
    workdir: Path

    def run(self, *flags: object, env: dict[str, str] | None = None, name: str = "pod") -> Run:
        return run_xlarun(
            "--tpu-pod",
            name,
            "--tpu-zone",
            ZONE,
            *flags,
            "--nproc-per-node",
            "1",
            "train.py",
            env={**self.gcloud.env, **(env or {})},
            cwd=self.workdir,
            timeout=180,
        )

    def ssh_calls(self) -> list[list[str]]:
        return [call for call in self.gcloud.calls() if "ssh" in call[1:4]]


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    (tmp_path / "train.py").write_text(WORKER)
    with ExitStack() as stack:
        served = [stack.enter_context(serve_metadata(slice_attributes(worker, IPS))) for worker in range(len(IPS))]
        gcloud = stub_gcloud(
            tmp_path,
            {
                "pod": {
                    "zone": ZONE,
                    "describe": pod_description(IPS),
                    "metadata_hosts": [server.host for server in served],
                }
            },
            {
                "slice-7x": {
                    "zone": ZONE,
                    "list": group_instances(INSTANCES, ZONE),
                    "metadata_hosts": {name: server.host for name, server in zip(INSTANCES, served, strict=True)},
                }
            },
        )
        yield Pod(gcloud, served, tmp_path)


def test_the_dry_run_lists_the_pod_once_and_plans_gclouds_ssh_per_worker(pod: Pod) -> None:
    result = pod.run("--dry-run")
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [host["host"] for host in hosts] == IPS
    for index, host in enumerate(hosts):
        transport = host["transport"]
        assert transport[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", ZONE]
        assert transport[8:11] == [f"--worker={index}", "--quiet", "--command"] and transport[12:] == ["--", "-T"]
        assert transport[11].endswith(" -m xlarun --agent-stdin")
        plan = host["plan"]
        # Each host reads its node rank and node 0 from its metadata, not from the launcher.
        assert plan["node_rank"] is None and "--cluster=tpu-vm" in plan["argv"]
        assert not any(word.startswith(("--node-rank", "--nnodes", "--master-addr")) for word in plan["argv"])
    # The description was read once; no VM was contacted.
    assert pod.gcloud.calls() == [["compute", "tpus", "tpu-vm", "describe", "pod", "--zone", ZONE, "--format=json"]]
    assert all(server.requests == [] for server in pod.metadata)


def test_every_worker_of_the_pod_runs_its_node_with_the_rank_its_metadata_gives(pod: Pod) -> None:
    port = free_port()
    result = pod.run("--master-port", port)
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if " rank " in line) == [
        f"127.0.0.1:0: rank 0 node 0 of 2 at 127.0.0.1:{port}",
        f"127.0.0.2:1: rank 1 node 1 of 2 at 127.0.0.1:{port}",
    ], result.stdout  # --master-port reaches every host
    calls = pod.gcloud.calls()
    assert calls[0][3] == "describe" and [call[3] for call in calls].count("describe") == 1
    ssh = sorted(pod.ssh_calls())
    assert [call[:8] for call in ssh] == [
        ["compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", ZONE, f"--worker={n}"] for n in range(2)
    ]
    assert all(call[8:10] == ["--quiet", "--command"] and call[11:] == ["--", "-T"] for call in ssh), ssh
    # Each node asked its own VM's metadata server who it is.
    for server in pod.metadata:
        assert any(path.endswith("/agent-worker-number") for path, _ in server.requests), server.requests


def test_a_pod_gcloud_cannot_describe_is_one_line_and_starts_nothing(pod: Pod) -> None:
    result = run_xlarun("--tpu-pod", "other", "--tpu-zone", ZONE, "train.py", env=pod.gcloud.env, cwd=pod.workdir)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"xlarun: error: --tpu-pod other: gcloud compute tpus tpu-vm describe other --zone {ZONE} --format=json "
        f"failed: ERROR: (gcloud.compute.tpus.tpu-vm) NOT_FOUND: Resource "
        f"'projects/stub/locations/{ZONE}/nodes/other' was not found; nor a managed instance group: gcloud compute "
        f"instance-groups managed list-instances other --zone {ZONE} --format=json failed: ERROR: "
        f"(gcloud.compute.instance-groups.managed.list-instances) HTTPError 404: The resource "
        f"'projects/stub/zones/{ZONE}/instanceGroupManagers/other' was not found"
    ]
    assert pod.ssh_calls() == []


def test_no_gcloud_is_one_line(pod: Pod, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = run_xlarun("--tpu-pod", "pod", "train.py", env={"PATH": str(empty)}, cwd=pod.workdir)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "xlarun: error: --tpu-pod pod: gcloud is not installed (not on PATH): "
        "install the Google Cloud CLI, or name the VMs with --hosts"
    ]


def test_the_dry_run_lists_a_tpu7x_slices_instances_and_plans_gclouds_ssh_to_each(pod: Pod) -> None:
    result = pod.run("--dry-run", name="slice-7x")
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [host["host"] for host in hosts] == INSTANCES
    for instance, host in zip(INSTANCES, hosts, strict=True):
        transport = host["transport"]
        assert transport[:8] == ["gcloud", "compute", "ssh", instance, "--zone", ZONE, "--quiet", "--command"]
        assert transport[8].endswith(" -m xlarun --agent-stdin") and transport[9:] == ["--", "-T"]
        assert "--cluster=tpu-vm" in host["plan"]["argv"] and host["plan"]["node_rank"] is None
    assert pod.gcloud.calls() == [
        ["compute", "tpus", "tpu-vm", "describe", "slice-7x", "--zone", ZONE, "--format=json"],
        ["compute", "instance-groups", "managed", "list-instances", "slice-7x", "--zone", ZONE, "--format=json"],
    ]
    assert all(server.requests == [] for server in pod.metadata)


def test_every_instance_of_a_tpu7x_slice_runs_its_node_with_the_rank_its_metadata_gives(pod: Pod) -> None:
    port = free_port()
    result = pod.run("--master-port", port, name="slice-7x")
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if " rank " in line) == [
        f"slice-7x-w0:0: rank 0 node 0 of 2 at 127.0.0.1:{port}",
        f"slice-7x-w1:1: rank 1 node 1 of 2 at 127.0.0.1:{port}",
    ], result.stdout
    assert sorted(call[:6] for call in pod.ssh_calls()) == [
        ["compute", "ssh", instance, "--zone", ZONE, "--quiet"] for instance in INSTANCES
    ]
    for server in pod.metadata:
        assert any(path.endswith("/agent-worker-number") for path, _ in server.requests), server.requests


def test_ctrl_c_while_gcloud_describes_the_pod_is_one_line_and_130(tmp_path: Path) -> None:
    """A gcloud that answers slowly (a login prompt, a slow API) is interrupted as any wait of the launcher's:
    one line, exit 130, no traceback, and the gcloud it started gone with it."""
    bin_dir, started = tmp_path / "bin", tmp_path / "gcloud.pid"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f"#!/bin/sh\necho $$ > {started}.tmp && mv {started}.tmp {started}\nexec sleep 600\n")
    gcloud.chmod(0o755)
    (tmp_path / "train.py").write_text(WORKER)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    launcher = start_xlarun("--tpu-pod", "pod", "--tpu-zone", ZONE, "train.py", env=env, cwd=tmp_path)
    wait_for(files_exist(started), "the stub gcloud to start")
    gcloud_pid = read_pid(started)
    launcher.send_signal(signal.SIGINT)
    ended = finish(launcher)
    assert ended.returncode == 130, ended.stderr
    assert "Traceback" not in ended.stderr and ended.stderr.strip().count("\n") == 0, ended.stderr
    wait_for(lambda: not is_alive(gcloud_pid), "the interrupted gcloud to end")
