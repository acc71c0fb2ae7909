"""What stalls the launcher's side (a console that stops reading, a slow stack dump) is neither taken
for the workers' hang nor allowed to hold up what the loop must do: the workers' exits, the signals."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from helpers import XLARUN, clean_env, worker

HANG_TIMEOUT = 3


def test_a_console_that_stops_reading_is_not_a_hang(port: int, tmp_path: Path) -> None:
    """`xlarun --tee 3 --hang-timeout 3 floods.py | sleep 15`, with a reader that takes nothing for
    10 s, then everything: the workers waited in their writes; the run ends with their own code."""
    stderr_path = tmp_path / "stderr"
    read_end, write_end = os.pipe()
    with open(stderr_path, "wb") as stderr:
        launcher = subprocess.Popen([*XLARUN, "--nproc-per-node", "2", "--master-port", str(port), "--tee", "3",
                                     "--hang-timeout", str(HANG_TIMEOUT), worker("floods.py"), "8", "3"],
                                    env=clean_env(), stdin=subprocess.DEVNULL, stdout=write_end, stderr=stderr)
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

