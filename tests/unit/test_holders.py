"""The busy-device preflight in-process: device files on fake hosts, scans that find nobody, the record.

``tests/launch/test_holders.py`` has real processes hold the device files open.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TESTS

from xlarun.durations import format_age
from xlarun.host.holders import Holder, busy_device_holders, device_files, find_holders

HOSTS_DIR = TESTS / "fixtures" / "hosts"


def make_files(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


# --- unit: which files, which processes (processes that hold files, no launcher) ------------------------------------------------------------------


def test_device_files_by_device(tmp_path: Path) -> None:
    make_files(
        tmp_path,
        "dev/accel0",
        "dev/accel1",
        "dev/accelerometer",
        "dev/vfio/0",
        "dev/vfio/vfio",
        "dev/neuron0",
        "dev/neuron11",
        "dev/nvidia0",
        "dev/nvidiactl",
        "dev/nvidia-uvm",
    )
    dev = tmp_path.resolve() / "dev"
    assert device_files("tpu", str(tmp_path)) == {str(dev / "accel0"), str(dev / "accel1"), str(dev / "vfio" / "0")}
    assert device_files("neuron", str(tmp_path)) == {str(dev / "neuron0"), str(dev / "neuron11")}
    assert device_files("cuda", str(tmp_path)) == {str(dev / "nvidia0")}
    assert device_files("cpu", str(tmp_path)) == set()
    assert device_files("tpu", str(tmp_path / "no-such-host")) == set()


def test_no_device_files_means_no_scan(tmp_path: Path) -> None:
    assert find_holders(set(), proc=str(tmp_path / "no-proc")) == []
    assert busy_device_holders("tpu", {"XLARUN_HOST_ROOT": str(HOSTS_DIR / "tpu-v4-vm")}) == []


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (45.9, "45s"), (192, "3m12s"), (18420, "5h07m"), (187200, "2d04h")]
)
def test_format_age(seconds: float, text: str) -> None:
    assert format_age(seconds) == text


def test_as_dict_is_what_the_dry_run_shows() -> None:
    holder = Holder(
        pid=7, command="python -u train.py", age_seconds=12.34, devices=("/dev/accel0",), run_id="none", pgid=7, sid=7
    )
    assert holder.as_dict() == {
        "pid": 7,
        "command": "python -u train.py",
        "age_seconds": 12.3,
        "devices": ["/dev/accel0"],
        "run_id": "none",
        "stop": "kill -- -7",
    }


# --- launch: a fake TPU host with accel0 held open ------------------------------------------------------
