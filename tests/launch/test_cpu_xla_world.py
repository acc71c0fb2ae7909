"""PJRT's CPU client under xlarun: every process is an XLA world of its own, and xlarun says so.

- Before several CPU processes of an XLA run start (``--device cpu`` or ``PJRT_DEVICE=CPU``
  given), one line explains the split and what to use instead; a plain job on a host that has
  torch_xla (the device detected) gets no such line. A run that then fails on the store port (each process took itself for rank 0) ends with a line
  naming the split, not a taken port, whichever of its workers failed first.
- The ordinals a CPU worker sees agree with each other (no local place of 1 of 2 in a world
  of one), so the master-only ``xm.save`` writes in every process.
- Workers that move MASTER_PORT and serve their own store (torch_xla's ``test_ddp``) run,
  as no agent store is claimed on one node.
- ``--spmd`` follows torch_xla 2.1+: no ``XLA_USE_SPMD`` (deprecated), SPMD switched on in
  the program, by ``xlarun.init_process_group()`` where the program has not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import free_port, run_xlarun, worker

pytestmark = pytest.mark.torch_xla


def xlarun_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("xlarun:")]


@pytest.mark.parametrize(
    "device_flags, env",
    [([], {}), (["--device", "cpu"], {}), ([], {"PJRT_DEVICE": "CPU"})],
    ids=["detected", "given", "from PJRT_DEVICE"],
)
def test_torch_xla_join_of_two_cpu_processes_is_explained(device_flags: list[str], env: dict[str, str]) -> None:
    result = run_xlarun(
        "--nproc-per-node", "2", "--master-port", free_port(), *device_flags, worker("xla_torch_join.py"), env=env
    )
    assert result.returncode != 0
    lines = xlarun_lines(result.stderr)
    warnings = [line for line in lines if line.startswith("xlarun: warning:")]
    if device_flags or env:
        [warning] = warnings
        assert "2 CPU processes an XLA world of its own" in warning
        assert "--spmd --virtual-devices N" in warning and "gloo" in warning
        assert result.stderr.index(warning) < result.stderr.index("Root Cause")
    else:
        assert warnings == []
    assert "EADDRINUSE" in result.stderr  # the worker's own traceback, quoted by the report
    [cause] = [line for line in lines if "took itself for rank 0" in line]
    assert result.stderr.index(cause) > result.stderr.index("Root Cause")
    assert "world of its own" in cause
    assert not [line for line in lines if "EADDRINUSE" in line or "in use" in line], lines


@pytest.mark.parametrize("device_flags", [[], ["--device", "cpu"]], ids=["detected", "given"])
def test_split_world_is_named_whichever_worker_failed_first(tmp_path: Path, device_flags: list[str]) -> None:
    # torch_xla's own torchrun test has this shape: each test joins in setUp. The process that
    # serves the store fails the world's checks first; the other fails to bind the port.
    result = run_xlarun(
        "--nproc-per-node", "2", "--master-port", free_port(), *device_flags, worker("xla_join_unittest.py"), tmp_path
    )
    assert result.returncode == 1
    root_cause = result.stderr[result.stderr.index("Root Cause") :]
    assert "AssertionError" in root_cause and "EADDRINUSE" not in root_cause  # the process serving the store
    assert "EADDRINUSE" in result.stderr  # what the worker that could not serve the store wrote
    [cause] = [line for line in xlarun_lines(result.stderr) if "took itself for rank 0" in line]
    assert result.stderr.index(cause) > result.stderr.index("Root Cause")


def test_one_cpu_process_gets_no_split_world_line(tmp_path: Path) -> None:
    result = run_xlarun(
        "--nproc-per-node", "1", "--master-port", free_port(), worker("dump_env.py"), env={"DUMP_DIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    assert not [line for line in xlarun_lines(result.stderr) if "world of its own" in line]


def test_each_cpu_worker_sees_consistent_ordinals_and_saves_as_master(tmp_path: Path) -> None:
    result = run_xlarun("--nproc-per-node", "2", "--master-port", free_port(), worker("xla_ordinals.py"), tmp_path)
    assert result.returncode == 0, result.stderr
    import torch

    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert seen == {
            "global_ordinal": 0,
            "world_size": 1,
            "local_ordinal": 0,
            "local_device_count": 1,
            "local_process_count": 1,
            "is_master": True,
            "is_local_master": True,
        }
        assert torch.load(tmp_path / f"{rank}.pt").tolist() == [0.0, 1.0, 2.0, 3.0]


def test_workers_serving_their_own_store_on_a_moved_port_run() -> None:
    result = run_xlarun("--nproc-per-node", "2", "--master-port", free_port(), worker("own_store.py"), free_port())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines().count("sum 1") == 2


SPMD_SCRIPT = """
import json
import torch_xla.runtime as xr
import xlarun
{switch}
xlarun.init_process_group()
import torch.distributed as dist
print(json.dumps({{"spmd": xr.is_spmd(), "backend": dist.get_backend(), "world": dist.get_world_size(),
                  "devices": xr.global_runtime_device_count()}}), flush=True)
"""


@pytest.mark.parametrize("switch", ["", "xr.use_spmd()"], ids=["by-xlarun", "by-the-program"])
def test_spmd_is_switched_on_without_the_deprecated_variable(tmp_path: Path, switch: str) -> None:
    script = tmp_path / "spmd.py"
    script.write_text(SPMD_SCRIPT.format(switch=switch))
    result = run_xlarun("--spmd", "--device", "cpu", "--virtual-devices", "2", "--master-port", free_port(), script)
    assert result.returncode == 0, result.stderr
    assert "XLA_USE_SPMD is being deprecated" not in result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"spmd": True, "backend": "gloo", "world": 1, "devices": 2}
