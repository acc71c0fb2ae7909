"""Whom the kernel's OOM killer ended: its log decides where it can be read; else a counted kill names
a worker only when its peak RSS reached half its share of the tightest memory limit.

The cgroup is a tree of files as the kernel lays it out; the kernel's log is a socket of records,
one per read as ``/dev/kmsg`` gives them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from xlarun.host import oom

WORKER = 4242


@pytest.fixture
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job's cgroup limited to 1024 MiB, its step below it without a limit of its own: the launcher's."""
    mount = tmp_path / "memory"
    step = mount / "job" / "step"
    step.mkdir(parents=True)
    for directory, limit in ((mount, "max"), (mount / "job", str(1024 << 20)), (step, "max")):
        (directory / "cgroup.procs").write_text("")
        (directory / "memory.max").write_text(limit + "\n")
    (step / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    monkeypatch.setattr(oom, "memory_cgroup_directory", lambda: str(step))
    monkeypatch.setattr(oom, "_open_kernel_log", lambda: None)
    return step


@pytest.fixture
def kernel_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """The writing end of a readable kernel log."""
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    monkeypatch.setattr(oom, "_open_kernel_log", lambda: reader.detach())
    yield writer
    writer.close()


def count_kills(cgroup: Path, kills: int) -> None:
    (cgroup / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\n")


def test_the_tightest_limit_is_an_ancestors(cgroup: Path) -> None:
    assert oom.memory_limit_mib(str(cgroup)) == min(1024, oom.memory_limit_mib(None))


def test_no_counted_kill_names_no_worker(cgroup: Path) -> None:
    assert not oom.OomWitness(workers=1).killed(WORKER, 1000)


def test_a_kill_counted_while_a_small_worker_died_of_sigkill_is_not_its(cgroup: Path) -> None:
    witness = oom.OomWitness(workers=1)
    count_kills(cgroup, 1)  # another process in the cgroup, or the host
    assert not witness.killed(WORKER, 19)


def test_a_counted_kill_names_a_worker_that_reached_half_its_share_once(cgroup: Path) -> None:
    witness = oom.OomWitness(workers=2)
    count_kills(cgroup, 1)
    assert witness.killed(WORKER, 300)  # 300 MiB of a 512 MiB share
    assert not witness.killed(WORKER + 1, 300)  # one kill accounts for one worker
    count_kills(cgroup, 2)
    assert not witness.killed(WORKER + 2, 200)


def test_the_log_names_the_victim_whatever_its_size(cgroup: Path, kernel_log: socket.socket) -> None:
    witness = oom.OomWitness(workers=1)
    count_kills(cgroup, 1)
    kernel_log.send(
        b"6,581,807102801,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
        b"mems_allowed=0,oom_memcg=/job,task_memcg=/job/step,task=python,pid=4242,uid=0\n"
    )
    kernel_log.send(
        b"3,582,807102814,-;Memory cgroup out of memory: Killed process 4242 (python) "
        b"total-vm:627164kB, anon-rss:597760kB\n SUBSYSTEM=memory\n"
    )
    assert witness.killed(WORKER, 19)


def test_the_log_clears_a_worker_it_does_not_name(cgroup: Path, kernel_log: socket.socket) -> None:
    witness = oom.OomWitness(workers=1)
    count_kills(cgroup, 1)
    kernel_log.send(b"3,421,541869985,-;Out of memory: Killed process 14242 (python) total-vm:627312kB\n")
    assert not witness.killed(WORKER, 1000)


def test_a_log_that_lost_records_leaves_the_counters_to_decide(cgroup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, writer = os.pipe()
    os.close(writer)  # a log that ends, no longer the kernel's whole log
    monkeypatch.setattr(oom, "_open_kernel_log", lambda: reader)
    witness = oom.OomWitness(workers=1)
    count_kills(cgroup, 1)
    assert witness.killed(WORKER, 1000)
