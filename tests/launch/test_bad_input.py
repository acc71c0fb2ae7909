"""Bad input launched for real: exit 2, one line on stderr saying what is wrong, nothing started.

The wording of every refusal is checked in-process in ``tests/unit/test_options.py``; here a few
launches per stage show the whole path, plus the checks that need a real host (a missing
script, a taken port, a log directory that is a file). Each launch names ``marker.py`` as the worker: the marker file it would create must not
exist afterwards.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers import launcher_frames, run_xlarun, worker

# A few of the refusals ``tests/unit/test_options.py`` checks in-process, one per stage that can refuse:
# the parser, an option's own value, a variable standing in for a flag, a rule between flags,
# the device plan. (launcher flags before the script, variables, text the error line must hold)
SMOKE_LAUNCHES = {
    "unknown option": (["--nproc_per_node", "1", "--turbo"], {}, "--turbo"),
    "bad value": (["--nnodes", "1:2:3"], {}, "--nnodes='1:2:3'"),
    "bad PET value": ([], {"PET_NPROC_PER_NODE": "lots"}, "PET_NPROC_PER_NODE"),
    "flags that exclude each other": (["-m", "--no-python"], {}, "'--no-python' flag and the '--module' flag"),
    # A dry run: the plan is refused so whether torch_xla is installed or not.
    "plan the device cannot run": (["--dry-run", "--spmd", "--nproc_per_node", "2"], {}, "cannot run under SPMD"),
}


def assert_refused(result, marker: Path, expected: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("xlarun: error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr and not launcher_frames(result.stderr)
    assert result.stdout == ""
    assert not marker.exists(), "a worker ran"


@pytest.mark.parametrize("case", sorted(SMOKE_LAUNCHES))
def test_bad_input_is_refused_with_one_line(tmp_path: Path, case: str) -> None:
    flags, env, expected = SMOKE_LAUNCHES[case]
    marker = tmp_path / "marker"
    result = run_xlarun(*flags, worker("marker.py"), marker, env=env, cwd=tmp_path)
    assert_refused(result, marker, expected)


def test_script_that_does_not_exist(tmp_path: Path) -> None:
    result = run_xlarun("--nproc_per_node", "2", "--master_port", "0", "no_such_script.py", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "no_such_script.py")


def test_no_python_command_that_does_not_exist(tmp_path: Path) -> None:
    result = run_xlarun("--no-python", "--master_port", "0", "no-such-command-anywhere", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "no-such-command-anywhere")


def test_no_python_file_without_its_execute_bit_is_named_so(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    result = run_xlarun("--no-python", "--master_port", "0", script, cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", f"{script} is not executable")


def test_log_dir_that_is_a_file(tmp_path: Path) -> None:
    log_file = tmp_path / "logs"
    log_file.write_text("")
    marker = tmp_path / "marker"
    result = run_xlarun("--log-dir", log_file, "--master_port", "0", worker("marker.py"), marker)
    assert_refused(result, marker, "--log-dir")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_taken_master_port_names_the_port_and_the_ways_out(tmp_path: Path, host: str) -> None:
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = tmp_path / "marker"
        result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("marker.py"), marker)
    assert_refused(result, marker, str(port))
    assert "--master-port" in result.stderr and "--standalone" in result.stderr
