"""A real two-node Slurm cluster on this machine for the tests, started by ``scripts/slurm-cluster.sh``.

``slurm_cluster()`` starts the cluster once per test session (the script leaves one that already
runs alone) and returns the environment to run ``srun`` in: this process's environment without
any Slurm job or step variables, plus ``SLURM_CONF`` pointing at the cluster's configuration.

Where this machine cannot host the cluster (not root, packages not installable) the calling test
is skipped with the reason, except under CI (the ``CI`` variable set and not empty), where any
failure to start fails the test: CI machines are meant to run it. Any other failure to start is a
failure everywhere. The cluster keeps running after the session, so a later or concurrent session
finds it ready; ``scripts/slurm-cluster.sh stop`` ends it.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "slurm-cluster.sh"
# The script's exit status when this machine cannot host the cluster.
CANNOT_HOST = 3
# Installing the packages and waiting for the nodes take well under this; it only stops a hang.
START_TIMEOUT_S = 240
# Variables Slurm sets inside a job or reads as srun/sbatch/salloc defaults: inherited from a test
# session that itself runs under Slurm, they would tie the test's srun to that other job.
OUTER_SLURM_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_")


class _Outcome(NamedTuple):
    env: Optional[dict[str, str]]
    skip_reason: str = ""
    failure: str = ""


def slurm_cluster() -> dict[str, str]:
    """Start the test cluster if needed; the environment whose ``SLURM_CONF`` points at it."""
    outcome = _start_once()
    if outcome.env is not None:
        return dict(outcome.env)
    if outcome.skip_reason and not os.environ.get("CI"):
        pytest.skip(outcome.skip_reason)
    pytest.fail(f"the Slurm test cluster did not start: {outcome.failure or outcome.skip_reason}", pytrace=False)


@functools.lru_cache(maxsize=None)
def _start_once() -> _Outcome:
    if os.geteuid() != 0:
        return _Outcome(None, skip_reason="the Slurm test cluster needs root (its daemons run as root)")
    try:
        started = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        return _Outcome(None, failure=f"{SCRIPT.name} start still running after {START_TIMEOUT_S} s:\n"
                                      f"{_text(timeout.stderr)}")
    if started.returncode == CANNOT_HOST:
        return _Outcome(None, skip_reason=_last_line(started.stderr))
    if started.returncode != 0:
        return _Outcome(None, failure=f"{SCRIPT.name} start exited {started.returncode}:\n{started.stderr}")
    name, _, conf = started.stdout.strip().partition("=")
    if name != "SLURM_CONF" or not conf:
        return _Outcome(None, failure=f"{SCRIPT.name} start printed {started.stdout!r}, not SLURM_CONF=<path>")
    env = {name: value for name, value in os.environ.items() if not name.startswith(OUTER_SLURM_PREFIXES)}
    env["SLURM_CONF"] = conf
    return _Outcome(env)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no reason given"


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
