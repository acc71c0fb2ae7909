"""The stub ``gcloud`` (``tests/fixtures/gcloud/gcloud``) that ``--tpu-pod`` tests run instead of Google's.

- ``stub_gcloud(tmp_path, pods)``: writes the stub's state file and returns the environment that
  puts the stub first on PATH, and where its calls are logged (``calls()`` reads them back).
- ``pod_description(ips)``: what ``tpu-vm describe --format=json`` says of a READY pod whose
  workers have those internal addresses (the fields the launcher reads, and a few it does not).
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


def stub_gcloud(directory: Path, pods: Mapping[str, Mapping[str, Any]]) -> StubGcloud:
    """``pods``: name -> {"zone", "describe", "metadata_hosts"} (see the stub's docstring)."""
    log = directory / "gcloud-calls.jsonl"
    state = directory / "gcloud-state.json"
    state.write_text(json.dumps({"log": str(log), "pods": pods}))
    env = {"PATH": f"{STUB_DIR}{os.pathsep}{os.environ.get('PATH', '')}", "STUB_GCLOUD_STATE": str(state)}
    return StubGcloud(env, log)
