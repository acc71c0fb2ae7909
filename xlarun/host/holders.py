"""Which processes hold this host's accelerator device files open: the busy-device preflight.

Usage::

    holders = busy_device_holders("tpu", environ)      # what holds /dev/accel*, /dev/vfio/<group>
    for holder in holders:
        print(describe_holder(holder))                 # pid, files, age, command, run id, how to stop it

A worker left behind by an earlier run keeps the TPU or Neuron device open, and the next
run fails deep inside the runtime ("The TPU is already in use by another process"). The
launcher looks first: every ``/proc/<pid>/fd/*`` link is read (``readlink`` only, which
never touches the file's own filesystem, so a hung network mount cannot stall it) and
compared with the device files' paths.

Device files are looked for under the host root (``XLARUN_HOST_ROOT`` for a fake host in
tests), but processes always come from the real ``/proc``: a fake host's device files are
ordinary files, and a real process that holds one open shows its real path in its fd links.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from xlarun.durations import format_age
from xlarun.flags import flag
from xlarun.host.devices import device_files, host_root
from xlarun.host.procfs import CLOCK_TICKS, started_environ, stat_fields
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any

SHARED_BY_DESIGN = ("nvidia-persistenced", "nv-hostengine")
"""Daemons that keep GPUs open on purpose (persistence mode, DCGM) and never stop a run.
Compared with a process's name as ``/proc/<pid>/comm`` gives it (the first 15 characters)."""

COMMAND_WIDTH = 120


class Holder(Struct, frozen=True):
    """A process that holds one or more device files open."""

    pid: int
    command: str
    age_seconds: float
    devices: tuple[str, ...]
    run_id: str | None
    """``TORCHELASTIC_RUN_ID`` from its environment: it looks like a worker of an earlier
    launch (torchrun's or xlarun's). None when absent or unreadable."""
    pgid: int
    sid: int

    @property
    def stop_command(self) -> str:
        """How to stop it. A launched worker leads its own session and group, which also
        holds its children (data loaders keep the device open too): the whole group goes."""
        if self.run_id is not None and self.pgid == self.sid and self.pgid > 1:
            return f"kill -- -{self.pgid}"
        return f"kill {self.pid}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": self.command,
            "age_seconds": round(self.age_seconds, 1),
            "devices": list(self.devices),
            "run_id": self.run_id,
            "stop": self.stop_command,
        }


def busy_device_holders(device: str, environ: Mapping[str, str]) -> list[Holder]:
    """Processes that hold ``device``'s files on this host; this one among them where it does (a Python
    program or a notebook calling :func:`xlarun.launch` after it opened the device itself)."""
    return find_holders(device_files(device, host_root(environ)))


def find_holders(paths: Iterable[str], proc: str = "/proc", exclude: Iterable[int] = ()) -> list[Holder]:
    """Processes (by pid, ascending) whose open files include any of ``paths``.

    Processes this user may not inspect are skipped: without privileges the launcher sees
    its own user's processes, which is where a left-behind worker of its own would be.
    """
    wanted = set(paths)
    if not wanted:
        return []
    skipped = set(exclude)
    held: dict[int, set[str]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        fd_dir = f"{proc}/{name}/fd/"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir + fd)
            except OSError:
                continue
            if target in wanted:
                held.setdefault(int(name), set()).add(target)
    holders = []
    for pid in sorted(held.keys() - skipped):
        holder = _describe_process(proc, pid, held[pid])
        if holder is not None:
            holders.append(holder)
    return holders


def _describe_process(proc: str, pid: int, devices: set[str]) -> Holder | None:
    base = f"{proc}/{pid}"
    try:
        name, fields = stat_fields(f"{base}/stat")
        with open(f"{base}/cmdline", "rb") as handle:
            argv = handle.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return None  # it ended meanwhile
    if name in (daemon[:15] for daemon in SHARED_BY_DESIGN):
        return None
    pgid, sid, started = int(fields[5]), int(fields[6]), int(fields[22])
    # One line whatever the arguments hold (``python -c`` programs span several).
    command = " ".join(b" ".join(argv).decode(errors="replace").split()) or f"[{name}]"
    if len(command) > COMMAND_WIDTH:
        command = command[: COMMAND_WIDTH - 3] + "..."
    return Holder(
        pid=pid,
        command=command,
        age_seconds=_age(proc, started),
        devices=tuple(sorted(devices)),
        run_id=started_environ(f"{base}/environ").get("TORCHELASTIC_RUN_ID"),
        pgid=pgid,
        sid=sid,
    )


def _age(proc: str, started_ticks: int) -> float:
    try:
        with open(f"{proc}/uptime") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / CLOCK_TICKS)


def describe_holder(holder: Holder) -> str:
    """One line: who holds what, for how long, whether it is an earlier launch's worker, how to stop it."""
    if holder.pid == os.getpid():
        return (
            f"this Python process (pid {holder.pid}) holds {', '.join(holder.devices)}, which its workers "
            "need: release the device first (in a notebook, restart the kernel)"
        )
    earlier = (
        f"; a worker of an earlier launch (TORCHELASTIC_RUN_ID={holder.run_id})" if holder.run_id is not None else ""
    )
    return (
        f"pid {holder.pid} holds {', '.join(holder.devices)} (running {format_age(holder.age_seconds)}): "
        f"{holder.command}{earlier}; stop it with: {holder.stop_command}"
    )


def busy_device_refusal(device: str, holders: list[Holder]) -> str:
    """The line that ends a launch after :func:`describe_holder`'s lines, one per holder (on lines of
    their own, or before it on its line)."""
    them = "them" if len(holders) > 1 else "it"
    return (
        f"the {device} device is in use by {len(holders)} other process{'es' if len(holders) > 1 else ''}, "
        f"so nothing was started: stop {them}, or pass {flag('allow_busy_device')} "
        "where sharing the device is intended"
    )
