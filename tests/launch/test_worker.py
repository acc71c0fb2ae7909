"""Worker side: joining the process group under torch_xla 2.9 on CPU, and catching a split world.

Workers are real processes started with the environment torchrun and xlarun give
them (``direct.run_workers``), as the other worker-side test modules start theirs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from direct import json_report, run_workers
from helpers import REPO


def test_importing_the_worker_module_leaves_torch_unimported():
    check = "import sys, xlarun.worker; sys.exit('torch' in sys.modules or 'torch_xla' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.torch_xla
@pytest.mark.parametrize("init", ["torch", "xlarun"])
def test_one_process_joins_a_world_of_one_and_all_reduces(init):
    [result] = run_workers(["examples/xla_allreduce.py", "--init", init], nproc=1)
    assert result.returncode == 0, result.stderr
    assert json_report(result) == {"rank": 0, "world_size": 1, "sum": 1.0}


@pytest.mark.torch_xla
def test_two_cpu_processes_are_refused_with_the_cause():
    results = run_workers(["examples/xla_allreduce.py"], nproc=2)
    for result in results:
        assert result.returncode != 0, result.stdout
        assert (
            "SplitWorldError: PJRT's CPU client has no cross-process collectives: "
            "each of the 2 processes would train alone as rank 0 of 1" in result.stderr
        )
        assert '"sum"' not in result.stdout


GLOO_ALL_REDUCE = """
import json, torch, torch.distributed as dist
from xlarun.worker import init_process_group
init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": total.item()}))
dist.destroy_process_group()
"""


@pytest.mark.torch_xla  # the join goes through xlarun.init_process_group's torch_xla checks
def test_the_gloo_backend_the_error_suggests_joins_two_cpu_processes():
    results = run_workers(["-c", GLOO_ALL_REDUCE], nproc=2)
    reports = sorted((json_report(result) for result in results), key=lambda report: report["rank"])
    assert reports == [{"rank": 0, "world_size": 2, "sum": 3.0}, {"rank": 1, "world_size": 2, "sum": 3.0}]
