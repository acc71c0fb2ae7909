"""A real two-node Slurm cluster on this machine for the tests, started by ``scripts/slurm-cluster.sh``.

``slurm_cluster()`` is a context manager: it starts the cluster (the script reuses one that
already runs healthy with the current configuration) and gives the environment to run ``srun``
in: this process's environment without any Slurm job or step variables, plus ``SLURM_CONF``
pointing at the cluster's configuration. On exit it stops the cluster, unless another test
session still uses it; the last session out stops it. Each session holds a shared lock on
``sessions.lock`` in the cluster's state directory while it uses the cluster, and stops the
cluster only if it can then take that lock exclusively. The kernel drops the lock of a session
that dies, so a cluster left by a killed session is reused and stopped by the next one.

Where this machine cannot host the cluster (not root, packages not installable) the calling test
is skipped with the reason, except under CI (the ``CI`` variable set and not empty), where any
failure to start fails the test: CI machines are meant to run it. Any other failure to start is a
failure everywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, NoReturn

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "slurm-cluster.sh"
# The script's state directory: its default unless XLARUN_SLURM_DIR names another, as in the script.
STATE_DIR = Path(os.environ.get("XLARUN_SLURM_DIR") or "/var/tmp/xlarun-slurm")
SESSIONS_LOCK = STATE_DIR / "sessions.lock"
# The script's exit status when this machine cannot host the cluster.
CANNOT_HOST = 3
# Installing the packages and waiting for the nodes take well under this; it only stops a hang.
START_TIMEOUT_S = 240
# Cancelling jobs and ending four daemons, each given ten seconds after SIGTERM, take less.
STOP_TIMEOUT_S = 120
# Variables Slurm sets inside a job or reads as srun/sbatch/salloc defaults: inherited from a test
# session that itself runs under Slurm, they would tie the test's srun to that other job.
OUTER_SLURM_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_")


@contextlib.contextmanager
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Start the test cluster if needed, give the environment whose ``SLURM_CONF`` points at it,
    and stop it afterwards unless another session uses it."""
    if os.geteuid() != 0:
        _cannot_host("the Slurm test cluster needs root (its daemons run as root)")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(SESSIONS_LOCK, "a") as sessions:
        _join(sessions)
        try:
            yield _start()
        finally:
            _stop_unless_in_use(sessions)


def _start() -> dict[str, str]:
    try:
        started = subprocess.run(
            [str(SCRIPT), "start"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as timeout:
        _failed(f"{SCRIPT.name} start still running after {START_TIMEOUT_S} s:\n{_text(timeout.stderr)}")
    if started.returncode == CANNOT_HOST:
        _cannot_host(_last_line(started.stderr))
    if started.returncode != 0:
        _failed(f"{SCRIPT.name} start exited {started.returncode}:\n{started.stderr}")
    name, _, conf = started.stdout.strip().partition("=")
    if name != "SLURM_CONF" or not conf:
        _failed(f"{SCRIPT.name} start printed {started.stdout!r}, not SLURM_CONF=<path>")
    env = {name: value for name, value in os.environ.items() if not name.startswith(OUTER_SLURM_PREFIXES)}
    env["SLURM_CONF"] = conf
    return env


def _stop_unless_in_use(sessions: IO[str]) -> None:
    """Stop the cluster if no other session holds the sessions lock; otherwise leave it to them."""
    try:
        fcntl.flock(sessions, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    try:
        stopped = subprocess.run(
            [str(SCRIPT), "stop"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=STOP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(
            f"{SCRIPT.name} stop still running after {STOP_TIMEOUT_S} s:\n{_text(timeout.stderr)}", pytrace=False
        )
    if stopped.returncode != 0:
        pytest.fail(f"{SCRIPT.name} stop exited {stopped.returncode}:\n{stopped.stderr}", pytrace=False)


def _join(sessions: IO[str]) -> None:
    """Take the shared sessions lock, waiting while the last session of an earlier run is stopping
    the cluster (it holds the lock exclusively until the daemons are gone)."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while True:
        try:
            fcntl.flock(sessions, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                _failed(f"{SESSIONS_LOCK} still held by a session stopping the cluster after {STOP_TIMEOUT_S} s")
            time.sleep(0.2)


def _cannot_host(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        _failed(reason)
    pytest.skip(reason)


def _failed(reason: str) -> NoReturn:
    pytest.fail(f"the Slurm test cluster did not start: {reason}", pytrace=False)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no reason given"


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
