"""TorchNeuron's torch pairing: each torch-neuronx release is built for given torch releases and says which in
its own ``Requires-Dist: torch==X.Y.*``; a launch whose torch does not meet it is refused in one line quoting
that requirement, and nothing starts. The installed packages are stand-ins: ``<name>-<version>.dist-info``
folders first on the launcher's ``PYTHONPATH`` (xlarun reads only their metadata)."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import REPO, TESTS, run_xlarun, worker

from xlarun.runtimes.releases import installed_version, major_minor

TRN2 = {"XLARUN_HOST_ROOT": str(TESTS / "fixtures" / "hosts" / "trn2-48xlarge")}


def site_with(tmp_path: Path, distributions: dict[str, str], torch_requirement: str) -> dict[str, str]:
    """A PYTHONPATH whose first folder holds these distributions, torch-neuronx requiring ``torch_requirement``."""
    site = tmp_path / "site"
    for name, version in distributions.items():
        folder = site / f"{name}-{version}.dist-info"
        folder.mkdir(parents=True)
        (folder / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Requires-Dist: {torch_requirement}\nRequires-Dist: numpy\n\n"
            "torch==9.9.* in the description is not a requirement\n"
        )
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def launch(tmp_path: Path, distributions: dict[str, str], torch_requirement: str):
    return run_xlarun(
        "--runtime",
        "torchneuron",
        "--nproc-per-node",
        "1",
        worker("marker.py"),
        tmp_path / "ran",
        env={**TRN2, **site_with(tmp_path, distributions, torch_requirement)},
    )


def test_a_torch_neuronx_built_for_another_torch_is_refused_in_its_own_words(tmp_path: Path) -> None:
    result = launch(tmp_path, {"torch": "2.9.0", "torch_neuronx": "2.13.3.0"}, "torch==2.13.*")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "xlarun: error: torch-neuronx 2.13.3.0 needs torch==2.13.* (its requirement), but "
        "torch 2.9.0 is installed: install matching releases\n"
    )
    assert not (tmp_path / "ran").exists(), "a worker started"


def test_a_torch_neuronx_built_for_the_installed_torch_passes_the_check(tmp_path: Path) -> None:
    torch = installed_version("torch")
    assert torch is not None
    major, minor = major_minor(torch)
    result = launch(tmp_path, {"torch_neuronx": f"{major}.{minor}.3.0"}, f"torch (=={major}.{minor}.*)")
    if installed_version("torch_xla") is None:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "ran").exists()
    else:  # the next check: beside torch_xla, torch-neuronx is AWS's PyTorch/XLA library
        assert result.returncode == 2
        assert result.stderr.startswith(f"xlarun: error: torch-neuronx {major}.{minor}.3.0 beside torch_xla "), (
            result.stderr
        )
