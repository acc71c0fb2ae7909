"""``--run-path``: the script runs as ``__main__`` through ``runpy`` and ends the way torchrun's does.

torchrun runs it in a multiprocessing child that waits until every local worker has returned,
so a script that never destroys its gloo group still ends cleanly. In a fresh interpreter
that ending raced gloo's threads and aborted about one run in three (exit 134, "terminate
called without an active exception"); xlarun's bootstrap destroys the group once the script
has ended well.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import free_port, run_xlarun, worker

RUNS = 3
"""Runs of the abort-prone script; each had a one-in-three chance to abort before."""


@pytest.mark.parametrize("init_method", ["env://", "tcp"])
def test_gloo_workers_that_never_destroy_the_group_end_cleanly(init_method: str) -> None:
    for _ in range(RUNS):
        port = free_port()
        method = init_method if init_method == "env://" else f"tcp://localhost:{free_port()}"
        result = run_xlarun(
            "--run-path",
            "--nnodes=1",
            "--nproc-per-node=4",
            "--master-addr=localhost",
            f"--master-port={port}",
            worker("gloo_no_destroy.py"),
            f"--init-method={method}",
        )
        assert result.returncode == 0, result.stderr
        assert "terminate called" not in result.stderr
        done = sorted(line for line in result.stdout.splitlines() if line.endswith(" done"))
        assert done == [f"rank {rank} of 4 done" for rank in range(4)]


@pytest.mark.parametrize(
    "body, code, text",
    [
        ("import sys\nsys.exit(3)\n", 3, ""),
        ("raise RuntimeError('boom')\n", 1, "RuntimeError: boom"),
        ("import sys\nsys.exit('bye')\n", 1, "bye"),
    ],
)
def test_the_scripts_own_ending_decides_the_exit_code(tmp_path: Path, body: str, code: int, text: str) -> None:
    script = tmp_path / "ends.py"
    script.write_text(body)
    result = run_xlarun("--run-path", "--master-port", free_port(), script)
    assert result.returncode == code, result.stderr
    assert text in result.stderr
