"""Whether the kernel's OOM killer ended a worker, as the evidence this host keeps points at it.

A worker the OOM killer ends dies of SIGKILL, which alone says nothing of why: an operator's
``kill -9`` looks the same. The kernel leaves two kinds of evidence:

- its log (``/dev/kmsg``, what ``dmesg`` shows) names each victim by pid: ``Out of memory: Killed
  process <pid> (...)``, ``Memory cgroup out of memory: Killed process <pid> (...)`` and
  ``oom-kill:...,task_memcg=...,task=...,pid=<pid>,uid=...``. Where the launcher can read it
  (root, or ``kernel.dmesg_restrict=0``) and its pids are the kernel's (the host's pid namespace),
  the log decides: the worker was OOM-killed exactly when a record written since the workers
  started names its pid;
- counters of kills: in the memory cgroup the process was charged to (cgroup v2 ``memory.events``,
  cgroup v1 ``memory.oom_control``, each counting the cgroup's descendants too) and host-wide in
  ``/proc/vmstat``. A count counts every process of the cgroup (of the host, where no cgroup
  says), not only workers. So where the log cannot be read, a rise names the OOM killer only when
  the worker is also the process it would have chosen: the OOM killer ends the largest process
  under the limit that ran out, so the worker's peak RSS must reach half its share of that limit
  (the tightest memory limit of its cgroup and the cgroup's ancestors, or the host's memory,
  shared by the group's workers). One rise accounts for one worker.

The workers start in the launcher's memory cgroup (a Kubernetes container's, a Slurm job step's),
so the launcher's own cgroup is the one read.

Usage::

    witness = OomWitness(workers=8)          # when the workers start
    ...                                      # a worker dies of SIGKILL
    if witness.killed(pid, peak_rss_mib): ... # the evidence points at this worker
    witness.close()
"""

from __future__ import annotations

import os
import re
import time

KERNEL_LOG = "/dev/kmsg"
_VICTIM = r"Killed process (\d+) |^oom-kill:.*,pid=(\d+),"
_RECORDS_PER_READ = 100_000
"""More than a kernel's log buffer holds: a bound on one read of the log, whatever writes to it."""
_INITIAL_PID_NAMESPACE = 0xEFFFFFFC
_UNLIMITED = 1 << 62
"""cgroup v1's "no limit" is a page-rounded LONG_MAX; anything above this is no limit."""


class OomWitness:
    """The kernel's evidence of OOM kills since a group's workers started."""

    def __init__(self, workers: int) -> None:
        self._workers = max(workers, 1)
        self._cgroup = memory_cgroup_directory()
        self._counted = oom_kills(self._cgroup)
        self._log = _open_kernel_log()
        self._victims: set[int] = set()

    def killed(self, pid: int, peak_rss_mib: float | None) -> bool:
        """Whether the worker ``pid``, dead of SIGKILL with peak RSS ``peak_rss_mib``, was the OOM killer's."""
        count = oom_kills(self._cgroup)
        rose = count > self._counted
        logged = self._logged(pid, wait=rose)
        if logged is not None:
            self._counted = count  # the log explained every kill counted so far
            return logged
        if rose and peak_rss_mib is not None and peak_rss_mib * 2 * self._workers >= memory_limit_mib(self._cgroup):
            self._counted += 1
            return True
        return False

    def close(self) -> None:
        if self._log is not None:
            os.close(self._log)
            self._log = None

    def _logged(self, pid: int, wait: bool) -> bool | None:
        """Whether the log names ``pid`` as a victim; None where it cannot say. ``wait``: a kill was
        counted, and the kernel counts a kill just before it logs it, so a moment for the record."""
        if not self._read_log():
            return None
        if pid not in self._victims and wait:
            time.sleep(0.1)
            if not self._read_log():
                return None
        return pid in self._victims

    def _read_log(self) -> bool:
        """Add the victims the kernel logged since the last read. False, and the log closed for good,
        where records went unread (overwritten before they were read) or the log failed: from then on
        it cannot say that a worker was not killed."""
        if self._log is None:
            return False
        for _ in range(_RECORDS_PER_READ):
            try:
                record = os.read(self._log, 8192).decode(errors="replace")
            except BlockingIOError:
                return True
            except OSError:
                break
            if not record:
                break  # the kernel's log never ends: not the log
            found = re.search(_VICTIM, record.partition(";")[2].split("\n", 1)[0])
            if found:
                self._victims.add(int(found[1] or found[2]))
        self.close()
        return False


def _open_kernel_log() -> int | None:
    """The kernel's log, read from its end on, where it can be read and names pids as the launcher sees them."""
    if not _in_initial_pid_namespace():
        return None
    try:
        log = os.open(KERNEL_LOG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(log, 0, os.SEEK_END)
    except OSError:
        os.close(log)
        return None
    return log


def _in_initial_pid_namespace() -> bool:
    """The launcher's pids are the ones the kernel logs: its pid namespace is the host's, whose inode
    number is fixed (``PROC_PID_INIT_INO``); a container's own ``/proc`` would not show the difference."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _INITIAL_PID_NAMESPACE
    except OSError:
        return False


def oom_kills(directory: str | None = None) -> int:
    """The kills counted by a memory cgroup (its directory), else by the host; 0 where neither says."""
    if directory is not None:
        for name in ("memory.events", "memory.oom_control"):
            count = _counter(os.path.join(directory, name), "oom_kill")
            if count is not None:
                return count
    return _counter("/proc/vmstat", "oom_kill") or 0


def memory_limit_mib(directory: str | None) -> float:
    """The tightest memory limit on a memory cgroup: its own and every ancestor's up to the hierarchy's
    mount (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), and the host's memory."""
    limits = [(_counter("/proc/meminfo", "MemTotal:") or _UNLIMITED >> 10) * 1024]  # in kB there
    while directory is not None and os.path.isdir(directory):
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                with open(os.path.join(directory, name)) as handle:
                    value = handle.read().strip()
            except OSError:
                continue
            if value.isdigit() and int(value) < _UNLIMITED:
                limits.append(int(value))
        if not os.path.exists(os.path.join(os.path.dirname(directory), "cgroup.procs")):
            break  # the hierarchy's mount: above it is not a cgroup
        directory = os.path.dirname(directory)
    return min(limits) / (1024 * 1024)


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
    paths = {
        controller: path
        for _, controller, path in (entry for entry in memberships if len(entry) == 3)
        for controller in controller.split(",")
    }
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
        inside = path[len(root.rstrip("/")) :].strip("/")
        return os.path.join(mount_point, inside) if inside else mount_point
    return None


def _counter(path: str, name: str) -> int | None:
    """The number after ``name`` in a file of ``name value`` lines (``/proc/meminfo``'s: a unit after it), or None."""
    try:
        with open(path) as handle:
            for line in handle:
                words = line.split()
                if len(words) > 1 and words[0] == name:
                    return int(words[1])
    except (OSError, ValueError):
        pass
    return None
