"""--cluster against real programs: Open MPI's mpirun on this host, and an import that must not load torch.

The recorded environments of every cluster are read in-process in ``tests/unit/test_cluster.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO


def test_mpi_reads_a_real_mpirun_environment():
    if shutil.which("mpirun") is None:
        # scripts/test.sh installs Open MPI where it can; under CI a missing mpirun is a failure.
        (pytest.fail if os.environ.get("CI") else pytest.skip)("Open MPI's mpirun is not installed")
    # One host can hold several ranks but not several nodes: a lone rank is a one-node job, and two
    # ranks on this host must be refused. Each rank prints what detect_cluster made of its environment.
    probe = (
        "import os, sys; from xlarun.planning.cluster import detect_cluster; from xlarun.exceptions import UsageError\n"
        "try:\n    s = detect_cluster('mpi', os.environ); print(s.nnodes, s.node_rank, s.run_id)\n"
        "except UsageError as e:\n    print('refused:', e)\n"
    )
    environ = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(REPO))

    def mpirun(ranks: int) -> list[str]:
        done = subprocess.run(
            ["mpirun", "--oversubscribe", "-np", str(ranks), sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env=environ,
            timeout=120,
            check=True,
        )
        return done.stdout.splitlines()

    [alone] = mpirun(1)
    nnodes, node_rank, run_id = alone.split()
    assert (nnodes, node_rank) == ("1", "0") and run_id.isdigit()
    pair = mpirun(2)
    assert len(pair) == 2 and all("mpirun started 2 xlarun processes on this node" in line for line in pair)


def test_cluster_module_does_not_import_torch():
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, xlarun.planning.cluster; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert imported.stdout.strip() == "False"
