"""The same invocations under torchrun and xlarun give every worker the same contract.

A worker dumps its environment, argv, command line and cwd; everything must match except
values that are random by design (the error file's random directory part, ``--standalone``'s
port and run id) and the documented differences: ``TORCHELASTIC_USE_AGENT_STORE`` (torchrun's
single node serves a store, xlarun's does not) and the XLA runtime variables xlarun adds.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest
from helpers import CONTRACT_VARIABLES, PYTHON, WORKERS, free_port, run_xlarun, worker
from parity import assert_same_contract, launch_both


def dump_script_for_no_python(directory: Path) -> str:
    """dump_env.py as an executable that runs without ``python`` in front of it."""
    program = directory / "dump_env_program"
    program.write_text(f"#!{PYTHON}\n" + (WORKERS / "dump_env.py").read_text())
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return str(program)


def invocations(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    script = worker("dump_env.py")
    port = str(free_port())
    # Invocations without --master_port get it from PET_MASTER_PORT: torchrun's node serves a
    # store there, and a fixed 29500 would collide with anything else on this host.
    pet_port = {"PET_MASTER_PORT": port}
    return {
        "nproc 2": (["--nproc_per_node", "2", script], pet_port),
        "one node, explicit": (
            ["--nnodes", "1", "--node_rank", "0", "--master_port", port, "--nproc-per-node", "2", script, "a", "b"],
            {},
        ),
        "role, run id, restarts": (
            ["--role", "trainer", "--rdzv_id", "job7", "--max_restarts", "2", "--nproc_per_node", "2", script],
            pet_port,
        ),
        "module": (
            ["-m", "--nproc_per_node", "2", "dump_env", "--flag", "x"],
            {**pet_port, "PYTHONPATH": str(WORKERS)},
        ),
        "no python": (["--no-python", "--nproc_per_node", "2", dump_script_for_no_python(tmp_path), "z"], pet_port),
        "local_rank substitution and launcher-looking args": (
            [
                "--nproc_per_node",
                "2",
                script,
                "--shard=${local_rank}",
                "out_${local_rank}.txt",
                "--nproc-per-node=3",
                "-m",
                "--help",
            ],
            pet_port,
        ),
        "leading double dash": (["--nproc_per_node", "2", "--", script, "--", "kept"], pet_port),
        "relative script, one worker": (
            ["--nproc_per_node", "1", os.path.relpath(script, tmp_path / "work")],
            pet_port,
        ),
        "user's OMP and NCCL values": (
            ["--nproc_per_node", "2", script],
            {**pet_port, "OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
        ),
        "PET_NPROC_PER_NODE": ([script], {**pet_port, "PET_NPROC_PER_NODE": "2"}),
        # pytorch/examples' distributed/ddp/run_example.sh: the endpoint names the workers' store.
        "static endpoint, one node": (
            ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", f"--rdzv_endpoint=localhost:{port}", script],
            {},
        ),
        "static endpoint over a master port": (
            [
                "--nnodes",
                "1",
                "--master_port",
                str(free_port()),
                "--rdzv_endpoint",
                f"localhost:{port}",
                "--nproc_per_node",
                "2",
                script,
            ],
            {},
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "nproc 2",
        "one node, explicit",
        "role, run id, restarts",
        "module",
        "no python",
        "local_rank substitution and launcher-looking args",
        "leading double dash",
        "relative script, one worker",
        "user's OMP and NCCL values",
        "PET_NPROC_PER_NODE",
        "static endpoint, one node",
        "static endpoint over a master port",
    ],
)
def test_workers_get_torchruns_contract(tmp_path: Path, case: str) -> None:
    args, env = invocations(tmp_path)[case]
    torchrun, xlarun = launch_both(tmp_path, args, env)
    assert_same_contract(torchrun, xlarun)


def test_contract_values_of_a_plain_two_worker_launch(tmp_path: Path) -> None:
    """Beyond agreeing with torchrun, the values are the documented ones."""
    port = free_port()
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        worker("dump_env.py"),
        env={"DUMP_DIR": str(dump_dir)},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        env = json.loads((dump_dir / f"{rank}_0.json").read_text())["env"]
        assert {key: env[key] for key in CONTRACT_VARIABLES} == {
            "LOCAL_RANK": str(rank),
            "RANK": str(rank),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_NAME": "default",
            "LOCAL_WORLD_SIZE": "2",
            "WORLD_SIZE": "2",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "1",
        }
    # torchrun's rule comes with its one-line notice.
    notices = [line for line in result.stderr.splitlines() if "OMP_NUM_THREADS" in line]
    assert len(notices) == 1


def test_one_worker_gets_no_omp_threads_and_no_notice(tmp_path: Path, port: int) -> None:
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()
    result = run_xlarun("--master_port", port, worker("dump_env.py"), env={"DUMP_DIR": str(dump_dir)})
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS" not in json.loads((dump_dir / "0_0.json").read_text())["env"]
    assert "OMP_NUM_THREADS" not in result.stderr


def test_standalone_shapes_match_torchrun(tmp_path: Path) -> None:
    """A free port on localhost and a fresh uuid run id under both launchers."""
    torchrun, xlarun = launch_both(tmp_path, ["--standalone", "--nproc_per_node", "2", worker("dump_env.py")], {})
    assert_same_contract(torchrun, xlarun, also_random=("MASTER_PORT", "TORCHELASTIC_RUN_ID"))
    for dumps in (torchrun, xlarun):
        envs = [dump["env"] for dump in dumps.values()]
        assert {env["MASTER_ADDR"] for env in envs} == {"localhost"}
        ports = {env["MASTER_PORT"] for env in envs}
        assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
        run_ids = {env["TORCHELASTIC_RUN_ID"] for env in envs}
        assert len(run_ids) == 1
        run_id = run_ids.pop()
        assert str(uuid.UUID(run_id)) == run_id
    assert {d["env"]["TORCHELASTIC_RUN_ID"] for d in xlarun.values()} != {
        d["env"]["TORCHELASTIC_RUN_ID"] for d in torchrun.values()
    }


def test_c10d_at_port_0_shapes_match_torchrun(tmp_path: Path) -> None:
    """What ``--standalone`` expands to, written out: the store takes a free port on the endpoint's host."""
    torchrun, xlarun = launch_both(
        tmp_path,
        [
            "--nnodes",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "--rdzv-id",
            "job5",
            "--nproc_per_node",
            "2",
            worker("dump_env.py"),
        ],
        {},
    )
    assert_same_contract(torchrun, xlarun, also_random=("MASTER_PORT",))
    for dumps in (torchrun, xlarun):
        ports = {dump["env"]["MASTER_PORT"] for dump in dumps.values()}
        assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
        assert {dump["env"]["TORCHELASTIC_RUN_ID"] for dump in dumps.values()} == {"job5"}
