"""What the tests of a job on several hosts share (``test_hosts.py`` over a local transport,
``test_hosts_ssh.py`` over a real OpenSSH server): one ``xlarun --hosts`` launcher as a
:class:`Job`, and its processes found by its run id in ``/proc/<pid>/environ``, never by name
(every "host" is this machine, so ``/proc`` shows them all).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import Run, files_exist, finish, kill_all, start_xlarun, wait_for, worker

NPROC = 2
"""Workers per host."""
WORKERS = 2 * NPROC
"""Workers of a job: the tests run two hosts."""
JOB_VARIABLE = "XLARUN_TEST_JOB"
"""Set through ``--env`` to the job's run id: every agent, node and worker of the job has it."""
STOP_DEADLINE_S = 10
"""How long a stopped job's processes may outlive the cause on any host (teardown's grace included)."""


def live_environ(pid: int) -> list[bytes] | None:
    """The starting environment of process ``pid``, or None where it is gone or a zombie."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        zombie = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return None
    return None if zombie else environ


def job_processes(run_id: str) -> list[int]:
    """Every live process (not a zombie) on this machine that belongs to the job ``run_id``: its
    workers' ``TORCHELASTIC_RUN_ID``, or the variable every part of the job gets through ``--env``."""
    wanted = (f"TORCHELASTIC_RUN_ID={run_id}".encode(), f"{JOB_VARIABLE}={run_id}".encode())
    found = []
    for entry in os.listdir("/proc"):
        environ = live_environ(int(entry)) if entry.isdigit() else None
        if environ is not None and any(variable in environ for variable in wanted):
            found.append(int(entry))
    return found


def agent_of(run_id: str, node_rank: int) -> psutil.Process:
    """The agent of the host that runs node ``node_rank`` of the job: its node's parent (the node is the
    job's process whose command line holds the node rank the plan gave it)."""
    for pid in job_processes(run_id):
        try:
            process = psutil.Process(pid)
            if f"--node-rank={node_rank}" in process.cmdline():
                return process.parent()
        except psutil.Error:
            continue
    pytest.fail(f"no node {node_rank} of {run_id} runs")


def hanging_python(directory: Path) -> tuple[Path, Path]:
    """A ``--remote-python`` that hangs as an interpreter on a dead mount would (it sleeps, its pid appended to
    the second path first), and that file."""
    pids = directory / "hung.pids"
    python = directory / "hanging-python"
    python.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 600\n")
    python.chmod(0o755)
    return python, pids


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie is not)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.Error:
            pass
    return running


def describe(pids: list[int]) -> str:
    """Each pid with its command line, for a failure's message."""
    described = []
    for pid in pids:
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        described.append(f"{pid} {b' '.join(words).decode(errors='replace')}")
    return "; ".join(described)


def sleepers(out_dir: Path, *actions: str) -> list[object]:
    """``faults.py`` writing its pids to ``out_dir``, with one action per rank (``sleep`` until stopped,
    ``exit:CODE:SECONDS``): every rank sleeps unless told."""
    return [worker("faults.py"), out_dir, *(actions or ["sleep"] * WORKERS)]


def one_line(text: str, *words: str) -> str:
    """The one line of ``text`` that holds every word; fails unless exactly one does."""
    lines = [line for line in text.splitlines() if all(word in line for word in words)]
    assert len(lines) == 1, f"expected one line with {words}, got {lines}:\n{text}"
    return lines[0]


def assert_worker_lines_carry_host_and_rank(run: Run, host_of: Callable[[int], str]) -> None:
    """``chatter.py 3``'s lines: every worker's 3 lines on each stream arrive whole, on their own
    stream, behind their host (``host_of(rank)``) and rank."""
    for name, text in (("out", run.stdout), ("err", run.stderr)):
        lines = [line for line in text.splitlines() if re.search(rf"\br\d {name} \d", line)]
        assert len(lines) == WORKERS * 3, text
        for line in lines:
            rank = int(re.search(r"\br(\d) ", line).group(1))  # type: ignore[union-attr]
            assert re.fullmatch(rf"{re.escape(host_of(rank))}:{rank}: r{rank} {name} \d x*", line), line


class Job:
    """One ``xlarun --hosts`` launcher started with ``hosts`` (the flags naming the hosts and the
    transport), and the run id that finds its processes."""

    def __init__(self, hosts: list[object], out_dir: Path, *args: object, env: dict[str, str] | None = None) -> None:
        self.run_id = f"hosts-{secrets.token_hex(6)}"
        self.out_dir = out_dir
        self.process = start_xlarun(
            *hosts,
            "--nproc-per-node",
            NPROC,
            "--rdzv-id",
            self.run_id,
            "--env",
            f"{JOB_VARIABLE}={self.run_id}",
            *args,
            env=env,
            cwd=out_dir,
        )

    def wait_for_workers(self, count: int = WORKERS) -> list[int]:
        """The pids of ``faults.py``'s ranks once all ``count`` recorded them; fails at once where the
        launcher exits first."""
        paths = [self.out_dir / f"{rank}.pid" for rank in range(count)]
        started = files_exist(*paths)
        wait_for(lambda: started() or self.process.poll() is not None, f"{count} workers on the hosts")
        if not started():
            run = self.finish()
            pytest.fail(f"the launcher exited {run.returncode} before {count} workers started:\n{run.stderr}")
        pids = [int(path.read_text()) for path in paths]
        # What finds the job's survivors finds its workers while they run (a rank told to exit may be gone).
        found = set(job_processes(self.run_id))
        running = [pid for pid in pids if live_environ(pid) is not None]
        assert set(running) <= found, describe(running)
        return pids

    def finish(self) -> Run:
        return finish(self.process)

    def assert_gone_within(self, seconds: float, what: str) -> None:
        """No process of the job alive on any host within ``seconds``."""
        deadline = time.monotonic() + seconds
        while job_processes(self.run_id):
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: still alive {seconds} s later: {describe(job_processes(self.run_id))}")
            time.sleep(0.1)

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL ends a stopped process too
            self.process.communicate()
        kill_all(job_processes(self.run_id))
