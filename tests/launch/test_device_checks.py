"""A device asked for (flag or ``PJRT_DEVICE``) that this host lacks is one line and exit 2, and nothing
starts; the other device checks run in-process in ``tests/unit/test_device_checks.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO, free_port, run_xlarun, worker

from xlarun.planning import packages


def installed(tmp_path: Path, **versions: str) -> dict[str, str]:
    """An environment whose Python finds these distributions first (xlarun reads only their metadata)."""
    site = tmp_path / "site"
    for name, version in versions.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


@pytest.mark.torch_xla  # torch_xla's preflight order (TorchTPU checks its TPU_LIBRARY_PATH first)
@pytest.mark.parametrize(
    "device, env, lacking",
    [
        ("tpu", {"TPU_LIBRARY_PATH": "/opt/libtpu.so"}, "TPU chips"),
        ("neuron", {"libneuronxla": "2.2.0"}, "Neuron devices"),
        ("cuda", {"torch_xla": "2.8.1", "torch": "2.8.0"}, "NVIDIA GPUs"),
    ],
)
@pytest.mark.parametrize("asked", ["flag", "PJRT_DEVICE"])
def test_a_device_the_host_lacks_is_one_line_and_nothing_starts(
    tmp_path: Path, device: str, env: dict[str, str], lacking: str, asked: str
) -> None:
    variables = {name: value for name, value in env.items() if name.isupper()}
    variables.update(installed(tmp_path, **{name: value for name, value in env.items() if not name.isupper()}))
    flags = ["--device", device] if asked == "flag" else []
    if asked == "PJRT_DEVICE":
        variables["PJRT_DEVICE"] = device.upper()
    result = run_xlarun(
        *flags, "--master-port", free_port(), worker("dump_env.py"), env={**variables, "DUMP_DIR": str(tmp_path)}
    )
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr == f"xlarun: error: device {device} was asked for, but this host has no {lacking}: "
        f"run on a {device} host, or plan for one with --dry-run\n"
    )
    assert not list(tmp_path.glob("*.json")), "a worker started"


def versions(torch_xla: str, **others: str) -> packages.VersionLookup:
    return {"torch_xla": torch_xla, "torch": torch_xla, "libtpu": "0.0.21", "libneuronxla": "2.2.0", **others}.get
