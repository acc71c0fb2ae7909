"""``--nproc-per-node NAME`` for the installed torch's PrivateUse1 backend, as torchrun's
``determine_local_world_size`` takes it: a real backend package (a ``torch.backends`` entry point that
renames PrivateUse1 to ``foo`` and registers ``torch.foo`` with 3 devices) makes both launchers start 3
workers; another word is refused in one line naming the backend's name. (``tpu`` and ``neuron`` count from
the host's files: ``tests/unit/test_options.py``.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_torchrun, run_xlarun

BACKEND = """
import types


def load():
    import torch

    torch.utils.rename_privateuse1_backend("foo")
    module = types.ModuleType("torch.foo")
    module.device_count = lambda: 3
    module.is_available = lambda: True
    torch._register_device_module("foo", module)
"""


@pytest.fixture
def backend_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with the ``foodev`` package and its metadata, whose entry point torch loads on import."""
    (tmp_path / "foodev").mkdir()
    (tmp_path / "foodev" / "__init__.py").write_text(BACKEND)
    metadata = tmp_path / "foodev-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: foodev\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text("[torch.backends]\nfoodev = foodev:load\n")
    # Loaded as torch loads every device backend, which a stack may have switched off for its other tests.
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
    }


def test_the_backends_name_counts_its_devices_as_under_torchrun(backend_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    # A file per rank: torchrun's workers share its stdout, where lines may interleave.
    script.write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], os.environ['RANK'] + '-of-' + os.environ['WORLD_SIZE']), 'w')\n"
    )
    planned = run_xlarun("--dry-run", "--nproc-per-node", "foo", script, env=backend_env)
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["nproc_per_node"] == 3
    for run in (run_xlarun, run_torchrun):
        ranks = tmp_path / run.__name__
        ranks.mkdir()
        result = run("--standalone", "--nproc-per-node", "foo", script, ranks, env=backend_env)
        assert result.returncode == 0, result.stderr
        assert sorted(os.listdir(ranks)) == [f"{rank}-of-3" for rank in range(3)]


def test_another_word_is_one_line_naming_the_backend(backend_env: dict[str, str], tmp_path: Path) -> None:
    result = run_xlarun("--nproc-per-node", "bar", tmp_path / "rank.py", env=backend_env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "xlarun: error: --nproc-per-node='bar' is invalid (not this torch's device backend, foo): expected a "
        "positive integer, auto, cpu, gpu or xpu, tpu, neuron or a device backend's name"
    ]
