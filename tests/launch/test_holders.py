"""The busy-device preflight: device files on fake hosts, real processes holding them open.

A fake host's device files are ordinary files under ``XLARUN_HOST_ROOT``; a real process that
opens one shows its path in its real ``/proc/<pid>/fd``, which is what the scan reads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from helpers import TESTS, kill_all, launcher_frames, run_xlarun, worker

from xlarun.flags import flag
from xlarun.host.holders import describe_holder, device_files, find_holders

HOSTS_DIR = TESTS / "fixtures" / "hosts"

HOLD = """
import os, sys, time
handle = open(sys.argv[1])
if len(sys.argv) > 2:
    with open("/proc/self/comm", "w") as name:
        name.write(sys.argv[2])
print("holding", flush=True)
time.sleep(600)
"""


class Holders:
    """Starts processes that hold a file open; each is killed at the end of the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def hold(self, path: Path, *, run_id: str | None = None, name: str | None = None, new_session: bool = False) -> int:
        env = {key: value for key, value in os.environ.items() if key != "TORCHELASTIC_RUN_ID"}
        if run_id is not None:
            env["TORCHELASTIC_RUN_ID"] = run_id
        process = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path), *([name] if name else [])],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=new_session,
        )
        self.started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "holding\n"
        return process.pid


@pytest.fixture
def holders() -> Iterator[Holders]:
    started = Holders()
    yield started
    kill_all([process.pid for process in started.started])
    for process in started.started:
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def tpu_host(tmp_path: Path) -> Path:
    """The TPU v4 fixture host with two chips' device files."""
    root = tmp_path / "host"
    shutil.copytree(HOSTS_DIR / "tpu-v4-vm", root)
    (root / "dev").mkdir(exist_ok=True)
    for name in ("accel0", "accel1"):
        (root / "dev" / name).touch()
    return root


def make_files(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


# --- unit: which files, which processes (processes that hold files, no launcher) ------------------------------------------------------------------


def test_find_holders_names_the_process_and_an_earlier_launch(tmp_path: Path, holders: Holders) -> None:
    make_files(tmp_path, "dev/accel0", "dev/accel1", "other")
    files = device_files("tpu", str(tmp_path))
    worker_pid = holders.hold(tmp_path / "dev" / "accel0", run_id="old-run", new_session=True)
    plain_pid = holders.hold(tmp_path / "dev" / "accel1")
    holders.hold(tmp_path / "other")

    found = {holder.pid: holder for holder in find_holders(files)}
    assert sorted(found) == sorted([worker_pid, plain_pid])
    earlier, plain = found[worker_pid], found[plain_pid]
    assert earlier.devices == (str(tmp_path.resolve() / "dev" / "accel0"),)
    assert earlier.run_id == "old-run" and plain.run_id is None
    assert earlier.command.startswith(f"{sys.executable} -c import os, sys, time handle = open(sys.argv[1])")
    assert 0 <= earlier.age_seconds < 60
    # A launched worker leads its own group, with its children: the group goes. Anything else: the process.
    assert earlier.stop_command == f"kill -- -{worker_pid}"
    assert plain.stop_command == f"kill {plain_pid}"
    line = describe_holder(earlier)
    assert line.startswith(f"pid {worker_pid} holds {earlier.devices[0]} (running ")
    assert "a worker of an earlier launch (TORCHELASTIC_RUN_ID=old-run)" in line
    assert line.endswith(f"stop it with: kill -- -{worker_pid}")


def test_find_holders_skips_the_excluded_and_the_daemons_that_hold_gpus_by_design(
    tmp_path: Path, holders: Holders
) -> None:
    make_files(tmp_path, "dev/nvidia0")
    files = device_files("cuda", str(tmp_path))
    holders.hold(tmp_path / "dev" / "nvidia0", name="nvidia-persistenced")
    with open(tmp_path / "dev" / "nvidia0"):
        assert find_holders(files, exclude=[os.getpid()]) == []
        assert [holder.pid for holder in find_holders(files)] == [os.getpid()]


def tpu_env(root: Path) -> Mapping[str, str]:
    # TPU_LIBRARY_PATH stands in for libtpu, which a CPU machine lacks; no worker here loads it. It names
    # a file, as TorchTPU (the runtime where torch_tpu is installed without torch_xla) needs.
    (root / "libtpu.so").touch()
    return {"XLARUN_HOST_ROOT": str(root), "TPU_LIBRARY_PATH": str(root / "libtpu.so")}


def test_a_held_device_refuses_the_launch_naming_the_holder(
    tpu_host: Path, holders: Holders, tmp_path: Path, port: int
) -> None:
    holder = holders.hold(tpu_host / "dev" / "accel0", run_id="earlier", new_session=True)
    marker = tmp_path / "ran"
    result = run_xlarun(
        "--device",
        "tpu",
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        worker("marker.py"),
        marker,
        env=tpu_env(tpu_host),
    )
    assert result.returncode == 1, result.stderr
    *held, last = result.stderr.splitlines()
    assert [line for line in held if line.startswith(f"xlarun: pid {holder} holds ")] == held != []
    assert f"{tpu_host.resolve()}/dev/accel0" in held[0] and "TORCHELASTIC_RUN_ID=earlier" in held[0]
    assert last.startswith("xlarun: the tpu device is in use by 1 other process") and flag("allow_busy_device") in last
    assert "Traceback" not in result.stderr and launcher_frames(result.stderr) == []
    assert not marker.exists(), "a worker ran"


@pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None, reason="torch_tpu is not installed in this Python (the .venv stack)"
)
def test_a_held_vfio_group_refuses_a_torchtpu_launch(tpu_host: Path, holders: Holders, tmp_path: Path) -> None:
    # TorchTPU opens the chips through /dev/vfio/<iommu group>.
    make_files(tpu_host, "dev/vfio/3", "dev/vfio/vfio")
    holder = holders.hold(tpu_host / "dev" / "vfio" / "3")
    marker = tmp_path / "ran"
    result = run_xlarun(
        "--runtime", "torchtpu", "--nproc_per_node", "2", worker("marker.py"), marker, env=tpu_env(tpu_host)
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"xlarun: pid {holder} holds {tpu_host.resolve()}/dev/vfio/3 ")
    assert "the tpu device is in use by 1 other process" in result.stderr.splitlines()[-1]
    assert not marker.exists(), "a worker ran"


def test_sharing_on_purpose_starts_the_workers(tpu_host: Path, holders: Holders, tmp_path: Path, port: int) -> None:
    holders.hold(tpu_host / "dev" / "accel0")
    marker = tmp_path / "ran"
    result = run_xlarun(
        flag("allow_busy_device"),
        "--device",
        "tpu",
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        worker("marker.py"),
        marker,
        env=tpu_env(tpu_host),
    )
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "ran\nran\n"


def test_a_free_device_starts_the_workers(tpu_host: Path, tmp_path: Path, port: int) -> None:
    marker = tmp_path / "ran"
    result = run_xlarun(
        "--device",
        "tpu",
        "--nproc_per_node",
        "1",
        "--master_port",
        port,
        worker("marker.py"),
        marker,
        env=tpu_env(tpu_host),
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_the_dry_run_reports_holders_without_refusing(tpu_host: Path, holders: Holders) -> None:
    holder = holders.hold(tpu_host / "dev" / "accel1")
    result = run_xlarun(
        "--dry-run", "--device", "tpu", "--nproc_per_node", "2", worker("marker.py"), "never", env=tpu_env(tpu_host)
    )
    assert result.returncode == 0, result.stderr
    [found] = json.loads(result.stdout)["device_holders"]
    assert (found["pid"], found["devices"], found["stop"]) == (
        holder,
        [f"{tpu_host.resolve()}/dev/accel1"],
        f"kill {holder}",
    )
