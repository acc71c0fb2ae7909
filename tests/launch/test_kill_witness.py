"""The kill witness that ends a failing test's report names who sent a signal (see ``tests/kill_witness.py``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from helpers import hold_open
from kill_witness import KillWitness


def test_a_sigkill_is_named_with_its_sender_and_its_target(kill_witness: KillWitness) -> None:
    start = time.monotonic()
    bystander = hold_open(os.devnull, 600)  # returned once the kernel shows it as sleep
    os.kill(bystander.pid, signal.SIGKILL)
    assert bystander.wait(timeout=60) == -signal.SIGKILL
    sent = kill_witness.sent_between(start, time.monotonic())

    sender = Path("/proc/self/comm").read_text().strip()
    assert [line.split(" s  ", 1)[1] for line in sent if f"({bystander.pid})" in line] == [
        f"SIGKILL to sleep ({bystander.pid}) from {sender} ({os.getpid()})"
    ], sent
