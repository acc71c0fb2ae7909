"""The stub ``gcloud`` (``tests/fixtures/gcloud/gcloud``) that ``--tpu-pod`` tests run instead of Google's.

- ``stub_gcloud(tmp_path, pods)``: writes the stub's state file and returns the environment that
  puts the stub first on PATH, and where its calls are logged (``calls()`` reads them back).
- ``pod_description(ips)``: what ``tpu-vm describe --format=json`` says of a READY pod whose
  workers have those internal addresses (the fields the launcher reads, and a few it does not).
- ``group_instances(names, zone)``: what ``instance-groups managed list-instances --format=json`` says of a
  managed instance group (a TPU7x slice) whose instances have those names: each object's ``instance`` URL
  (which the launcher reads), ``name``, ``id``, ``instanceStatus``, ``currentAction`` and ``version``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from helpers import TESTS

STUB_DIR = TESTS / "fixtures" / "gcloud"


class StubGcloud(NamedTuple):
    env: dict[str, str]
    """PATH with the stub first, and STUB_GCLOUD_STATE."""
    log: Path

    def calls(self) -> list[list[str]]:
        """Every call's argv after ``gcloud``, in order."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def pod_description(ips: Sequence[str], state: str = "READY") -> dict[str, Any]:
    return {
        "name": "projects/stub/locations/us-central2-b/nodes/pod",
        "acceleratorType": "v4-16",
        "state": state,
        "networkEndpoints": [
            {"ipAddress": ip, "port": 8470, "accessConfig": {"externalIp": f"34.0.0.{n}"}} for n, ip in enumerate(ips)
        ],
    }


def group_instances(names: Sequence[str], zone: str) -> list[dict[str, Any]]:
    compute = "https://www.googleapis.com/compute/v1/projects/stub"
    return [
        {
            "currentAction": "NONE",
            "id": str(4711000 + number),
            "instance": f"{compute}/zones/{zone}/instances/{name}",
            "instanceStatus": "RUNNING",
            "name": name,
            "version": {"instanceTemplate": f"{compute}/global/instanceTemplates/tpu7x-template"},
        }
        for number, name in enumerate(names)
    ]


def stub_gcloud(
    directory: Path, pods: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Mapping[str, Any]] | None = None
) -> StubGcloud:
    """``pods``: name -> {"zone", "describe", "metadata_hosts"}; ``groups``: name -> {"zone", "list",
    "metadata_hosts"} (see the stub's docstring)."""
    log = directory / "gcloud-calls.jsonl"
    state = directory / "gcloud-state.json"
    state.write_text(json.dumps({"log": str(log), "pods": pods, "groups": groups or {}}))
    env = {"PATH": f"{STUB_DIR}{os.pathsep}{os.environ.get('PATH', '')}", "STUB_GCLOUD_STATE": str(state)}
    return StubGcloud(env, log)
