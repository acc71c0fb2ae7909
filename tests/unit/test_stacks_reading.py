"""What ``xlarun --stacks`` takes for a launch's worker: a dump path where xlarun puts it, a process of one user."""

from __future__ import annotations

import os
from pathlib import Path

from xlarun.contract import ERROR_FILE_VARIABLE, STACKS_VARIABLE
from xlarun.host.procfs import process_owner
from xlarun.supervision.stacks import _dump_path

RUN = "/tmp/logs/none_k2j4x9qa"


def worker_environ(stacks: str, error_file: str = f"{RUN}/attempt_0/1/error.json") -> dict[str, str]:
    return {STACKS_VARIABLE: f"40:{stacks}", ERROR_FILE_VARIABLE: error_file}


def test_a_dump_path_where_xlarun_puts_it_is_taken() -> None:
    assert _dump_path(worker_environ(f"{RUN}/attempt_0/1/stacks.txt")) == f"{RUN}/attempt_0/1/stacks.txt"


def test_a_dump_path_elsewhere_is_not() -> None:
    for stacks in (
        f"{RUN}/attempt_0/1/../../../../etc/shadow",
        "/etc/shadow",
        f"{RUN}/attempt_0/1/secret.txt",
        f"{RUN}/attempt_0/0/stacks.txt",
        "attempt_0/1/stacks.txt",
    ):
        assert _dump_path(worker_environ(stacks)) is None, stacks
    for error_file in (f"{RUN}/other/1/error.json", f"{RUN}/attempt_0/x/error.json"):
        stacks = os.path.join(os.path.dirname(error_file), "stacks.txt")
        assert _dump_path(worker_environ(stacks, error_file)) is None, stacks


def test_a_dump_path_beside_no_error_file_is_not() -> None:
    assert _dump_path(worker_environ(f"{RUN}/attempt_0/1/stacks.txt", error_file="")) is None


def test_a_process_runs_as_its_user_where_its_ids_agree(tmp_path: Path) -> None:
    assert process_owner(os.getpid()) == os.geteuid()
    status = tmp_path / "7" / "status"
    status.parent.mkdir()
    status.write_text("Name:\tx\nUid:\t65534\t0\t0\t0\n")
    assert process_owner(7, proc=str(tmp_path)) is None
    status.write_text("Name:\tx\nUid:\t65534\t65534\t65534\t65534\n")
    assert process_owner(7, proc=str(tmp_path)) == 65534
    assert process_owner(8, proc=str(tmp_path)) is None
