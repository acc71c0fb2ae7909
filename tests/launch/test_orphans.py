"""No process a launch started outlives it: grandchildren, exited workers' children, a launcher killed
with SIGKILL alone, with its whole process group, or by a `pkill -f` of its command line."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import (
    WAIT_TIMEOUT_S,
    XLARUN,
    clean_env,
    files_exist,
    finish,
    is_alive,
    kill_all,
    read_pid,
    run_xlarun,
    slack_s,
    start_xlarun,
    wait_for,
    worker,
)

from xlarun.supervision.guard import GUARD_TITLE, OrphanGuard


def pids(out_dir: Path, suffix: str) -> list[int]:
    return [read_pid(out_dir / f"{rank}.{suffix}") for rank in (0, 1)]


@pytest.mark.parametrize("mode, exit_code", [("exit-then-fail", 1), ("exit", 0)], ids=["failure", "success"])
def test_grandchildren_of_exited_workers_are_torn_down(out_dir: Path, port: int, mode: str, exit_code: int) -> None:
    """Workers exit leaving a child each (on failure: rank 0 exits 0, then rank 1 fails): no grandchild survives xlarun."""
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("grandchild.py"), out_dir, mode)
    grandchildren = pids(out_dir, "grandchild")
    try:
        assert result.returncode == exit_code, result.stderr
        assert [pid for pid in grandchildren if is_alive(pid)] == []
    finally:
        kill_all(grandchildren)


def test_grandchildren_are_torn_down_when_the_launcher_is_stopped(out_dir: Path, port: int) -> None:
    launcher = start_xlarun("--nproc_per_node", "2", "--master_port", port, worker("grandchild.py"), out_dir, "wait")
    wait_for(files_exist(*(out_dir / f"{rank}.ready" for rank in (0, 1))), "workers and their children")
    launched = pids(out_dir, "ready") + pids(out_dir, "grandchild")
    try:
        launcher.send_signal(signal.SIGTERM)
        assert finish(launcher).returncode == 128 + signal.SIGTERM
        assert [pid for pid in launched if is_alive(pid)] == []
    finally:
        kill_all(launched)


def kill_launcher(launcher: subprocess.Popen, mode: str, token: str) -> None:
    """SIGKILL as each way of killing a launcher does it."""
    if mode == "launcher":
        launcher.kill()
    elif mode == "process-group":
        os.killpg(launcher.pid, signal.SIGKILL)
    else:
        # `pkill -9 -f xlarun`, narrowed by a token on this launcher's command line so that other
        # launches on the machine are left alone; workers and the guard match only if they name xlarun.
        subprocess.run(["pkill", "-9", "-f", f"xlarun.*{token}"], check=True)


@pytest.mark.parametrize("mode", ["launcher", "process-group", "pkill-f"])
def test_nothing_outlives_a_launcher_killed_with_sigkill(out_dir: Path, port: int, mode: str) -> None:
    """torchrun orphans its workers here. xlarun's guard, outside the launcher's session and under
    another name, kills every worker's group: workers and grandchildren are gone within a second."""
    token = f"orphans-{uuid.uuid4().hex}"
    # `setsid xlarun ...`: the launcher leads a process group of its own, as under job control or timeout.
    launcher = subprocess.Popen(
        [
            *XLARUN,
            "--rdzv_id",
            token,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            worker("grandchild.py"),
            str(out_dir),
            "wait",
        ],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(files_exist(*(out_dir / f"{rank}.ready" for rank in (0, 1))), "workers and their children")
    launched = pids(out_dir, "ready") + pids(out_dir, "grandchild")
    [guard] = [child.pid for child in psutil.Process(launcher.pid).children() if child.pid not in launched]
    launched.append(guard)
    try:
        assert all(is_alive(pid) for pid in launched)
        within = slack_s(1.0)  # a second, in this machine's time
        kill_launcher(launcher, mode, token)
        wait_for(
            lambda: not any(is_alive(pid) for pid in launched), "every worker, grandchild and the guard to die", within
        )
        assert finish(launcher).returncode == -signal.SIGKILL
    finally:
        kill_all(launched)


def test_the_guard_stands_apart_from_the_launcher() -> None:
    """What the kill modes rely on: its own session and group, a name without the launcher's, and
    a clean exit when released."""
    guard = OrphanGuard().start()
    try:
        guard.wait_ready()
        assert os.getsid(guard.pid) == os.getpgid(guard.pid) == guard.pid != os.getsid(0)
        command = Path(f"/proc/{guard.pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        assert command == f"{GUARD_TITLE} {os.getpid()}".encode()
        assert Path(f"/proc/{guard.pid}/comm").read_text().strip() == GUARD_TITLE
    finally:
        guard.release()
    assert not is_alive(guard.pid)


GUARDED_LAUNCHER = """
import os, signal, subprocess, sys, time
from xlarun.supervision.guard import OrphanGuard

guard = OrphanGuard().start()
guard.wait_ready()
enlisted, unlisted = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=enlist)
                      for enlist in (guard.enlist, None))
gone = subprocess.Popen(["true"], start_new_session=True, preexec_fn=guard.enlist)
gone.wait()
guard.prune()
print(enlisted.pid, unlisted.pid, guard.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_guard_kills_the_groups_that_enlisted_and_nothing_else() -> None:
    """A worker enlists itself before its exec; a group that is gone leaves the list, so a later
    process that reuses its number is safe; a process that did not enlist is left alone."""
    completed = subprocess.run(
        [sys.executable, "-c", GUARDED_LAUNCHER], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    enlisted, unlisted, guard = map(int, completed.stdout.split())
    try:
        assert completed.returncode == -signal.SIGKILL, completed.stderr
        # The guard kills every group it lists, then exits: once it is gone, it has spared whatever it will spare.
        wait_for(lambda: not is_alive(guard), "the guard to act and exit")
        wait_for(lambda: not is_alive(enlisted), "the enlisted group to die")
        assert is_alive(unlisted)
    finally:
        kill_all([enlisted, unlisted])


RUN_MARKER = "ORPHANS_TEST_RUN"
"""Set in a test launcher's environment, so every process it started carries it: found by it, not by name."""


def marked(token: str) -> list[int]:
    """Live processes whose environment carries ``RUN_MARKER=token``."""
    needle = f"{RUN_MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and is_alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def children(pid: int) -> int:
    """How many children a process has (the kernel's list, read without a scan of /proc)."""
    try:
        return len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return 0


def test_no_worker_outlives_a_launcher_killed_during_start_up(port: int) -> None:
    """50 launches of 16 workers, each launcher SIGKILLed at a random moment while it starts its
    workers (once it has a random number of them, whatever this machine's speed): the guard
    learns of each worker before its program starts, so nothing survives any of them."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("the kernel does not list a process's children in /proc")
    rng = random.Random()
    survivors: dict[str, list[int]] = {}
    for _ in range(50):
        token = uuid.uuid4().hex
        started = rng.randint(1, 16)
        launcher = subprocess.Popen(
            [*XLARUN, "--nproc_per_node", "16", "--master_port", str(port), "--no-python", "sleep", "600"],
            env=clean_env({RUN_MARKER: token}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30.0
        # The guard is the launcher's first child; the workers follow.
        while children(launcher.pid) < 1 + started and launcher.poll() is None and time.monotonic() < deadline:
            pass
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while (left := marked(token)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            survivors[token] = left
            kill_all(left)
    assert survivors == {}, f"{len(survivors)} of 50 launches left {sum(map(len, survivors.values()))} processes"


NEXT_PID = Path("/proc/sys/kernel/ns_last_pid")
# Rank 0 ends at once; rank 1 fails once told to (``go``), or runs until its launcher is gone.
EARLY_EXIT = [
    "--no-python",
    "sh",
    "-c",
    'echo $$ > "$0/$RANK.pid"; [ "$RANK" = 0 ] && exit 0; while [ ! -e "$0/go" ]; do sleep 0.05; done; exit 3',
]


def start_with_pid(pid: int) -> subprocess.Popen:
    """A process of its own session, so leading a process group numbered ``pid``: the kernel hands out the number after
    ``ns_last_pid`` to the next process, as it does once its pids wrap around (32768 of them by default)."""
    if not os.access(NEXT_PID, os.W_OK):
        pytest.skip(f"{NEXT_PID} is not writable here (it takes root), to start a process with a chosen pid")
    for _ in range(100):  # another process of the machine may take the number first
        NEXT_PID.write_text(str(pid - 1))
        bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
        if bystander.pid == pid:
            return bystander
        bystander.kill()
        bystander.wait()
    pytest.fail(f"could not start a process with pid {pid}")


@pytest.mark.parametrize("end", ["teardown", "launcher killed"])
def test_the_number_of_a_group_that_emptied_is_not_signalled_once_another_process_took_it(
    out_dir: Path, port: int, end: str
) -> None:
    """Rank 0's group empties when it exits; a bystander then takes its number. Neither the teardown that rank 1's
    failure starts nor the orphan guard of a launcher killed with SIGKILL signals that number again."""
    launcher = start_xlarun("--nproc-per-node", "2", "--master-port", port, *EARLY_EXIT, out_dir)
    bystander = None
    try:
        wait_for(files_exist(out_dir / "0.pid", out_dir / "1.pid"), "both workers to start")
        early, running = read_pid(out_dir / "0.pid"), read_pid(out_dir / "1.pid")
        wait_for(lambda: not os.path.exists(f"/proc/{early}"), "rank 0 to end and be reaped")
        bystander = start_with_pid(early)
        if end == "teardown":
            (out_dir / "go").touch()
            assert finish(launcher).returncode == 3
        else:
            launcher.kill()
            launcher.wait()
            wait_for(lambda: not is_alive(running), "the orphan guard to end rank 1")
        assert bystander.poll() is None, f"the bystander was killed by {signal.Signals(-bystander.returncode).name}"
    finally:
        kill_all([launcher.pid] + ([] if bystander is None else [bystander.pid]))
        if bystander is not None:
            bystander.wait()
