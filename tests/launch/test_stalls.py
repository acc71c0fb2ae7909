"""What stalls the launcher's side (a console that stops reading, a slow stack dump) is neither taken
for the workers' hang nor allowed to hold up what the loop must do: the workers' exits, the signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import XLARUN, clean_env, finish, is_alive, kill_all, wait_for, worker

HANG_TIMEOUT = 3


def test_a_console_that_stops_reading_is_not_a_hang(port: int, tmp_path: Path) -> None:
    """`xlarun --tee 3 --hang-timeout 3 floods.py | sleep 15`, with a reader that takes nothing for
    10 s, then everything: the workers waited in their writes; the run ends with their own code."""
    stderr_path = tmp_path / "stderr"
    read_end, write_end = os.pipe()
    with open(stderr_path, "wb") as stderr:
        launcher = subprocess.Popen(
            [
                *XLARUN,
                "--nproc-per-node",
                "2",
                "--master-port",
                str(port),
                "--tee",
                "3",
                "--hang-timeout",
                str(HANG_TIMEOUT),
                worker("floods.py"),
                "8",
                "3",
            ],
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=stderr,
        )
    os.close(write_end)
    try:
        time.sleep(10)  # past the hang timeout and the check that the workers are idle, twice over
        with os.fdopen(read_end, "rb") as reader:
            relayed = len(reader.read())
        returncode = launcher.wait(timeout=60)
    finally:
        launcher.kill()
    stderr_text = stderr_path.read_text()
    assert returncode == 3, stderr_text
    assert relayed >= 8 * 2**20, stderr_text  # the first rank to end wrote all of its own
    assert "hung" not in stderr_text
    assert stderr_text.count("took no output") == 1, stderr_text


FAKE_PY_SPY = """#!{python}
# A py-spy that never answers, and leaves a child behind that holds its output open.
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join({marks!r}, f"{{os.getpid()}}-{{child.pid}}"), "w"):
    pass
time.sleep(120)
"""


def test_a_stop_signal_is_handled_at_once_while_stacks_are_taken(port: int, tmp_path: Path) -> None:
    """The workers are found hung and py-spy takes its time (and leaves a child holding its pipe): a
    SIGTERM then ends the run at once, py-spy and its child with it."""
    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir()
    marks.mkdir()
    fake = bin_dir / "py-spy"
    fake.write_text(FAKE_PY_SPY.format(python=sys.executable, marks=str(marks)))
    fake.chmod(0o755)
    launcher = subprocess.Popen(
        [
            *XLARUN,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(port),
            "--hang-timeout",
            str(HANG_TIMEOUT),
            "--no-python",
            "sleep",
            "600",
        ],
        env=clean_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def spies() -> list[int]:
        return [int(pid) for mark in marks.iterdir() for pid in mark.name.split("-")]

    try:
        wait_for(lambda: len(spies()) == 4, "py-spy to be started for both workers")
        sent = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        result = finish(launcher)
        handled_after = time.monotonic() - sent
        assert result.returncode == 128 + signal.SIGTERM, result.stderr
        assert handled_after < 3, result.stderr
        wait_for(lambda: not any(is_alive(pid) for pid in spies()), "py-spy and its child to be gone")
    finally:
        launcher.kill()
        kill_all(spies())
