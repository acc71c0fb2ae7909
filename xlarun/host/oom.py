"""How many processes the kernel's OOM killer has ended, as this host counts them.

A worker the OOM killer ends dies of SIGKILL, which alone says nothing of why. The kernel counts
every such kill: in the memory cgroup the process was charged to (cgroup v2 ``memory.events``,
cgroup v1 ``memory.oom_control``, each counting the cgroup's descendants too) and host-wide in
``/proc/vmstat``. :func:`oom_kills` reads the launcher's own memory cgroup, the one its workers
start in (a Kubernetes container's, a Slurm job step's), and the host's count where no cgroup says.

Usage::

    before = oom_kills()
    ...                               # a worker dies of SIGKILL
    if oom_kills() > before: ...      # the kernel's OOM killer ended something meanwhile
"""

from __future__ import annotations

import os


def oom_kills() -> int:
    """The kills counted by the launcher's memory cgroup, else by the host; 0 where neither says."""
    directory = memory_cgroup_directory()
    if directory is not None:
        for name in ("memory.events", "memory.oom_control"):
            count = _counter(os.path.join(directory, name), "oom_kill")
            if count is not None:
                return count
    return _counter("/proc/vmstat", "oom_kill") or 0


def memory_cgroup_directory(process: str = "/proc/self") -> str | None:
    """Where the memory cgroup of a process (its ``/proc`` directory) is mounted: its v1 ``memory``
    hierarchy, else its v2 group."""
    try:
        with open(os.path.join(process, "cgroup")) as groups:
            memberships = [line.rstrip("\n").split(":", 2) for line in groups]
        with open(os.path.join(process, "mountinfo")) as mounts:
            mountinfo = [line.split() for line in mounts]
    except OSError:
        return None
    paths = {controller: path for _, controller, path in (entry for entry in memberships if len(entry) == 3)
             for controller in controller.split(",")}
    for fields in mountinfo:
        separator = fields.index("-") if "-" in fields else -1
        if separator < 0 or len(fields) < separator + 4:
            continue
        root, mount_point, fs_type, options = fields[3], fields[4], fields[separator + 1], fields[separator + 3]
        if fs_type == "cgroup" and "memory" in options.split(","):
            path = paths.get("memory")
        elif fs_type == "cgroup2" and "memory" not in paths:
            path = paths.get("")
        else:
            continue
        if path is None or not (path + "/").startswith(root.rstrip("/") + "/"):
            continue
        inside = path[len(root.rstrip("/")):].strip("/")
        return os.path.join(mount_point, inside) if inside else mount_point
    return None


def _counter(path: str, name: str) -> int | None:
    """The value of ``name`` in a file of ``name value`` lines, or None."""
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return None
