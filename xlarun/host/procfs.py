"""Reading ``/proc``: a process's ``stat`` fields (its name may hold spaces and parentheses), every
process's at once, the environment a process started with, and the user it runs as."""

from __future__ import annotations

import os
from collections.abc import Iterator

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""The unit of ``stat``'s times (``utime``, ``starttime``, ...) per second."""


def stat_fields(path: str) -> tuple[str, list[bytes]]:
    """The process's name and the fields of the stat file at ``path``, numbered as stat(5)
    numbers them: ``fields[3]`` is the state, ``fields[5]`` the process group, and so on
    (``fields[0]`` is empty). Raises ``OSError`` when the process is gone."""
    with open(path, "rb") as handle:
        head, rest = handle.read().rsplit(b")", 1)
    pid, name = head.split(b" (", 1)
    return name.decode(errors="replace"), [b"", pid, name, *rest.split()]


def process_stats(proc: str = "/proc") -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and :func:`stat_fields`, in one pass over ``proc``; those that end meanwhile are left out."""
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            _, fields = stat_fields(f"{proc}/{name}/stat")
        except OSError:
            continue
        yield int(name), fields


def started_environ(path: str) -> dict[str, str]:
    """The environment a process started with (its ``/proc/<pid>/environ`` at ``path``); empty where this
    user may not read it (another user's process) or the process is gone."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {key: value for key, _, value in pairs}


def process_owner(pid: int, proc: str = "/proc") -> int | None:
    """The user a process runs as: its real, effective, saved and file-system user ids (``Uid:`` of
    its ``status``) where they are one; ``None`` where they differ or the process is gone.

    Not the owner of ``/proc/<pid>``, which is root for a process that made itself non-dumpable.
    """
    try:
        with open(f"{proc}/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    ids = {int(value) for value in line.split()[1:]}
                    return ids.pop() if len(ids) == 1 else None
    except (OSError, ValueError):
        pass
    return None
