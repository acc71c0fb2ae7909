"""Who sent the stop signals of a failing test's time: the kernel's own record, in the test's report.

A process ended by a signal tells its parent only which signal (``wait4`` has no sender), so a launcher
that a test saw end with SIGKILL could have been killed by the test, by the other stack's tests side by
side, by a supervisor of the machine or by the kernel's OOM killer. The kernel's tracepoint
``signal:signal_generate`` records every signal as it is sent: the task sending it (the caller of
``kill``, or for the kernel's own signals, code ``SI_KERNEL``, whichever task was running, as the one
whose allocation woke the OOM killer), the signal, and the target's pid and name. Where the tests run as
root, the session keeps a trace instance of its own for SIGKILL and SIGTERM (tracefs, mounted where it
was not), and a test that fails gets a section listing those signals sent while it ran, on the whole
machine. Elsewhere the witness is off and reports nothing.

Each session has its instance, named after its pid (``xlarun-tests-<pid>``), so the two stacks that run
side by side keep their own, and an instance whose session died is removed by the next one. The
instance's clock is ``CLOCK_MONOTONIC`` (``mono``), that of :func:`time.monotonic`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
PREFIX = "xlarun-tests-"
WATCHED = (signal.SIGKILL, signal.SIGTERM)
SI_KERNEL = 0x80
SHOWN_AT_MOST = 60
# The event as tracefs prints it: "<task>-<tid> [(<tgid>)] [cpu] <flags> <seconds>: signal_generate: sig=9 errno=0 code=0
# comm=<target> pid=<target pid> grp=1 res=0" (res: the kernel's enum trace_signal_deliver_result).
EVENT = (
    r"^\s*(?P<sender>.+)-(?P<tid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+\S+\s+(?P<seconds>[\d.]+): signal_generate: "
    r"sig=(?P<sig>\d+) errno=\d+ code=(?P<code>-?\d+) comm=(?P<target>.*) pid=(?P<pid>\d+) grp=\d+ res=(?P<res>\d+)$"
)
EVENT_DIRECTORY = Path("events", "signal", "signal_generate")
"""The event's settings, under an instance."""
RESULTS = {"0": "", "1": " (not delivered: ignored, or its target was ending)", "2": " (one was pending already)"}


class KillWitness:
    """One session's trace instance of SIGKILL and SIGTERM; :meth:`open` gives None where there can be none."""

    def __init__(self, instance: Path):
        self.instance = instance

    @classmethod
    def open(cls) -> KillWitness | None:
        if os.geteuid() != 0 or not mounted():
            return None
        remove_orphaned_instances()
        instance = TRACEFS / "instances" / f"{PREFIX}{os.getpid()}"
        try:
            instance.mkdir()
            (instance / "trace_clock").write_text("mono")
            event = instance / EVENT_DIRECTORY
            (event / "filter").write_text(" || ".join(f"sig == {int(number)}" for number in WATCHED))
            (event / "enable").write_text("1")
        except OSError:
            with contextlib.suppress(OSError):
                instance.rmdir()
            return None
        return cls(instance)

    def sent_between(self, start: float, end: float) -> list[str]:
        """The watched signals sent from ``start`` to ``end`` (``time.monotonic()``), one line each, oldest first."""
        lines = []
        for match in events(self.instance / "trace"):
            seconds = float(match["seconds"])
            if start <= seconds <= end:
                lines.append(describe(match, seconds - end))
        if len(lines) > SHOWN_AT_MOST:
            lines[: len(lines) - SHOWN_AT_MOST] = [f"({len(lines) - SHOWN_AT_MOST} earlier ones left out)"]
        return lines

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.instance / EVENT_DIRECTORY / "enable").write_text("0")
            self.instance.rmdir()


def mounted() -> bool:
    """Whether tracefs is there, mounting it where it is not (root may)."""
    if (TRACEFS / "instances").is_dir():
        return True
    mount = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, check=False)
    return mount.returncode == 0 and (TRACEFS / "instances").is_dir()


def remove_orphaned_instances() -> None:
    for instance in (TRACEFS / "instances").glob(f"{PREFIX}*"):
        pid = int(instance.name.removeprefix(PREFIX))
        if not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                instance.rmdir()


def events(trace: Path) -> Iterator[re.Match[str]]:
    with open(trace, errors="replace") as lines:
        for line in lines:
            match = re.match(EVENT, line.rstrip("\n"))
            if match is not None:
                yield match


def describe(match: re.Match[str], before_end: float) -> str:
    name = signal.Signals(int(match["sig"])).name
    sender = (
        f"the kernel (SI_KERNEL: the OOM killer or a fault), while {match['sender']} ({match['tid']}) ran"
        if int(match["code"]) == SI_KERNEL
        else f"{match['sender']} ({match['tid']})"
    )
    outcome = RESULTS.get(match["res"], f" (res {match['res']})")
    return f"{before_end:+8.2f} s  {name} to {match['target']} ({match['pid']}) from {sender}{outcome}"
