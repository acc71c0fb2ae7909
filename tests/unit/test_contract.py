"""The launcher↔worker contract (:mod:`xlarun.contract`) and the worker-side files that cannot import it.

The stack-dump hook and the ``--run-path`` bootstrap run in the worker's Python, which may be
another than the launcher's, so they import nothing of xlarun: they must still spell the contract
as the launcher does, and run the script as ``python -c`` would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from xlarun.config import WorkerCommand
from xlarun.contract import HOOK_DIRECTORY, RUN_PATH_BOOTSTRAP, STACKS_DESCRIPTOR, STACKS_VARIABLE, hook_variables


def test_the_hook_reads_the_variable_and_holds_the_descriptor_the_launcher_checks() -> None:
    spec = importlib.util.spec_from_file_location("hook", os.path.join(HOOK_DIRECTORY, "sitecustomize.py"))
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # under another name than sitecustomize it arms nothing
    assert hook._VARIABLE == STACKS_VARIABLE
    assert hook._DESCRIPTOR == STACKS_DESCRIPTOR


def test_the_hook_adds_its_directory_and_no_empty_entry() -> None:
    """An empty PYTHONPATH is an unset one; the user's own empty entries are theirs."""
    for inherited, expected in (
        ({}, HOOK_DIRECTORY),
        ({"PYTHONPATH": ""}, HOOK_DIRECTORY),
        ({"PYTHONPATH": "a::b:"}, f"{HOOK_DIRECTORY}{os.pathsep}a::b:"),
    ):
        assert hook_variables("stacks.txt", inherited)["PYTHONPATH"] == expected


def test_a_run_path_worker_runs_the_bootstrap_file_before_the_script() -> None:
    command = WorkerCommand("train.py", ("--lr", "${local_rank}"), run_path=True, python="python3")
    assert command.argv(1) == ["python3", "-u", RUN_PATH_BOOTSTRAP, "train.py", "--lr", "1"]


def test_the_bootstrap_gives_the_script_the_path_and_arguments_of_python_c(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import json, sys\nprint(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__}))\n"
    )
    seen = []
    for argv in (
        [sys.executable, "-u", RUN_PATH_BOOTSTRAP, str(script), "a", "b"],
        [
            sys.executable,
            "-u",
            "-c",
            "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            str(script),
            "a",
            "b",
        ],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path)
        seen.append(json.loads(result.stdout))
    assert seen[0] == seen[1] == {"argv": [str(script), "a", "b"], "path0": "", "name": "__main__"}
