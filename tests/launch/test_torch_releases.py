"""xlarun follows the installed torch's torchrun where releases differ, and needs no torch for one node.

- With torch 2.12 or newer (or none), a lone node given no master port runs on a free port with a
  fresh run id, as torchrun does since 2.12: two such jobs side by side both run, whoever holds
  29500. With torch 2.9 to 2.11 such a node takes 29500, as before. The dry run says which
  torchrun it follows. Each test stack checks its own release's behaviour.
- A Python with xlarun and click alone runs a single node and refuses several in one line.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from helpers import PYTHON, REPO, XLARUN, clean_env, free_port, plan, run_command, worker

from xlarun.config import DEFAULT_MASTER_PORT
from xlarun.planning.packages import LONE_NODE_ON_A_FREE_PORT, followed_torchrun

TORCHRUN = followed_torchrun()


@pytest.fixture
def default_port_held() -> Iterator[None]:
    """29500 held while the test runs: by this test, or already by someone else."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DEFAULT_MASTER_PORT))
        holder.listen()
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
    try:
        yield
    finally:
        holder.close()


def test_the_dry_run_names_the_torchrun_it_follows() -> None:
    assert plan("--nproc_per_node", "1", "t.py")["follows_torchrun"] == ".".join(map(str, TORCHRUN))


@pytest.mark.skipif(TORCHRUN < LONE_NODE_ON_A_FREE_PORT, reason="torchrun before 2.12 keeps 29500 for a lone node")
def test_two_lone_nodes_without_a_master_port_run_side_by_side(tmp_path: Path, default_port_held: None) -> None:
    for job in range(2):
        (tmp_path / str(job)).mkdir()
    launchers = [
        subprocess.Popen(
            [*XLARUN, "--nproc_per_node", "2", worker("dump_env.py")],
            env=clean_env({"DUMP_DIR": str(tmp_path / str(job))}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in range(2)
    ]
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, stderr
    seen = [[json.loads(path.read_text()) for path in sorted((tmp_path / str(job)).glob("*.json"))] for job in range(2)]
    ports = {record["env"]["MASTER_PORT"] for job in seen for record in job}
    run_ids = {record["env"]["TORCHELASTIC_RUN_ID"] for job in seen for record in job}
    assert len(ports) == 2 and str(DEFAULT_MASTER_PORT) not in ports
    assert len(run_ids) == 2 and "none" not in run_ids


@pytest.mark.skipif(TORCHRUN >= LONE_NODE_ON_A_FREE_PORT, reason="torchrun 2.12 and newer picks a free port")
def test_a_lone_node_without_a_master_port_takes_29500_before_torch_2_12(default_port_held: None) -> None:
    assert plan("--nproc_per_node", "2", "t.py")["master_port"] == DEFAULT_MASTER_PORT


def test_a_master_port_given_by_variable_keeps_the_static_node() -> None:
    planned = plan("--nproc_per_node", "1", "t.py", env={"PET_MASTER_PORT": "29511"})
    assert (planned["master_port"], planned["rdzv_backend"]) == (29511, "static")


@pytest.fixture
def click_only_python(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The base interpreter with xlarun and click on its path, and no torch."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "click").symlink_to(Path(click.__file__).parent)
    env = {"PYTHONPATH": f"{REPO}:{site}"}
    python = getattr(sys, "_base_executable", PYTHON)
    if run_command([python, "-c", "import torch"], env=env).returncode == 0:
        pytest.skip(f"{python} has torch of its own")
    return python, env


def test_a_click_only_install_runs_one_node_and_refuses_several(
    tmp_path: Path, click_only_python: tuple[str, dict[str, str]]
) -> None:
    python, env = click_only_python
    alone = run_command(
        [python, "-m", "xlarun", "--standalone", "--nproc_per_node", "2", worker("marker.py"), str(tmp_path / "alone")],
        env=env,
    )
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "alone").exists()
    several = run_command(
        [
            python,
            "-m",
            "xlarun",
            "--nnodes",
            "2",
            "--master_port",
            str(free_port()),
            worker("marker.py"),
            str(tmp_path / "several"),
        ],
        env=env,
    )
    assert several.returncode == 2
    assert several.stderr.splitlines() == [
        "xlarun: error: several nodes meet through torch.distributed, which is "
        "not installed in this Python: pip install 'xlarun[multinode]' (or torch)"
    ]
    assert not (tmp_path / "several").exists()
