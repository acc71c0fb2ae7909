"""The deployment examples: they parse, and every xlarun command line in them plans a launch.

Each xlarun command written in an example (an srun line, a manifest's container command, a
command line in a comment or docstring) runs here under ``xlarun --dry-run`` in the
environment its cluster would give it: the Slurm step recorded in tests/fixtures/cluster, or
the variables the Kubeflow operator and GKE set, built from the recorded fixtures and the
manifest's own names and sizes. ``--dry-run`` skips the host checks, so a Neuron or TPU plan
is made on any machine. The Hugging Face example also trains for real on four virtual CPU
devices when transformers is installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TESTS, logical_lines, run_xlarun

pytestmark = pytest.mark.examples

EXAMPLES = REPO / "examples"
SBATCH = EXAMPLES / "slurm-neuron-trn1.sbatch"
PYTORCHJOB = EXAMPLES / "kubeflow-pytorchjob.yaml"
GKE_TPU_JOB = EXAMPLES / "gke-tpu-job.yaml"
HF_TRAINER = EXAMPLES / "hf_trainer_fsdp_v2.py"
CLUSTER_FIXTURES = TESTS / "fixtures" / "cluster"
TPU_HOST = TESTS / "fixtures" / "hosts" / "tpu-v4-vm"
# The Hugging Face run takes seconds; a safety net only, inside pytest's own 300 s limit.
TRAINING_TIMEOUT_S = 240

# GKE's accelerator label -> the TPU_ACCELERATOR_TYPE it gives pods for a slice of N chips.
# v4 names count TensorCores (2 per chip); v5e and later count chips.
GKE_ACCELERATOR_TYPES = {
    "tpu-v4-podslice": lambda chips: f"v4-{2 * chips}",
    "tpu-v5-lite-podslice": lambda chips: f"v5litepod-{chips}",
    "tpu-v5p-slice": lambda chips: f"v5p-{2 * chips}",
}
# Chip grid of one TPU VM host by its chip count.
HOST_CHIP_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


# ---- helpers


def recorded_environ(name: str) -> dict[str, str]:
    return json.loads((CLUSTER_FIXTURES / f"{name}.json").read_text())["environ"]


def dry_run(command: Sequence[str], env: Mapping[str, str]) -> dict:
    """The plan ``command`` (an xlarun command line as written in an example) makes in ``env``."""
    assert command[0] == "xlarun", command
    assert not any("$" in part for part in command), f"unexpanded shell variable in {command}"
    result = run_xlarun("--dry-run", *command[1:], env=dict(env), cwd=REPO)
    assert result.returncode == 0, f"{shlex.join(command)}\n{result.stderr}"
    return json.loads(result.stdout)


def written_commands(path: Path) -> list[list[str]]:
    """xlarun command lines written in a file's comments or docstring: lines whose text,
    after any ``#`` and indentation, starts with ``xlarun `` (a trailing ``# note`` dropped)."""
    commands = []
    for line in logical_lines(path.read_text()):
        text = line.strip().lstrip("#").strip()
        if text.startswith("xlarun "):
            commands.append(shlex.split(text, comments=True))
    return commands


def srun_lines(path: Path) -> list[list[str]]:
    """The script's srun command lines, split as the shell splits them."""
    return [
        shlex.split(line, comments=True) for line in logical_lines(path.read_text()) if line.strip().startswith("srun ")
    ]


def after_xlarun(argv: Sequence[str]) -> list[str]:
    return list(argv[argv.index("xlarun") :])


def container_command(container: Mapping) -> list[str]:
    return [str(part) for part in [*container.get("command", []), *container.get("args", [])]]


def manifests(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def by_kind(path: Path) -> dict[str, dict]:
    return {document["kind"]: document for document in manifests(path)}


def worker_env(plan: Mapping, local_rank: int) -> dict[str, str]:
    return plan["workers"][local_rank]["env"]


# ---- every example


@pytest.mark.parametrize("path", [PYTORCHJOB, GKE_TPU_JOB], ids=lambda path: path.name)
def test_manifests_are_kubernetes_objects(path: Path) -> None:
    documents = manifests(path)
    assert documents
    for document in documents:
        assert isinstance(document, dict)
        assert document["apiVersion"] and document["kind"] and document["metadata"]["name"]
        assert isinstance(document["spec"], dict)


@pytest.mark.parametrize("path", [SBATCH, PYTORCHJOB, GKE_TPU_JOB, HF_TRAINER], ids=lambda path: path.name)
def test_each_example_opens_with_what_it_is_and_how_to_adapt_it(path: Path) -> None:
    text = path.read_text()
    opening = text[: text.index("apiVersion")] if path.suffix == ".yaml" else text[:3000]
    assert "adapt" in opening.lower(), f"{path.name} does not say how to adapt it before it starts"


# ---- Slurm, Neuron trn1


def test_sbatch_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(SBATCH)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sbatch_options_come_before_the_first_command() -> None:
    # sbatch stops reading #SBATCH lines at the first line that is neither a comment nor blank.
    lines = SBATCH.read_text().splitlines()
    first_command = next(index for index, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    options = [index for index, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert options and max(options) < first_command
    assert "#SBATCH --ntasks-per-node=1" in lines


def test_sbatch_exports_efa_settings_of_aws_recipes() -> None:
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", SBATCH.read_text(), re.MULTILINE))
    assert {
        name: exported.get(name)
        for name in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "MALLOC_ARENA_MAX")
    } == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "MALLOC_ARENA_MAX": "64"}


def test_sbatch_starts_one_xlarun_per_node() -> None:
    launches = [line for line in srun_lines(SBATCH) if "xlarun" in line]
    assert len(launches) == 1
    srun_options = launches[0][1 : launches[0].index("xlarun")]
    assert "--ntasks-per-node=1" in srun_options  # --cluster slurm refuses several tasks on a node


def test_sbatch_xlarun_line_plans_a_trn1_step_alike_on_every_node() -> None:
    (launch,) = [after_xlarun(line) for line in srun_lines(SBATCH) if "xlarun" in line]
    step = recorded_environ("slurm_step_subset_trn004")  # a 3-node step on trn[003-004,010]
    plans = [dry_run(launch, {**step, "SLURM_NODEID": str(node)}) for node in range(3)]

    for node, plan in enumerate(plans):
        assert (plan["device"], plan["node_rank"], plan["nnodes"]) == ("neuron", node, [3, 3])
        assert (plan["nproc_per_node"], plan["world_size"]) == (32, 96)
        assert [worker["rank"] for worker in plan["workers"]] == list(range(32 * node, 32 * node + 32))
        for local_rank, worker in enumerate(plan["workers"]):
            env = worker["env"]
            assert (env["PJRT_DEVICE"], env["NEURON_PJRT_WORLD_SIZE"]) == ("NEURON", "96")
            assert env["NEURON_PJRT_PROCESS_INDEX"] == str(32 * node + local_rank)
    agreed = {
        (plan["master_addr"], plan["master_port"], plan["run_id"], worker_env(plan, 0)["NEURON_RT_ROOT_COMM_ID"])
        for plan in plans
    }
    assert len(agreed) == 1
    master_addr, master_port, run_id, root_comm_id = agreed.pop()
    assert (master_addr, run_id) == ("trn003", "4242.3")
    assert root_comm_id.startswith("trn003:") and root_comm_id != f"trn003:{master_port}"


# ---- Kubeflow PyTorchJob


def pytorchjob_pod_environ(job: Mapping, replica_type: str, index: int) -> dict[str, str]:
    """What the training operator sets on a pod of ``job``: the recorded master or worker pod,
    with this job's name, sizes and port (pkg/controller.v1/pytorch: WORLD_SIZE counts
    processes, a worker's rank is its index + 1, the master is told ``localhost``)."""
    name = job["metadata"]["name"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nnodes = sum(spec["replicas"] for spec in replicas.values())
    nproc = job["spec"]["nprocPerNode"]
    port = str(master_port(job))
    node_rank = 0 if replica_type == "Master" else index + 1
    master_addr = "localhost" if replica_type == "Master" else f"{name}-master-0"
    recorded = recorded_environ("k8s_pytorchjob_master" if replica_type == "Master" else "k8s_pytorchjob_worker1")
    return {
        **recorded,
        "HOSTNAME": f"{name}-{replica_type.lower()}-{index}",
        "MASTER_ADDR": master_addr,
        "PET_MASTER_ADDR": master_addr,
        "MASTER_PORT": port,
        "PET_MASTER_PORT": port,
        "WORLD_SIZE": str(nnodes * int(nproc)),
        "RANK": str(node_rank),
        "PET_NODE_RANK": str(node_rank),
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": nproc,
    }


def pytorch_container(replica: Mapping) -> dict:
    (container,) = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
    return container


def master_port(job: Mapping) -> int:
    ports = pytorch_container(job["spec"]["pytorchReplicaSpecs"]["Master"]).get("ports", [])
    return next(port["containerPort"] for port in ports if port.get("name") == "pytorchjob-port")


def test_pytorchjob_follows_the_training_operators_schema() -> None:
    job = by_kind(PYTORCHJOB)["PyTorchJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1
    assert isinstance(job["spec"]["nprocPerNode"], str)  # *string in the v1 API: "32", "auto"
    for replica in replicas.values():
        assert replica["restartPolicy"] in ("Never", "OnFailure", "Always", "ExitCode")
        container = pytorch_container(replica)  # the container the operator sets variables on
        assert container_command(container)[0] == "xlarun"
        assert container["resources"]["limits"] == container["resources"]["requests"]
    assert master_port(job) == 23456


def test_pytorchjob_command_plans_every_pod_alike() -> None:
    job = by_kind(PYTORCHJOB)["PyTorchJob"]
    name = job["metadata"]["name"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nnodes = replicas["Master"]["replicas"] + replicas["Worker"]["replicas"]
    nproc = int(job["spec"]["nprocPerNode"])
    pods = [("Master", 0)] + [("Worker", index) for index in range(replicas["Worker"]["replicas"])]

    for replica_type, index in pods:
        command = container_command(pytorch_container(replicas[replica_type]))
        plan = dry_run(command, pytorchjob_pod_environ(job, replica_type, index))
        node_rank = 0 if replica_type == "Master" else index + 1
        assert (plan["node_rank"], plan["nnodes"]) == (node_rank, [nnodes, nnodes]), (replica_type, index)
        assert (plan["nproc_per_node"], plan["world_size"]) == (nproc, nnodes * nproc)
        assert (plan["master_addr"], plan["master_port"]) == (f"{name}-master-0", master_port(job))
        assert plan["device"] == "neuron"
        assert worker_env(plan, 0)["NEURON_RT_ROOT_COMM_ID"].startswith(f"{name}-master-0:")


# ---- GKE, multi-host TPU slice


def gke_slice(path: Path) -> dict:
    """The Job's slice: its hosts, chips per host and the names GKE gives the pods."""
    documents = by_kind(path)
    service, job = documents["Service"], documents["Job"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    dims = [int(dim) for dim in topology.split("x")] + [1] * (3 - len(topology.split("x")))
    chips_per_host = int(container["resources"]["limits"]["google.com/tpu"])
    hosts = math.prod(dims) // chips_per_host
    names = [f"{job['metadata']['name']}-{index}.{pod['subdomain']}" for index in range(hosts)]
    return {
        "service": service,
        "job": job,
        "pod": pod,
        "container": container,
        "dims": dims,
        "chips_per_host": chips_per_host,
        "hosts": hosts,
        "hostnames": names,
    }


def gke_pod_environ(slice_: Mapping, worker_id: int) -> dict[str, str]:
    """What GKE sets on the pod of TPU host ``worker_id``: the recorded GKE pod, with this
    slice's hosts, accelerator type and topology."""
    accelerator = slice_["pod"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"]
    assert accelerator in GKE_ACCELERATOR_TYPES, f"add {accelerator} to GKE_ACCELERATOR_TYPES"
    chip_bounds = HOST_CHIP_BOUNDS[slice_["chips_per_host"]]
    host_bounds = [dim // chips for dim, chips in zip(slice_["dims"], chip_bounds, strict=True)]
    return {
        **recorded_environ("gke_tpu_worker1"),
        "HOSTNAME": slice_["hostnames"][worker_id].split(".")[0],
        "TPU_WORKER_ID": str(worker_id),
        "TPU_WORKER_HOSTNAMES": ",".join(slice_["hostnames"]),
        "TPU_ACCELERATOR_TYPE": GKE_ACCELERATOR_TYPES[accelerator](math.prod(slice_["dims"])),
        "TPU_TOPOLOGY": "x".join(map(str, slice_["dims"])),
        "TPU_HOST_BOUNDS": ",".join(map(str, host_bounds)),
        "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, chip_bounds)),
    }


def test_gke_job_runs_one_pod_per_host_of_the_slice_behind_its_headless_service() -> None:
    slice_ = gke_slice(GKE_TPU_JOB)
    service, job, pod = slice_["service"], slice_["job"], slice_["pod"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["subdomain"] == service["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"  # pod names <job>-<index>, TPU_WORKER_ID = index
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == slice_["hosts"] > 1
    resources = slice_["container"]["resources"]
    assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"]


def test_gke_job_commands_plan_every_host_alike() -> None:
    slice_ = gke_slice(GKE_TPU_JOB)
    commands = [container_command(slice_["container"]), *written_commands(GKE_TPU_JOB)]
    assert len(commands) == 2 and sum("--spmd" in command for command in commands) == 1
    hosts, chips = slice_["hosts"], slice_["chips_per_host"]

    for command in commands:
        spmd = "--spmd" in command
        for worker_id in range(hosts):
            plan = dry_run(command, gke_pod_environ(slice_, worker_id))
            assert (plan["device"], plan["node_rank"], plan["nnodes"]) == ("tpu", worker_id, [hosts, hosts])
            assert plan["master_addr"] == slice_["hostnames"][0]
            assert plan["world_size"] == hosts * (1 if spmd else chips)
            for local_rank, worker in enumerate(plan["workers"]):
                env = worker["env"]
                if spmd:
                    assert env["XLARUN_SPMD"] == "1" and "XLA_USE_SPMD" not in env
                    assert env["TPU_VISIBLE_CHIPS"] == ",".join(map(str, range(chips)))
                    assert env["TPU_PROCESS_BOUNDS"] == gke_pod_environ(slice_, worker_id)["TPU_HOST_BOUNDS"]
                else:
                    assert env["TPU_VISIBLE_CHIPS"] == str(local_rank)
                    assert env["TPU_PROCESS_BOUNDS"] == ",".join(map(str, slice_["dims"]))  # one chip each


# ---- Python examples' documented command lines


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda path: path.name)
def test_documented_command_lines_plan(path: Path) -> None:
    commands = written_commands(path)
    assert commands, f"{path.name} documents no xlarun command line"
    for command in commands:
        # A TPU line is planned as on a TPU VM with 4 chips; every other line on a CPU host.
        env = {"XLARUN_HOST_ROOT": str(TPU_HOST)} if "tpu" in command else {}
        plan = dry_run(command, env)
        script = next(part for part in command[1:] if part.endswith(".py"))
        assert all(worker["argv"][2:3] == [script] for worker in plan["workers"])
        if "--spmd" in command:
            assert plan["nproc_per_node"] == 1
            assert worker_env(plan, 0)["XLARUN_SPMD"] == "1"


# ---- what the Python examples say they print, run as they say


def run_documented(path: Path) -> str:
    """The stdout of the example's one documented command line, run on a free port."""
    (command,) = written_commands(path)
    result = run_xlarun("--standalone", *command[1:], cwd=REPO, timeout=TRAINING_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_allreduce_prints_the_line_its_docstring_shows() -> None:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / "allreduce.py").read_text())) or ""
    (shown,) = re.findall(r"prints one line, ``(.+?)``", docstring.replace("\n", " "))
    names = [token.split("=")[0] for token in shown.split()]  # rank=R: the name of a value
    lines = sorted(line for line in run_documented(EXAMPLES / "allreduce.py").splitlines() if line.startswith("rank="))
    assert len(lines) == 2, lines
    for rank, line in enumerate(lines):
        values = dict(token.split("=", 1) for token in line.split())
        assert list(values) == names, f"{line!r} is not {shown!r}"
        assert (values["rank"], values["world"], values["sum"], values["local_rank"]) == (
            str(rank),
            "2",
            "1",
            str(rank),
        )


@pytest.mark.torch_xla
def test_spmd_fsdp_shards_each_parameter_as_its_docstring_lists() -> None:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / "spmd_fsdp.py").read_text())) or ""
    listed = {
        line.split()[0]: line.split()[-1] for line in docstring.splitlines() if line.strip().startswith("_orig_module.")
    }
    assert len(listed) == 4, docstring
    reports = [
        json.loads(line) for line in run_documented(EXAMPLES / "spmd_fsdp.py").splitlines() if line.startswith("{")
    ]
    assert len(reports) == 1, reports
    assert reports[0]["devices"] == 4
    assert reports[0]["shardings"] == listed


# ---- Hugging Face Trainer, FSDPv2 on four virtual CPU devices


def hf_trainer_missing() -> str | None:
    missing = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed (pip install transformers accelerate)" if missing else None


@pytest.mark.torch_xla
@pytest.mark.skipif(hf_trainer_missing() is not None, reason=hf_trainer_missing() or "")
def test_hf_trainer_fsdp_v2_trains_sharded_over_four_cpu_devices(tmp_path: Path) -> None:
    (command,) = [command for command in written_commands(HF_TRAINER) if "cpu" in command]
    # --standalone: a free port, whatever else runs on this machine.
    result = run_xlarun(
        "--standalone",
        *command[1:],
        cwd=REPO,
        timeout=TRAINING_TIMEOUT_S,
        env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # The Trainer's arguments are spelt as the installed transformers documents them, not a deprecated way.
    assert [line for line in result.stderr.splitlines() if "fsdp" in line and "deprecated" in line] == []
    (report,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"devices"')]
    assert report["devices"] == 4
    assert report["q_proj_sharding"] == "{devices=[4,1]0,1,2,3}"
    assert math.isfinite(report["train_loss"]) and report["train_loss"] > 0


# ---- GKE, multislice JobSet

GKE_MULTISLICE_JOBSET = EXAMPLES / "gke-tpu-multislice-jobset.yaml"


def test_gke_multislice_jobset_plans_its_hosts_slice_by_slice_with_one_coordinator() -> None:
    jobset = by_kind(GKE_MULTISLICE_JOBSET)["JobSet"]
    name = jobset["metadata"]["name"]
    (replicated,) = jobset["spec"]["replicatedJobs"]
    slices, job = replicated["replicas"], replicated["template"]["spec"]
    hosts = job["parallelism"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['jobset.sigs.k8s.io/job-index']"
    )
    assert env["MEGASCALE_NUM_SLICES"]["value"] == str(slices)
    coordinator = env["MEGASCALE_COORDINATOR_ADDRESS"]["value"]
    slice_0_pod_0 = f"{name}-{replicated['name']}-0-0.{name}"
    assert coordinator.startswith(f"{slice_0_pod_0}:")
    chips = int(container["resources"]["limits"]["google.com/tpu"])
    plans = []
    for slice_id in range(slices):
        names = [f"{name}-{replicated['name']}-{slice_id}-{index}.{name}" for index in range(hosts)]
        for worker_id in range(hosts):
            plans.append(
                dry_run(
                    container_command(container),
                    {
                        **recorded_environ("gke_tpu_multislice_slice1_worker0"),
                        "TPU_WORKER_ID": str(worker_id),
                        "TPU_WORKER_HOSTNAMES": ",".join(names),
                        "MEGASCALE_SLICE_ID": str(slice_id),
                        "MEGASCALE_NUM_SLICES": str(slices),
                        "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
                    },
                )
            )
    assert [plan["node_rank"] for plan in plans] == list(range(slices * hosts))
    assert {plan["master_addr"] for plan in plans} == {slice_0_pod_0}
    assert {worker["env"]["MEGASCALE_COORDINATOR_ADDRESS"] for plan in plans for worker in plan["workers"]} == {
        coordinator
    }
    assert all(plan["world_size"] == slices * hosts * chips for plan in plans)
