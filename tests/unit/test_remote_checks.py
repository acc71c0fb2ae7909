"""What a host checks before it reports ready (xlarun.remote.checks): one line naming the first cause, or None."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import TESTS, hold_open

from xlarun import __version__
from xlarun.config import WorkerCommand
from xlarun.host.programs import module_problem, program_problem
from xlarun.remote.checks import check_host, host_command
from xlarun.remote.plan import HostPlan
from xlarun.structs import replace

HOSTS = TESTS / "fixtures" / "hosts"


def plan(cwd: Path, *command: str, **fields: object) -> HostPlan:
    base = HostPlan(
        host="h1",
        index=0,
        node_rank=0,
        nnodes=2,
        run_id="r",
        cwd=str(cwd),
        version=__version__,
        argv=("--nproc-per-node=1", "--", *command),
        device="cpu",
    )
    return replace(base, **fields)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_a_host_with_everything_is_ready(workdir: Path) -> None:
    assert check_host(plan(workdir, "train.py", "--lr", "1"), environ={}) is None


def test_another_xlarun_release_is_named_first(workdir: Path) -> None:
    line = check_host(plan(workdir, "missing.py", version="0.0.1"), environ={})
    assert line is not None and "\n" not in line
    assert line.startswith(f"xlarun {__version__} is installed here, the launcher runs 0.0.1")
    assert "--remote-python" in line


def test_a_missing_working_directory(tmp_path: Path) -> None:
    line = check_host(plan(tmp_path / "gone", "train.py"), environ={})
    assert line == f"working directory {tmp_path / 'gone'} not found: pass --remote-cwd DIR, a directory every host has"


def test_a_missing_script_is_looked_for_in_the_working_directory(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))  # the agent's own directory does not count
    assert check_host(plan(workdir, "train.py"), environ={}) is None
    assert check_host(plan(workdir, "other.py"), environ={}) == f"training script not found: other.py in {workdir}"
    absolute = workdir / "nope.py"
    assert check_host(plan(workdir, str(absolute)), environ={}) == f"training script not found: {absolute}"


def test_a_program_is_looked_for_on_the_hosts_path(workdir: Path) -> None:
    assert check_host(plan(workdir, "sh", "-c", "true", program="program"), environ={}) is None
    line = check_host(plan(workdir, "no-such-program-here", program="program"), environ={})
    assert line == (
        "command not found: no-such-program-here (--no-python runs it directly; give a path or a program on PATH)"
    )
    (workdir / "run.sh").write_text("#!/bin/sh\n")
    assert check_host(plan(workdir, "./run.sh", program="program"), environ={}).startswith(  # type: ignore[union-attr]
        "./run.sh is not executable (--no-python runs it directly)"
    )


def test_a_module_is_found_in_the_working_directory_the_pythonpath_or_the_interpreter(
    workdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (workdir / "mypkg").mkdir()
    (workdir / "mypkg" / "__init__.py").write_text("raise SystemExit('imported: the check must not run it')\n")
    assert check_host(plan(workdir, "mypkg.train", program="module"), environ={}) is None
    assert check_host(plan(workdir, "json.tool", program="module"), environ={}) is None
    assert check_host(plan(workdir, "xlarun", program="module"), environ={}) is None
    assert (
        check_host(plan(workdir, "nopkg.train", program="module"), environ={})
        == "module not found: nopkg.train (--module runs it with python -m)"
    )
    extra = tmp_path_factory.mktemp("path")
    (extra / "nopkg.py").write_text("")
    assert check_host(plan(workdir, "nopkg", program="module", env={"PYTHONPATH": str(extra)}), environ={}) is None
    assert check_host(plan(workdir, "nopkg", program="module"), environ={"PYTHONPATH": str(extra)}) is None


def test_the_command_is_what_follows_the_first_separator(workdir: Path) -> None:
    command = host_command(plan(workdir, "train.py", "--", "x", program="script"))
    assert command == WorkerCommand(script="train.py", args=("--", "x"))
    assert (
        check_host(replace(plan(workdir, "train.py"), argv=("--nproc-per-node=1",)), environ={})
        == "the plan names no command after '--'"
    )


@pytest.fixture
def busy_tpu(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The TPU v4 fixture host, its device file held open (as standard input) by a process of this test."""
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "tpu-v4-vm", root)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "accel0").touch()
    holder = hold_open(root / "dev" / "accel0", 60)
    try:
        yield root, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_busy_device_is_one_line_naming_the_holder(workdir: Path, busy_tpu: tuple[Path, int]) -> None:
    root, pid = busy_tpu
    environ = {"XLARUN_HOST_ROOT": str(root)}
    line = check_host(plan(workdir, "train.py", device="tpu"), environ=environ)
    assert line is not None and "\n" not in line
    assert line.startswith(f"pid {pid} holds {root.resolve() / 'dev' / 'accel0'} (running ")
    assert (
        f"sleep 60; stop it with: kill {pid}; the tpu device is in use by 1 other process, so nothing was started"
        in line
    )
    assert line.endswith("pass --allow-busy-device where sharing the device is intended")
    # The plan's variables count as the host's: the device root may come with the plan.
    assert check_host(plan(workdir, "train.py", device="tpu", env=environ), environ={}) == line
    assert check_host(plan(workdir, "train.py", device="tpu", allow_busy_device=True), environ=environ) is None
    # auto resolves on the host: a host whose files say TPU looks at the TPU's files.
    assert check_host(plan(workdir, "train.py", device="auto"), environ=environ) is not None
    assert check_host(plan(workdir, "train.py", device="cpu"), environ=environ) is None


def test_a_device_the_host_cannot_name_is_one_line(workdir: Path) -> None:
    line = check_host(plan(workdir, "train.py", device="auto"), environ={"PJRT_DEVICE": "QPU"})
    assert line is not None and line.startswith("PJRT_DEVICE=QPU is not a device xlarun knows")


def test_the_launchers_own_check_is_the_same_function(workdir: Path) -> None:
    # One fact in one place: the launcher's refusal and the host's come from xlarun.host.programs.
    command = WorkerCommand(script="missing.py", args=())
    assert program_problem(command, str(workdir)) == "training script not found: missing.py"
    assert module_problem("json", str(workdir), {}) is None
