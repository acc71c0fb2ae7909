"""torch_xla 2.9's own TPU and Neuron set-up, run on the environment xlarun plans, keeps xlarun's values.

One subprocess imports torch_xla once and, for each scenario, replaces its environment
with a worker's (torchrun's variables + the slice's metadata + xlarun's), then runs
the configuration hooks torch_xla itself runs for a torchrun worker:

- TPU: the TPU plugin's ``configure_multiprocess`` (``xla://`` with several local
  processes) or ``configure_single_process`` (one local process), from
  ``torch_xla._internal.tpu``. No hardware: the slice is described by the variables
  torch_xla honours instead of its metadata server (``TPU_SKIP_MDS_QUERY`` and the
  ``TPU_*`` values GKE sets).
- Neuron: ``configure_pjrt_environment`` (what ``import torch_xla`` runs on a Neuron
  host) then the Neuron plugin's ``configure_multiprocess`` (the ``xla://`` hook).

"Alone" scenarios run the same code without xlarun's variables, to show xlarun's
values are the ones torch_xla would compute itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, xla_env
from xlarun.runtimes import tpu

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla")

PROBE = r'''
import json, os, sys
from torch_xla._internal import neuron, tpu

def local_place():
    return int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])

STEPS = {
    "tpu_multiprocess": lambda: tpu.TpuPlugin().configure_multiprocess(*local_place()),
    "tpu_single_process": lambda: tpu.TpuPlugin().configure_single_process(),
    "neuron_import": neuron.configure_pjrt_environment,
    "neuron_rendezvous": lambda: neuron.NeuronPlugin().configure_multiprocess(*local_place()),
}

base = dict(os.environ)
results = {}
with open(sys.argv[1]) as handle:
    scenarios = json.load(handle)
for name, scenario in scenarios.items():
    os.environ.clear()
    os.environ.update(base)
    os.environ.update(scenario["env"])
    result = {}
    try:
        if scenario.get("probe_worker_id"):
            result["worker_id_before"] = tpu.worker_id()
        for step in scenario["steps"]:
            STEPS[step]()
    except Exception as error:
        result["error"] = repr(error)
    result["env"] = dict(os.environ)
    results[name] = result
with open(sys.argv[2], "w") as handle:
    json.dump(results, handle)
'''

MASTER_ADDR = "10.0.0.1"
MASTER_PORT = 29500


def torchrun_env(node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """The torchrun contract variables a launcher gives this worker."""
    return {
        "RANK": str(node.global_rank(local_rank)),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(node.world_size),
        "LOCAL_WORLD_SIZE": str(node.local_world_size),
        "GROUP_RANK": str(node.node_rank),
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
        "TORCHELASTIC_RUN_ID": node.run_id,
    }


def node(nnodes: int, nproc: int, node_rank: int) -> NodeAssignment:
    return NodeAssignment.single_node("job", nproc, MASTER_ADDR, MASTER_PORT, node_rank=node_rank, nnodes=nnodes)


def slice_metadata(accelerator: str, host_bounds: str, chips_per_host_bounds: str, worker_id: int,
                   hostnames: str) -> dict[str, str]:
    """The TPU slice as GKE describes it, read by torch_xla instead of the metadata server."""
    return {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": accelerator, "TPU_HOST_BOUNDS": host_bounds,
            "TPU_CHIPS_PER_HOST_BOUNDS": chips_per_host_bounds, "TPU_WORKER_ID": str(worker_id),
            "TPU_WORKER_HOSTNAMES": hostnames}


V4_16_HOST_1 = slice_metadata("v4-16", "1,1,2", "2,2,1", 1, "tpu-host-0,tpu-host-1")
V5E_8 = slice_metadata("v5litepod-8", "1,1,1", "2,4,1", 0, "")
V4_8 = slice_metadata("v4-8", "1,1,1", "2,2,1", 0, "")
TPU7X_8 = slice_metadata("tpu7x-8", "1,1,1", "2,2,1", 0, "")


def plan(options: XlaOptions, node_: NodeAssignment, local_rank: int, metadata: dict[str, str],
         steps: list[str], with_xlarun: bool = True, extra: dict[str, str] | None = None) -> dict:
    env = {**torchrun_env(node_, local_rank), **metadata, **(extra or {})}
    if with_xlarun:
        env.update(xla_env(options, node_, local_rank))
    return {"env": env, "steps": steps, "probe_worker_id": options.device == "tpu"}


# Topologies exactly as the launcher would build them: the two-host slice from GKE's
# variables, single hosts from their chip count alone (no metadata), TPU7x from its type.
TPU_V4_16 = XlaOptions("tpu", "pjrt", tpu_topology=tpu.topology(V4_16_HOST_1, local_chips=4, nnodes=2))
TPU_V5E_8 = XlaOptions("tpu", "pjrt", tpu_topology=tpu.topology({}, local_chips=8, nnodes=1))
TPU_V4_8_SPMD = XlaOptions("tpu", "pjrt", spmd=True, tpu_topology=tpu.topology({}, local_chips=4, nnodes=1))
TPU_7X = XlaOptions("tpu", "pjrt", tpu_topology=tpu.topology(TPU7X_8, local_chips=4, nnodes=1))
NEURON = XlaOptions("neuron", "pjrt")
NEURON_SPMD = XlaOptions("neuron", "pjrt", spmd=True)

SCENARIOS = {
    "tpu-v4-16": plan(TPU_V4_16, node(2, 4, 1), 2, V4_16_HOST_1, ["tpu_multiprocess"]),
    "tpu-v4-16-alone": plan(TPU_V4_16, node(2, 4, 1), 2, V4_16_HOST_1, ["tpu_multiprocess"], with_xlarun=False),
    "tpu-v5e-8": plan(TPU_V5E_8, node(1, 8, 0), 5, V5E_8, ["tpu_multiprocess"]),
    "tpu-v5e-8-alone": plan(TPU_V5E_8, node(1, 8, 0), 5, V5E_8, ["tpu_multiprocess"], with_xlarun=False),
    "tpu7x-8": plan(TPU_7X, node(1, 4, 0), 1, TPU7X_8, ["tpu_multiprocess"]),
    "tpu-v4-8-spmd": plan(TPU_V4_8_SPMD, node(1, 1, 0), 0, V4_8, ["tpu_single_process"]),
    "tpu-v4-8-spmd-alone": plan(TPU_V4_8_SPMD, node(1, 1, 0), 0, V4_8, ["tpu_single_process"],
                                with_xlarun=False, extra={"XLA_USE_SPMD": "1"}),
    "neuron": plan(NEURON, node(2, 4, 1), 2, {}, ["neuron_import", "neuron_rendezvous"]),
    "neuron-alone": plan(NEURON, node(2, 4, 1), 2, {}, ["neuron_import", "neuron_rendezvous"], with_xlarun=False),
    "neuron-user-cores": plan(NEURON, node(2, 4, 1), 2, {}, ["neuron_import", "neuron_rendezvous"],
                              extra={"NEURON_RT_VISIBLE_CORES": "8-11"}),
    "neuron-spmd": plan(NEURON_SPMD, node(2, 1, 1), 0, {}, ["neuron_import", "neuron_rendezvous"]),
}


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    """Each scenario's environment after torch_xla's configuration ran on it."""
    work = tmp_path_factory.mktemp("torch_xla_config")
    (work / "scenarios.json").write_text(json.dumps(SCENARIOS))
    minimal_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "PJRT_DEVICE": "CPU"}
    completed = subprocess.run([sys.executable, "-c", PROBE, str(work / "scenarios.json"), str(work / "out.json")],
                               env=minimal_env, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads((work / "out.json").read_text())


def assert_kept(configured, name: str, options: XlaOptions, node_: NodeAssignment, local_rank: int) -> dict[str, str]:
    result = configured[name]
    assert "error" not in result, result.get("error")
    planned = xla_env(options, node_, local_rank)
    after = result["env"]
    assert {key: after.get(key) for key in planned} == planned
    return after


def tpu_values(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key.startswith("TPU_")}


def assert_torch_xla_alone_agrees(configured, name: str, planned: dict[str, str]) -> None:
    """Every TPU variable xlarun plans is what torch_xla sets itself without xlarun."""
    alone = configured[f"{name}-alone"]
    assert "error" not in alone, alone.get("error")
    assert {key: alone["env"].get(key) for key in tpu_values(planned)} == tpu_values(planned)


# --- TPU --------------------------------------------------------------------------------------------

def test_tpu_multi_host_keeps_xlarun_values_which_are_torch_xlas_own(configured):
    after = assert_kept(configured, "tpu-v4-16", TPU_V4_16, node(2, 4, 1), 2)
    alone = configured["tpu-v4-16-alone"]["env"]
    planned = xla_env(TPU_V4_16, node(2, 4, 1), 2)
    assert_torch_xla_alone_agrees(configured, "tpu-v4-16", planned)
    assert planned["TPU_PROCESS_BOUNDS"] == "2,2,2"
    # What xlarun leaves out, torch_xla derives, the same with or without xlarun:
    assert after["CLOUD_TPU_TASK_ID"] == alone["CLOUD_TPU_TASK_ID"] == "6"  # = RANK
    assert after["TPU_PROCESS_ADDRESSES"] == alone["TPU_PROCESS_ADDRESSES"]
    assert len(after["TPU_PROCESS_ADDRESSES"].split(",")) == 8


def test_tpu_host_identity_is_not_shadowed(configured):
    # Under TPU_SKIP_MDS_QUERY torch_xla reads a preset CLOUD_TPU_TASK_ID as its worker
    # id; xlarun leaves it out, so torch_xla still sees TPU worker 1 before configuring.
    assert configured["tpu-v4-16"]["worker_id_before"] == 1


def test_tpu_single_host_bounds_from_chip_count_match_the_metadata(configured):
    assert_kept(configured, "tpu-v5e-8", TPU_V5E_8, node(1, 8, 0), 5)
    planned = xla_env(TPU_V5E_8, node(1, 8, 0), 5)
    assert_torch_xla_alone_agrees(configured, "tpu-v5e-8", planned)
    assert planned["TPU_PROCESS_BOUNDS"] == "2,4,1"
    assert planned["TPU_VISIBLE_CHIPS"] == "5" and planned["TPU_PROCESS_PORT"] == "8481"


def test_tpu7x_configures_its_four_dimensional_bounds(configured):
    after = assert_kept(configured, "tpu7x-8", TPU_7X, node(1, 4, 0), 1)
    assert after["TPU_PROCESS_BOUNDS"] == "2,2,1,2"


def test_tpu_spmd_keeps_every_chip_where_torch_xla_alone_pins_one(configured):
    after = assert_kept(configured, "tpu-v4-8-spmd", TPU_V4_8_SPMD, node(1, 1, 0), 0)
    assert after["TPU_VISIBLE_CHIPS"] == "0,1,2,3"
    assert after["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    assert after["TPU_PROCESS_BOUNDS"] == "1,1,1"
    alone = configured["tpu-v4-8-spmd-alone"]["env"]
    assert alone["TPU_VISIBLE_CHIPS"] == "0"
    assert alone["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"


# --- Neuron ----------------------------------------------------------------------------------------

def test_neuron_keeps_xlarun_values(configured):
    after = assert_kept(configured, "neuron", NEURON, node(2, 4, 1), 2)
    assert after["NEURON_RT_VISIBLE_CORES"] == "2"  # torch_xla's choice from the local rank
    assert after["PJRT_LOCAL_PROCESS_COUNT"] == "4"
    assert "NEURON_PJRT_PROCESSES_NUM_DEVICES" not in after


def test_neuron_values_match_torch_xla_alone_except_the_port(configured):
    alone = configured["neuron-alone"]["env"]
    planned = xla_env(NEURON, node(2, 4, 1), 2)
    for key in ("NEURON_PJRT_PROCESS_INDEX", "NEURON_PJRT_WORLD_SIZE", "PJRT_LOCAL_PROCESS_RANK",
                "PJRT_LOCAL_PROCESS_COUNT"):
        assert alone[key] == planned[key]
    # torch_xla alone hard-codes the root port; xlarun uses the job's coordinator port.
    assert alone["NEURON_RT_ROOT_COMM_ID"] == f"{MASTER_ADDR}:62182"
    assert planned["NEURON_RT_ROOT_COMM_ID"] == f"{MASTER_ADDR}:61756"


def test_neuron_users_core_range_is_indexed_by_local_rank(configured):
    after = assert_kept(configured, "neuron-user-cores", NEURON, node(2, 4, 1), 2)
    assert after["NEURON_RT_VISIBLE_CORES"] == "10"


def test_neuron_spmd_keeps_the_root_address_and_adds_no_per_process_values(configured):
    after = assert_kept(configured, "neuron-spmd", NEURON_SPMD, node(2, 1, 1), 0)
    assert "NEURON_PJRT_WORLD_SIZE" not in after
    assert "NEURON_PJRT_PROCESSES_NUM_DEVICES" not in after
    assert "NEURON_RT_VISIBLE_CORES" not in after
