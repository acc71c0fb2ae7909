"""Every host is checked before anything starts: a missing working directory, a missing script or a busy
device on one host is one line naming that host, exit 1, and no worker on any host.

The hosts are local: an ``--rsh`` shim runs each host's agent here with ``sh -c``, giving each its
own fake device tree (``XLARUN_HOST_ROOT``: CPU VMs, h2 a TPU VM for the busy device), so "h2's TPU"
is a file only h2's agent looks at.
A worker that starts leaves a file named after its rank; none may be there.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import TESTS, hold_open, run_xlarun

HOSTS = TESTS / "fixtures" / "hosts"
WORKER = "import os, sys\nopen(os.path.join(sys.argv[1], 'started-' + os.environ['RANK']), 'w').close()\n"


def shim(roots: Path) -> str:
    """An ``--rsh`` template that runs the agent here, with the host's own device tree."""
    return f"env XLARUN_HOST_ROOT={roots}/{{host}} sh -c {{command}}"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text(WORKER)
    (tmp_path / "out").mkdir()
    for host in ("h1", "h2"):
        shutil.copytree(HOSTS / "gce-cpu-vm", tmp_path / "roots" / host)
    return tmp_path


def run_job(
    job: Path, *flags: object, script: str = "train.py", env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    result = run_xlarun(
        "--hosts",
        "h1,h2",
        "--rsh",
        shim(job / "roots"),
        "--master-addr",
        "127.0.0.1",
        "--nproc-per-node",
        "1",
        *flags,
        script,
        job / "out",
        cwd=job / "work",
        timeout=120,
        env=env,
    )
    return result.returncode, result.stderr.splitlines()


def started(job: Path) -> list[str]:
    return sorted(path.name for path in (job / "out").iterdir())


def test_the_shim_runs_a_job_whose_hosts_pass(job: Path) -> None:
    # The same job, nothing wrong: both workers start (the refusals below are the checks', not the shim's).
    code, lines = run_job(job)
    assert code == 0, lines
    assert started(job) == ["started-0", "started-1"]


def test_a_missing_working_directory_is_one_line_per_host(job: Path) -> None:
    code, lines = run_job(job, "--remote-cwd", job / "gone")
    assert code == 1
    assert sorted(line for line in lines if line.startswith("xlarun: host ")) == [
        f"xlarun: host {host}: working directory {job / 'gone'} not found: pass --remote-cwd DIR, a directory every "
        "host has"
        for host in ("h1", "h2")
    ], lines
    assert started(job) == []


def test_a_missing_script_is_one_line_per_host(job: Path) -> None:
    code, lines = run_job(job, script="missing.py")
    assert code == 1
    assert sorted(line for line in lines if line.startswith("xlarun: host ")) == [
        f"xlarun: host h1: training script not found: missing.py in {job / 'work'}",
        f"xlarun: host h2: training script not found: missing.py in {job / 'work'}",
    ], lines
    assert started(job) == []


def test_a_detached_job_returns_once_its_hosts_passed_their_checks_and_fails_as_the_foreground_where_not(
    job: Path,
) -> None:
    """``--detach`` of a job on several hosts checks every host before it returns, as the foreground does."""
    state = {"XLARUN_STATE_DIR": str(job / "state")}
    code, lines = run_job(job, "--detach", script="missing.py", env=state)
    assert code == 1
    assert sorted(line for line in lines if line.startswith("xlarun: host ")) == [
        f"xlarun: host h1: training script not found: missing.py in {job / 'work'}",
        f"xlarun: host h2: training script not found: missing.py in {job / 'work'}",
    ], lines
    assert started(job) == []
    result = run_xlarun(
        "--detach",
        "--hosts",
        "h1,h2",
        "--rsh",
        shim(job / "roots"),
        "--master-addr",
        "127.0.0.1",
        "--nproc-per-node",
        "1",
        "train.py",
        job / "out",
        cwd=job / "work",
        env=state,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    waited = run_xlarun("--wait", result.stdout.strip(), env=state, timeout=120)
    assert waited.returncode == 0, waited.stderr
    assert started(job) == ["started-0", "started-1"]


@pytest.fixture
def h2_device_held(job: Path) -> Iterator[int]:
    """h2 a TPU VM, a process holding its device file open (as its standard input) as a left-behind worker would."""
    root = job / "roots" / "h2"
    shutil.rmtree(root)
    shutil.copytree(HOSTS / "tpu-v4-vm", root)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "accel0").touch()
    holder = hold_open(root / "dev" / "accel0", 300)
    yield holder.pid
    holder.kill()
    holder.wait()


def test_a_busy_device_on_one_host_starts_no_worker_anywhere(job: Path, h2_device_held: int) -> None:
    code, lines = run_job(job)
    assert code == 1
    refusals = [line for line in lines if line.startswith("xlarun: host ")]
    assert len(refusals) == 1, lines
    device = (job / "roots" / "h2" / "dev" / "accel0").resolve()
    assert refusals[0].startswith(f"xlarun: host h2: pid {h2_device_held} holds {device} (running "), refusals
    assert refusals[0].endswith(
        "the tpu device is in use by 1 other process, so nothing was started: stop it, "
        "or pass --allow-busy-device where sharing the device is intended"
    )
    assert started(job) == []
