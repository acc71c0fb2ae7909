"""What the subcommands share: their error, the environment of what they start, ``/proc`` readings
xlarun itself has no use for, and the machine's facts for the reports.

``/proc/<pid>/stat`` is read with xlarun's own :func:`xlarun.host.procfs.stat_fields`, whose
fields are numbered as stat(5) numbers them.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import tempfile
from pathlib import Path

from xlarun.host.procfs import CLOCK_TICKS, stat_fields

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = ("xlarun", "torchrun")
# Variables that would change what the launchers or the workers do if inherited.
CLEARED_PREFIXES = ("PET_", "XLARUN_", "TORCHELASTIC_", "PJRT_", "XRT_")
CLEARED_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    # Without bytecode caches every launch compiles the launcher's modules again, and an
    # unbuffered launcher stdout costs torchrun's tee a write per line: neither is how an
    # installed launcher usually runs.
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
)
# stat(5)'s numbers of the fields read here.
STAT_SESSION, STAT_UTIME, STAT_STIME = 6, 14, 15


class BenchError(RuntimeError):
    """A launcher or worker exited with a code the measure did not expect."""


def scratch_directory() -> tempfile.TemporaryDirectory[str]:
    """The directory a run's logs, marks and worker scripts live in. The launchers' and the workers' command
    lines hold its path, so its name names neither launcher: a kill by name aimed at one launcher
    (``pkill -f xlarun``, as docs/signals.md describes ending xlarun's processes) ends that launcher's
    runs, never the other's measure."""
    return tempfile.TemporaryDirectory(prefix="launcher-bench-")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def clean_environment() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(CLEARED_PREFIXES) and name not in CLEARED_NAMES
    }
    # Both launchers print a notice otherwise; the measure is the launch, not the notice.
    env["OMP_NUM_THREADS"] = "1"
    return env


def check_exit(launcher: str, status: int, expected_ok: bool, stderr_path: Path) -> None:
    code = os.waitstatus_to_exitcode(status)
    if (code == 0) == expected_ok:
        return
    raise unexpected_end(launcher, status, f"expected {'0' if expected_ok else 'non-zero'}", stderr_path)


def unexpected_end(launcher: str, status: int, expectation: str, stderr_path: Path) -> BenchError:
    """The error of a run that did not end as its measure needs: how it ended (an exit code, or the
    signal that killed it), what was expected, and the end of its stderr."""
    code = os.waitstatus_to_exitcode(status)
    ended = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
    tail = stderr_path.read_text(errors="replace").splitlines()[-15:]
    return BenchError(f"{launcher} {ended}, {expectation}; its stderr ends with:\n" + "\n".join(tail))


# --- /proc -------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def session_of(pid: int) -> int | None:
    try:
        _, fields = stat_fields(f"/proc/{pid}/stat")
    except OSError:
        return None
    return int(fields[STAT_SESSION])


def name_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None


def peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU of one live process (its threads, not its children), from /proc."""
    _, fields = stat_fields(f"/proc/{pid}/stat")
    return (int(fields[STAT_UTIME]) + int(fields[STAT_STIME])) / CLOCK_TICKS


def listening(port: int) -> bool:
    """Whether a TCP socket of this host listens on ``port`` (read from /proc: nothing connects)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        # local_address is HEXADDR:HEXPORT; state 0A is LISTEN.
        if any(int(row.split()[1].rsplit(":", 1)[1], 16) == port and row.split()[3] == "0A" for row in rows):
            return True
    return False


# --- machine facts -----------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total_gib() -> str:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"
