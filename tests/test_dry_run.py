"""``--dry-run``: one JSON object on stdout, the exact plan a launch would run, nothing started."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from conftest import CONTRACT_VARIABLES, PYTHON, plan, run_xlarun, worker

# Later issues may add keys; these are the ones issue 2 fixes, with their types.
PLAN_KEYS = {"run_id": str, "device": str, "runtime": str, "node_rank": int, "nnodes": list,
             "nproc_per_node": int, "world_size": int, "master_addr": str, "master_port": int, "env_bytes": int,
             "workers": list}
WORKER_KEYS = {"local_rank": int, "rank": int, "argv": list, "env": dict}


def test_schema_keys_and_types(tmp_path: Path) -> None:
    document = plan("--nproc_per_node", "2", worker("marker.py"), tmp_path / "marker")
    assert set(document) == set(PLAN_KEYS)
    for key, kind in PLAN_KEYS.items():
        assert type(document[key]) is kind, key
    assert document["nnodes"] == [1, 1]
    for entry in document["workers"]:
        assert set(entry) == set(WORKER_KEYS)
        for key, kind in WORKER_KEYS.items():
            assert type(entry[key]) is kind, key
        assert all(type(part) is str for part in entry["argv"])
        assert all(type(name) is str and type(value) is str for name, value in entry["env"].items())


def test_nothing_is_started(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run_xlarun("--dry-run", "--nproc_per_node", "2", worker("marker.py"), marker)
    assert result.returncode == 0
    assert not marker.exists()
    assert not list(tmp_path.iterdir())


def test_workers_argv_and_contract_env(tmp_path: Path) -> None:
    document = plan("--nproc_per_node", "2", "--master_port", "29611", "--role", "trainer", "--max_restarts", "3",
                    "--rdzv_id", "job", worker("dump_env.py"), "--shard", "${local_rank}",
                    env={"INHERITED_ONLY": "1"})
    assert (document["run_id"], document["world_size"], document["nproc_per_node"]) == ("job", 2, 2)
    assert (document["master_addr"], document["master_port"], document["node_rank"]) == ("127.0.0.1", 29611, 0)
    for local_rank, entry in enumerate(document["workers"]):
        assert (entry["local_rank"], entry["rank"]) == (local_rank, local_rank)
        assert entry["argv"] == [PYTHON, "-u", worker("dump_env.py"), "--shard", str(local_rank)]
        env = entry["env"]
        assert {name: env[name] for name in CONTRACT_VARIABLES} == {
            "LOCAL_RANK": str(local_rank), "RANK": str(local_rank), "GROUP_RANK": "0", "ROLE_RANK": str(local_rank),
            "ROLE_NAME": "trainer", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job",
            "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1"}
        assert env["TORCHELASTIC_ERROR_FILE"] == f"<log_dir>/job_<random>/attempt_0/{local_rank}/error.json"
        # Only what xlarun sets or changes: the inherited rest stays out.
        assert "INHERITED_ONLY" not in env and "PATH" not in env


def test_module_and_no_python_argv() -> None:
    module = plan("-m", "package.train", "--lr", "1")
    assert module["workers"][0]["argv"] == [PYTHON, "-u", "-m", "package.train", "--lr", "1"]
    direct = plan("--no-python", "/bin/echo", "hello")
    assert direct["workers"][0]["argv"] == ["/bin/echo", "hello"]


def test_another_nodes_plan_needs_no_other_node(tmp_path: Path) -> None:
    """Node 1 of 2 is planned from the flags alone, without waiting for a rendezvous."""
    document = plan("--nnodes", "2", "--node_rank", "1", "--master_addr", "node0.example", "--nproc_per_node", "2",
                    "--log-dir", tmp_path, worker("dump_env.py"))
    assert (document["node_rank"], document["nnodes"], document["world_size"]) == (1, [2, 2], 4)
    assert [entry["rank"] for entry in document["workers"]] == [2, 3]
    env = document["workers"][1]["env"]
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "2", "node0.example")
    assert env["TORCHELASTIC_ERROR_FILE"] == f"{tmp_path}/none_<random>/attempt_0/1/error.json"


def test_standalone_plan() -> None:
    document = plan("--standalone", worker("dump_env.py"))
    assert document["master_addr"] == "localhost"
    assert str(uuid.UUID(document["run_id"])) == document["run_id"]


def test_the_plan_printed_is_the_plan_run(tmp_path: Path, port: int) -> None:
    args = ["--nproc_per_node", "2", "--master_port", str(port), "--role", "r", worker("dump_env.py"), "${local_rank}"]
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()
    env = {"DUMP_DIR": str(dump_dir)}
    document = plan(*args, env=env)
    result = run_xlarun(*args, env=env)
    assert result.returncode == 0, result.stderr
    for entry in document["workers"]:
        ran = json.loads((dump_dir / f"{entry['rank']}_0.json").read_text())
        assert ran["command_line"] == entry["argv"]
        planned = {name: value for name, value in entry["env"].items() if name != "TORCHELASTIC_ERROR_FILE"}
        assert {name: ran["env"].get(name) for name in planned} == planned
