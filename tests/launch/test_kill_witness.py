"""The kill witness that ends a failing test's report names who sent a signal (see ``tests/kill_witness.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import wait_for
from kill_witness import KillWitness


def test_a_sigkill_is_named_with_its_sender_and_its_target(kill_witness: KillWitness) -> None:
    start = time.monotonic()
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    # Popen returns once the exec began, before the kernel gives the process its new name.
    wait_for(lambda: Path(f"/proc/{bystander.pid}/comm").read_text() == "sleep\n", "sleep to take its name")
    os.kill(bystander.pid, signal.SIGKILL)
    assert bystander.wait(timeout=60) == -signal.SIGKILL
    sent = kill_witness.sent_between(start, time.monotonic())

    sender = Path("/proc/self/comm").read_text().strip()
    assert [line.split(" s  ", 1)[1] for line in sent if f"({bystander.pid})" in line] == [
        f"SIGKILL to sleep ({bystander.pid}) from {sender} ({os.getpid()})"
    ], sent
