"""A newcomer's first minutes: scripts/setup-venv.sh says what it does, step by step, and
scripts/demo.sh ends by saying how to run xlarun.

The scripts run for real in a copy of the checkout's scripts and pins whose ``.venv/bin/python``
is a stand-in that records each pip command line, so nothing is downloaded; the demo's
``.venv/bin/xlarun`` is the real launcher. (The README's first Quick start lines are run in
test_readme.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, XLARUN, Run, run_command

STAND_IN_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../pip-calls"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The scripts and pins of the checkout, and a .venv whose python records what it is asked."""
    for name in ("pyproject.toml", "constraints.txt", "constraints-next.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "scripts").mkdir()
    for name in ("setup-venv.sh", "pip-retries.sh", "demo.sh"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(STAND_IN_PYTHON)
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "xlarun").write_text(f'#!/bin/sh\nexec {" ".join(XLARUN)} "$@"\n')
    (bin_dir / "xlarun").chmod(0o755)
    return tmp_path


def pip_calls(checkout: Path) -> list[str]:
    calls = checkout / ".venv" / "pip-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def setup(checkout: Path) -> Run:
    return run_command([str(checkout / "scripts" / "setup-venv.sh")], cwd=checkout)


def test_setup_says_each_step_what_it_installs_and_its_size(checkout: Path) -> None:
    result = setup(checkout)
    assert result.returncode == 0, result.stderr
    steps = result.stdout.splitlines()
    assert steps[0] == "setup-venv.sh: upgrading pip in .venv"
    assert steps[1].startswith("setup-venv.sh: installing xlarun (editable) with torch 2.9.0, torch_xla 2.9.0, ")
    assert "about 7.4 GB in .venv" in steps[1] and "minutes" in steps[1]
    assert steps[2:] == ["setup-venv.sh: .venv is ready"]
    # Read by a pipe (a CI log), pip's own lines are left out.
    [upgrade, install, *_] = pip_calls(checkout)
    assert "--quiet" in upgrade.split() and "--quiet" in install.split()

    again = setup(checkout)
    assert again.stdout == (
        "setup-venv.sh: .venv is up to date (pyproject.toml and constraints.txt unchanged since it was installed)\n"
    )
    assert len(pip_calls(checkout)) == 2  # nothing installed again


def test_setup_on_a_terminal_lets_pip_show_its_progress(checkout: Path) -> None:
    leader, follower = os.openpty()
    try:
        completed = subprocess.run(
            [str(checkout / "scripts" / "setup-venv.sh")],
            cwd=checkout,
            stdout=follower,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert completed.returncode == 0, completed.stderr
    [upgrade, install, *_] = pip_calls(checkout)
    assert "--quiet" in upgrade.split()  # one short step
    assert "--quiet" not in install.split()  # the long one: pip's lines and download bars


def test_demo_launches_and_ends_saying_how_to_run_xlarun(checkout: Path) -> None:
    setup(checkout)
    result = run_command([str(checkout / "scripts" / "demo.sh")], cwd=checkout)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(line.split(" host=")[0] for line in lines if "]:rank=" in line) == [
        "[default0]:rank=0 world=2 sum=1",
        "[default1]:rank=1 world=2 sum=1",
    ]
    last = lines[-1]
    assert last.startswith("demo.sh: xlarun is .venv/bin/xlarun, not on your PATH")
    assert "'source .venv/bin/activate'" in last
