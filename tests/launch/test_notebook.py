"""``xlarun.launch()`` in a real Jupyter kernel (tests/notebook.py): functions defined in cells come
back with every rank's value, a worker's exception reaches the cell, the workers' output shows in
it, and neither an interrupt nor a restart of the kernel leaves a worker behind."""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_for
from notebook import Cell, Kernel, jupyter_kernel, run_notebook

IMPORTS = "import os, sys, time\nimport xlarun"
RANK = 'def rank():\n    return int(os.environ["RANK"])'
LAUNCH_RANK = 'xlarun.launch(rank, nproc_per_node=4, device="cpu").values'
GONE_WITHIN_S = 2.0
"""How soon after an interrupt every worker must be gone."""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    with jupyter_kernel(tmp_path) as started:
        assert started.run(IMPORTS).error is None
        yield started


def sleeper(ready_dir: Path) -> str:
    """A cell's function that marks its rank ready, then sleeps far past any test."""
    return (
        f"def sleep_long():\n"
        f"    open(os.path.join({str(ready_dir)!r}, os.environ['RANK']), 'w').close()\n"
        f"    time.sleep(300)"
    )


def start_sleepers(kernel: Kernel, ready_dir: Path) -> Cell:
    assert kernel.run(sleeper(ready_dir)).error is None
    cell = kernel.execute('xlarun.launch(sleep_long, nproc_per_node=4, device="cpu")')
    wait_for(lambda: len(list(ready_dir.iterdir())) == 4, "every worker asleep")
    assert len(kernel.workers()) == 4
    return cell


def test_cell_defined_functions_return_every_ranks_value(kernel: Kernel) -> None:
    """A def, a lambda and a closure from a notebook's cells each come back as [rank 0, ..., rank 3];
    the kernel's environment is as before and it has not imported torch."""
    cells = run_notebook(
        kernel,
        [
            "environment_before = dict(os.environ)",
            f"{RANK}\n{LAUNCH_RANK}",
            'xlarun.launch(lambda: int(os.environ["RANK"]), nproc_per_node=4, device="cpu").values',
            'def offset_by(n):\n    def ranked():\n        return int(os.environ["RANK"]) + n\n    return ranked\n'
            'xlarun.launch(offset_by(10), nproc_per_node=4, device="cpu").values',
            'dict(os.environ) == environment_before, "torch" in sys.modules',
        ],
    )
    shown = [
        next(output["data"]["text/plain"] for output in cell.outputs if output["output_type"] == "execute_result")
        for cell in cells[1:]
    ]
    assert shown == ["[0, 1, 2, 3]", "[0, 1, 2, 3]", "[10, 11, 12, 13]", "(True, False)"]


def test_a_ranks_exception_reaches_the_cell(kernel: Kernel) -> None:
    failing = (
        "def fail_on_two():\n"
        '    if os.environ["RANK"] == "2":\n'
        '        raise ValueError("bad")\n'
        "    return 0\n"
        "try:\n"
        '    xlarun.launch(fail_on_two, nproc_per_node=4, device="cpu")\n'
        "except xlarun.WorkerFailed as failed:\n"
        "    error = failed\n"
        "(error.root_cause.rank, isinstance(error.__cause__, ValueError), str(error.__cause__),\n"
        " error.root_cause.traceback)"
    )
    rank, is_value_error, message, traceback = ast.literal_eval(kernel.value(failing))
    assert (rank, is_value_error, message) == (2, True, "bad")
    assert "ValueError: bad" in traceback
    assert "line 3, in fail_on_two" in traceback
    # The line itself, as a script's traceback shows it: the cell's source is the kernel's alone.
    assert 'raise ValueError("bad")' in traceback

    reraised = kernel.run('xlarun.launch(fail_on_two, nproc_per_node=4, device="cpu", reraise=True)')
    assert reraised.error is not None
    assert (reraised.error["ename"], reraised.error["evalue"]) == ("ValueError", "bad")


def test_the_workers_output_shows_in_the_cell(kernel: Kernel) -> None:
    """As on the command line: each worker's lines as they are, and with tee=3 prefixed
    [role local_rank]:."""
    # One write a line: unbuffered workers' print() writes its pieces apart, which interleave on a
    # terminal as in a cell.
    greet = "def greet():\n    sys.stdout.write(f\"hello from {os.environ['RANK']}\\n\")\n    sys.stdout.flush()"
    assert kernel.run(greet).error is None
    plain = kernel.run('xlarun.launch(greet, nproc_per_node=4, device="cpu").exit_code')
    assert plain.error is None, plain.error_text
    assert sorted(line for line in plain.stdout.splitlines() if "hello from" in line) == [
        f"hello from {rank}" for rank in range(4)
    ]

    teed = kernel.run('xlarun.launch(greet, nproc_per_node=4, device="cpu", tee=3).exit_code')
    assert teed.error is None, teed.error_text
    assert sorted(line for line in teed.stdout.splitlines() if "hello from" in line) == [
        f"[default{rank}]:hello from {rank}" for rank in range(4)
    ]


def test_an_interrupt_leaves_no_worker_and_the_next_launch_works(kernel: Kernel, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    cell = start_sleepers(kernel, ready)
    kernel.interrupt()
    interrupted = time.monotonic()
    while kernel.workers() and time.monotonic() - interrupted < GONE_WITHIN_S:
        time.sleep(0.05)
    assert kernel.workers() == [], f"workers alive {GONE_WITHIN_S} s after the interrupt"
    kernel.wait(cell)
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell.error_text

    assert kernel.run(RANK).error is None
    assert kernel.value(LAUNCH_RANK) == "[0, 1, 2, 3]"


def test_a_kernel_restart_leaves_no_worker(kernel: Kernel, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    start_sleepers(kernel, ready)
    kernel.restart()
    wait_for(lambda: not kernel.workers(), "every worker gone after the kernel's restart")

    assert kernel.run(f"{IMPORTS}\n{RANK}").error is None
    assert kernel.value(LAUNCH_RANK) == "[0, 1, 2, 3]"
