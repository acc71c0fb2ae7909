"""``--dry-run``: one JSON object on stdout, the exact plan a launch would run, nothing started.

The plan is compared with what real workers report (``tests/workers/dump_env.py``) on one
node, on two static agents, on two c10d agents, and on a GPU host whose torch_xla has no
XLA:GPU; values only a rendezvous decides must be marked, never shown wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import CONTRACT_VARIABLES, PYTHON, TESTS, finish, free_port, plan, run_xlarun, start_xlarun, worker

from xlarun.planning.device import xla_has_cuda
from xlarun.planning.packages import installed_version

DECIDED = "<decided at rendezvous>"
GPU_HOST = TESTS / "fixtures" / "hosts" / "nvidia-8gpu"

# The plan's keys with their types where every value is known (a single static node).
PLAN_KEYS = {
    "run_id": str,
    "device": str,
    "runtime": str,
    "node_rank": int,
    "nnodes": list,
    "nproc_per_node": int,
    "world_size": int,
    "master_addr": str,
    "master_port": int,
    "rdzv_backend": str,
    "follows_torchrun": str,
    "rdzv_endpoint": str,
    "decided_at_rendezvous": list,
    "notices": list,
    "assumed": list,
    "device_holders": list,
    "env_bytes": int,
    "passed_through": dict,
    "files": dict,
    "workers": list,
}
WORKER_KEYS = {"local_rank": int, "rank": int, "argv": list, "env": dict}


def test_schema_keys_and_types(tmp_path: Path) -> None:
    # A master port given: a lone node without one follows the installed torch (tests/launch/test_torch_releases.py).
    document = plan("--nproc_per_node", "2", "--master_port", "29611", worker("marker.py"), tmp_path / "marker")
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
    document = plan(
        "--nproc_per_node",
        "2",
        "--master_port",
        "29611",
        "--role",
        "trainer",
        "--max_restarts",
        "3",
        "--rdzv_id",
        "job",
        worker("dump_env.py"),
        "--shard",
        "${local_rank}",
        env={"INHERITED_ONLY": "1"},
    )
    assert (document["run_id"], document["world_size"], document["nproc_per_node"]) == ("job", 2, 2)
    assert (document["master_addr"], document["master_port"], document["node_rank"]) == ("127.0.0.1", 29611, 0)
    for local_rank, entry in enumerate(document["workers"]):
        assert (entry["local_rank"], entry["rank"]) == (local_rank, local_rank)
        assert entry["argv"] == [PYTHON, "-u", worker("dump_env.py"), "--shard", str(local_rank)]
        env = entry["env"]
        assert {name: env[name] for name in CONTRACT_VARIABLES} == {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(local_rank),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(local_rank),
            "ROLE_NAME": "trainer",
            "LOCAL_WORLD_SIZE": "2",
            "WORLD_SIZE": "2",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29611",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": "job",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "1",
        }
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
    document = plan(
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "node0.example",
        "--nproc_per_node",
        "2",
        "--log-dir",
        tmp_path,
        worker("dump_env.py"),
    )
    assert (document["node_rank"], document["nnodes"], document["world_size"]) == (1, [2, 2], 4)
    assert [entry["rank"] for entry in document["workers"]] == [2, 3]
    env = document["workers"][1]["env"]
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "2", "node0.example")
    assert env["TORCHELASTIC_ERROR_FILE"] == f"{tmp_path}/none_<random>/attempt_0/1/error.json"


def test_standalone_plan_marks_the_port_and_run_id_it_takes_at_start() -> None:
    document = plan("--standalone", worker("dump_env.py"))
    assert (document["master_addr"], document["master_port"], document["run_id"]) == ("localhost", DECIDED, DECIDED)
    assert {"MASTER_PORT", "TORCHELASTIC_RUN_ID"} <= set(document["decided_at_rendezvous"])


def test_c10d_plan_shows_the_endpoint_and_marks_what_the_rendezvous_decides() -> None:
    document = plan(
        "--nnodes",
        "2:4",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "10.0.0.1:29400",
        "--rdzv_id",
        "job42",
        "--nproc_per_node",
        "8",
        "--device",
        "neuron",
        worker("dump_env.py"),
    )
    assert (document["rdzv_backend"], document["rdzv_endpoint"], document["nnodes"]) == (
        "c10d",
        "10.0.0.1:29400",
        [2, 4],
    )
    for key in ("node_rank", "world_size", "master_addr", "master_port"):
        assert document[key] == DECIDED, key
    env = document["workers"][3]["env"]
    for name in (
        "RANK",
        "WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NEURON_RT_ROOT_COMM_ID",
        "NEURON_PJRT_PROCESS_INDEX",
        "NEURON_PJRT_WORLD_SIZE",
    ):
        assert env[name] == DECIDED and name in document["decided_at_rendezvous"], name
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == ("3", "8", "job42")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert "127.0.0.1" not in json.dumps(document)


def test_c10d_endpoint_defaults_to_the_master_address_and_port_29400() -> None:
    document = plan("--nnodes", "2", "--rdzv_backend", "c10d", "--master_addr", "10.0.0.7", worker("dump_env.py"))
    assert document["rdzv_endpoint"] == "10.0.0.7:29400"


def test_static_endpoint_replaces_the_master_address_on_several_nodes() -> None:
    document = plan("--nnodes", "2", "--node_rank", "1", "--rdzv_endpoint", "10.0.0.9:29444", worker("dump_env.py"))
    assert (document["master_addr"], document["master_port"], document["rdzv_endpoint"]) == (
        "10.0.0.9",
        29444,
        "10.0.0.9:29444",
    )


def test_static_endpoint_on_one_node_is_the_workers_store() -> None:
    """pytorch/examples' run_example.sh: the endpoint is MASTER_ADDR and MASTER_PORT, over --master-port."""
    port = free_port()
    document = plan(
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv_id=101",
        f"--rdzv_endpoint=localhost:{port}",
        "--master_port",
        free_port(),
        worker("dump_env.py"),
    )
    assert (document["master_addr"], document["master_port"], document["rdzv_endpoint"]) == (
        "localhost",
        port,
        f"localhost:{port}",
    )
    assert document["decided_at_rendezvous"] == []
    for entry in document["workers"]:
        assert (entry["env"]["MASTER_ADDR"], entry["env"]["MASTER_PORT"]) == ("localhost", str(port))


def test_c10d_endpoint_at_port_0_marks_the_port_it_takes_at_start() -> None:
    document = plan(
        "--nnodes",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "--rdzv-id",
        "job5",
        worker("dump_env.py"),
    )
    assert (document["master_addr"], document["master_port"], document["run_id"]) == ("localhost", DECIDED, "job5")
    assert "MASTER_PORT" in document["decided_at_rendezvous"]
    assert "TORCHELASTIC_RUN_ID" not in document["decided_at_rendezvous"]


def test_a_coordinator_port_given_is_never_a_stand_in_master_port() -> None:
    for coordinator_port in ("29501", "29502"):
        document = plan(
            "--nnodes",
            "2",
            "--rdzv_backend",
            "c10d",
            "--device",
            "neuron",
            "--coordinator-port",
            coordinator_port,
            worker("dump_env.py"),
        )
        assert document["workers"][0]["env"]["NEURON_RT_ROOT_COMM_ID"] == DECIDED


# ---- the plan printed is the plan run


def planned_value_matches(planned: str, real: str) -> bool:
    """Equal, but for the ``<random>`` part of a log path that the run picks."""
    return re.fullmatch(re.escape(planned).replace(re.escape("<random>"), "[^/]+"), real) is not None


def records(dump_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(dump_dir.glob("*_0.json"))]


def assert_plan_is_run(document: dict[str, Any], ran: list[dict[str, Any]]) -> None:
    """Every worker of one node's plan ran with the planned argv and variables (as it was started with
    them); a value the plan marks as decided at rendezvous is one it names, and one the worker got."""
    assert len(ran) == document["nproc_per_node"]
    planned_workers = {entry["local_rank"]: entry for entry in document["workers"]}
    for record in ran:
        entry = planned_workers[int(record["env"]["LOCAL_RANK"])]
        assert record["command_line"] == entry["argv"]
        started_with = record["exec_env"]
        for name, value in entry["env"].items():
            assert name in started_with, name
            if value == DECIDED:
                assert name in document["decided_at_rendezvous"], name
            else:
                assert planned_value_matches(value, started_with[name]), (name, value, started_with[name])
        if entry["rank"] != DECIDED:
            assert record["env"]["RANK"] == str(entry["rank"])


@pytest.fixture
def dump_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "dump"
    directory.mkdir()
    return directory


@pytest.mark.parametrize("where", [["--master_port", "{port}"], ["--standalone"]], ids=["static", "standalone"])
def test_the_plan_printed_is_the_plan_run(where: list[str], dump_dir: Path, tmp_path: Path, port: int) -> None:
    args = [
        *(flag.format(port=port) for flag in where),
        "--nproc_per_node",
        "2",
        "--role",
        "r",
        "--log-dir",
        tmp_path / "logs",
        worker("dump_env.py"),
        "${local_rank}",
    ]
    env = {"DUMP_DIR": str(dump_dir)}
    document = plan(*args, env=env)
    result = run_xlarun(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert_plan_is_run(document, records(dump_dir))


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_agents_run_what_their_plans_show(backend: str, dump_dir: Path, tmp_path: Path, port: int) -> None:
    def args(node_rank: int) -> list[object]:
        meet = (
            ["--node_rank", node_rank, "--master_addr", "127.0.0.1", "--master_port", port]
            if backend == "static"
            else ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "dry-c10d"]
        )
        return ["--nnodes", "2", *meet, "--nproc_per_node", "2", "--log-dir", tmp_path / "logs", worker("dump_env.py")]

    env = {"DUMP_DIR": str(dump_dir)}
    plans = [plan(*args(node_rank), env=env) for node_rank in (0, 1)]
    agents = [start_xlarun(*args(node_rank), env=env) for node_rank in (0, 1)]
    for result in [finish(agent) for agent in agents]:
        assert result.returncode == 0, result.stderr
    ran = records(dump_dir)
    assert len(ran) == 4
    for document in plans:
        assert document["workers"][0]["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        if backend == "static":
            assert document["decided_at_rendezvous"] == []
            node = [record for record in ran if record["env"]["GROUP_RANK"] == str(document["node_rank"])]
            assert_plan_is_run(document, node)
        else:
            # The two c10d plans are the same: node ranks come from the rendezvous.
            assert document["node_rank"] == DECIDED
            for node_rank in ("0", "1"):
                assert_plan_is_run(document, [record for record in ran if record["env"]["GROUP_RANK"] == node_rank])


@pytest.mark.skipif(
    installed_version("torch_xla") is None or xla_has_cuda(installed_version("torch_xla")),
    reason="needs a torch_xla without XLA:GPU (2.9 or later)",
)
def test_gpu_host_without_xla_gpu_plans_and_runs_on_cpu_and_says_so(dump_dir: Path, tmp_path: Path, port: int) -> None:
    args = ["--nproc_per_node", "2", "--master_port", port, "--log-dir", tmp_path / "logs", worker("dump_env.py")]
    env = {"XLARUN_HOST_ROOT": str(GPU_HOST), "DUMP_DIR": str(dump_dir)}
    dry = run_xlarun("--dry-run", *args, env=env)
    real = run_xlarun(*args, env=env)
    assert dry.returncode == 0 and real.returncode == 0, dry.stderr + real.stderr
    document = json.loads(dry.stdout)
    assert document["device"] == "cpu" and document["workers"][0]["env"]["PJRT_DEVICE"] == "CPU"
    assert_plan_is_run(document, records(dump_dir))
    notice = (
        f"xlarun: this host has 8 NVIDIA GPUs, but torch_xla {installed_version('torch_xla')} has no XLA:GPU "
        "(only 2.2 to 2.8 do): workers get PJRT_DEVICE=CPU, so XLA tensors go to the CPU; plain CUDA and "
        "NCCL code is unaffected"
    )
    assert document["notices"][0] == notice.removeprefix("xlarun: ")
    for stderr in (dry.stderr, real.stderr):
        assert stderr.splitlines().count(notice) == 1, stderr


@pytest.mark.parametrize(
    "flags, device, units, assumed",
    [
        (["--device", "neuron", "--nproc_per_node", "auto"], "neuron", 32, "a trn1.32xlarge (32 NeuronCores)"),
        (["--device", "tpu", "--nproc_per_node", "auto"], "tpu", 4, "a TPU VM host with 4 chips"),
        (["--device", "tpu", "--nproc_per_node", "8"], "tpu", 8, "a TPU VM host with 8 chips"),
        (["--device", "cuda", "--nproc_per_node", "auto"], "cuda", 8, "a host with 8 GPUs"),
    ],
)
def test_a_plan_for_another_machine_says_what_it_assumed(
    flags: list[str], device: str, units: int, assumed: str
) -> None:
    result = run_xlarun("--dry-run", *flags, worker("dump_env.py"))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["device"], document["nproc_per_node"]) == (device, units)
    assert len(document["assumed"]) == 1 and assumed in document["assumed"][0]
    assert f"xlarun: {document['assumed'][0]}" in result.stderr.splitlines()


def test_spmd_on_a_tpu_host_it_cannot_see_plans_the_default_host() -> None:
    document = plan("--spmd", "--device", "tpu", str(TESTS.parent / "examples" / "hf_trainer_fsdp_v2.py"))
    env = document["workers"][0]["env"]
    assert (env["TPU_VISIBLE_CHIPS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"], env["TPU_PROCESS_BOUNDS"]) == (
        "0,1,2,3",
        "2,2,1",
        "1,1,1",
    )
    assert "TPU_HOST_BOUNDS" in document["assumed"][0]


def test_nothing_is_assumed_where_the_host_or_the_flags_say_it() -> None:
    assert plan("--device", "neuron", "--nproc_per_node", "4", worker("dump_env.py"))["assumed"] == []
    slice_env = {"TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}
    assert plan("--spmd", "--device", "tpu", "--nnodes", "2", worker("dump_env.py"), env=slice_env)["assumed"] == [
        "ranks and world size assume every node runs as many workers as this one (1); the rendezvous adds up the "
        "nodes' real counts"
    ]
