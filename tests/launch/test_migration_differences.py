"""The exit codes docs/migrating.md lists as differing from torchrun on purpose, each command run
under both launchers: a worker's argparse error (torchrun 1, xlarun 2, the worker's own code) and
the launcher stopped by SIGINT or SIGTERM (torchrun 1, xlarun 130 and 143)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import finish, run_torchrun, run_xlarun, start_torchrun, start_xlarun, wait_for

ARGPARSE_SCRIPT = """
import argparse, pathlib, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--ready", required=True)
arguments = parser.parse_args()
pathlib.Path(arguments.ready).write_text("")
time.sleep(60)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(ARGPARSE_SCRIPT)
    return path


def test_a_workers_argparse_error_exits_2_where_torchrun_exits_1(script: Path, port: int) -> None:
    codes = {
        name: run("--nproc_per_node", "1", "--master_port", port, script, "--no-such-flag").returncode
        for name, run in (("torchrun", run_torchrun), ("xlarun", run_xlarun))
    }
    assert codes == {"torchrun": 1, "xlarun": 2}


@pytest.mark.parametrize("stop, xlarun_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_launcher_stopped_by_a_signal_exits_128_plus_it_where_torchrun_exits_1(
    script: Path, port: int, tmp_path: Path, stop: signal.Signals, xlarun_code: int
) -> None:
    launchers: dict[str, Callable[..., subprocess.Popen]] = {"torchrun": start_torchrun, "xlarun": start_xlarun}
    codes = {}
    for name, start in launchers.items():
        ready = tmp_path / f"{name}.ready"
        launcher = start("--nproc_per_node", "1", "--master_port", port, script, "--ready", ready)
        wait_for(ready.exists, f"the worker under {name} to start")
        launcher.send_signal(stop)
        codes[name] = finish(launcher).returncode
    assert codes == {"torchrun": 1, "xlarun": xlarun_code}
