"""Every supported torch_xla release's own set-up code, run on the environments xlarun plans.

For each release (its Python sources come from its wheel, see
``scripts/fetch-torch-xla-sources.sh``) and each device scenario, xlarun's ``--dry-run``
plans the workers as if that release were installed (a ``torch_xla-X.Y.Z.dist-info`` folder
first on ``PYTHONPATH`` is what xlarun reads), and ``tests/xla_release_probe.py`` runs the
release's own code on one worker's environment: the Neuron part of ``import torch_xla``,
the plugin registration, and, where :func:`xlarun.init_process_group` would use it, the
``xla://`` rendezvous. The native parts (the C++ runtime, libneuronxla, the TPU metadata
server) are stubbed; nothing else can run without the hardware.

Each scenario asserts the environment afterwards: xlarun's values survive and the runtime
gets what the device needs (chip, bounds and task id on TPU; process index, world and core
on Neuron; local place and coordinator on XLA:GPU; none on CPU). Where xlarun avoids
``xla://`` on a release, the probe also runs it there to show it really breaks, so the
release facts in :mod:`xlarun.runtimes.releases` cannot go stale silently.

Releases whose sources are missing skip, except under ``CI``, where they fail: a release
left untested must not pass unnoticed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, TESTS, clean_env

from xlarun.exceptions import UsageError
from xlarun.planning.packages import preflight
from xlarun.runtimes.releases import (
    NEURON_IMPORT_CONFIGURES,
    SUPPORTED,
    TPU_GENERATION_FIRST_RELEASE,
    XLA_INIT_BREAKS,
    Release,
    XlaInitBreak,
    xla_init_break,
)

pytestmark = pytest.mark.release_matrix

SOURCES = REPO / ".venv" / "torch-xla-sources"
VERSIONS = {
    (2, 1): "2.1.0",
    (2, 2): "2.2.0",
    (2, 3): "2.3.0",
    (2, 4): "2.4.0",
    (2, 5): "2.5.1",
    (2, 6): "2.6.0",
    (2, 7): "2.7.0",
    (2, 8): "2.8.1",
    (2, 9): "2.9.0",
}
"""The patch release of each supported release whose wheel the fetch script downloads."""
HOSTS = TESTS / "fixtures" / "hosts"
MASTER = "10.0.0.1"
COORDINATOR = f"{MASTER}:61756"  # the coordinator port rule's value for MASTER_PORT 29500
ABSENT = None
SPMD_DEVICES = 4
"""Devices one SPMD process drives in the stubbed runtime (a v4 host's chips, four virtual CPUs)."""


def gke(accelerator: str, host_bounds: str, worker_id: int, hostnames: str) -> dict[str, str]:
    """A TPU slice as GKE describes it to the pod; torch_xla reads it instead of the metadata server."""
    return {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": accelerator,
        "TPU_HOST_BOUNDS": host_bounds,
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_WORKER_ID": str(worker_id),
        "TPU_WORKER_HOSTNAMES": hostnames,
    }


def tpu_vm(accelerator: str, host_bounds: str, worker_id: int, ips: list[str]) -> dict[str, str]:
    """A TPU VM's metadata server attributes (``tpu-env`` and the workers' endpoints)."""
    tpu_env = {
        "ACCELERATOR_TYPE": accelerator,
        "TPU_PROCESS_BOUNDS": host_bounds,
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
        "WORKER_ID": str(worker_id),
    }
    endpoints = ",".join(f"t1v-n-{index}-w-{index}:uid{index}:{ip}" for index, ip in enumerate(ips))
    return {"tpu-env": yaml.safe_dump(tpu_env), "worker-network-endpoints": endpoints}


V4_16_HOSTS = ["10.130.0.10", "10.130.0.11"]


@dataclass(frozen=True)
class Scenario:
    """One worker of a planned launch. ``expect`` maps a release to the variables the worker must
    end with (``None``: absent); ``environ`` is what the host gives launcher and workers alike."""

    device: str
    flags: tuple[str, ...]
    host: str
    local_rank: int
    expect: Callable[[Release], dict[str, str | None]]
    environ: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] | None = None
    releases: tuple[Release, Release] = (SUPPORTED[0], SUPPORTED[-1])
    processes_per_host: int | None = None
    """Where set, TPU process addresses to expect per host (one per local process)."""
    split_world: bool = False
    """CPU processes, each a world of one: :func:`xlarun.init_process_group` refuses before ``xla://``."""

    def applies(self, release: Release) -> bool:
        return self.releases[0] <= release <= self.releases[1]

    def _flag(self, name: str, default: int) -> int:
        flags = list(self.flags)
        return int(flags[flags.index(name) + 1]) if name in flags else default

    @property
    def spmd(self) -> bool:
        return "--spmd" in self.flags

    @property
    def local_processes(self) -> int:
        return 1 if self.spmd else self._flag("--nproc-per-node", 1)

    @property
    def node_rank(self) -> int:
        return self._flag("--node-rank", 0)

    def breaks(self, release: Release) -> list[XlaInitBreak]:
        """The release facts by which ``xla://`` misconfigures this worker."""
        return [case for case in XLA_INIT_BREAKS if case.applies(release, self.device, self.spmd, self.local_processes)]

    def joins_with_xla_init(self, release: Release) -> bool:
        """Whether :func:`xlarun.init_process_group` (the ``xla`` backend) reaches ``xla://`` here."""
        return (
            not self.split_world
            and xla_init_break(release, self.device, spmd=self.spmd, local_processes=self.local_processes) is None
        )

    def shows_break(self, release: Release) -> bool:
        """Whether a break of ``xla://`` shows in this worker: an error, the rank of an SPMD process,
        or a value on a node past the first (on node 0 a local rank is the rank)."""
        return any(case.local_processes == "one" or case.spmd or self.node_rank > 0 for case in self.breaks(release))

    def runtime(self, planned: dict[str, str]) -> dict[str, int]:
        """What a correctly configured runtime answers in this worker: under SPMD one process per
        node driving the host's devices, otherwise one device per process."""
        if self.spmd:
            return {
                "index": int(planned["GROUP_RANK"]),
                "processes": int(planned["GROUP_WORLD_SIZE"]),
                "devices": SPMD_DEVICES,
            }
        return {"index": int(planned["RANK"]), "processes": int(planned["WORLD_SIZE"]), "devices": 1}


def static(nnodes: int, node_rank: int, nproc: int) -> tuple[str, ...]:
    return (
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        MASTER,
    )


def neuron_worker(rank: int, world: int, local_rank: int, local_world: int) -> Callable[[Release], dict]:
    return lambda release: {
        "NEURON_RT_ROOT_COMM_ID": COORDINATOR,
        "NEURON_PJRT_PROCESS_INDEX": str(rank),
        "NEURON_PJRT_WORLD_SIZE": str(world),
        "NEURON_RT_VISIBLE_CORES": str(local_rank),
        "PJRT_LOCAL_PROCESS_RANK": str(local_rank),
        "PJRT_LOCAL_PROCESS_COUNT": str(local_world),
        "NEURON_PJRT_PROCESSES_NUM_DEVICES": ABSENT,
    }


def neuron_spmd(node_rank: int | None, num_devices: str | None) -> Callable[[Release], dict]:
    return lambda release: {
        "NEURON_RT_ROOT_COMM_ID": COORDINATOR,
        "NEURON_RT_VISIBLE_CORES": ABSENT,
        "NEURON_PJRT_WORLD_SIZE": ABSENT,
        "NEURON_PJRT_PROCESS_INDEX": None if node_rank is None else str(node_rank),
        "NEURON_PJRT_PROCESSES_NUM_DEVICES": num_devices,
    }


def tpu_chip(chip: int, bounds: str, task: int) -> Callable[[Release], dict]:
    return lambda release: {
        "TPU_VISIBLE_CHIPS": str(chip),
        "TPU_PROCESS_PORT": str(8476 + chip),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": bounds,
        "CLOUD_TPU_TASK_ID": str(task),
        "PJRT_LOCAL_PROCESS_RANK": str(chip),
    }


def tpu_one_chip_world(release: Release) -> dict[str, str | None]:
    """One process per host without SPMD: a world of one chip on every release, never the slice."""
    return {"TPU_VISIBLE_CHIPS": "0", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1"}


def tpu_whole_host(host_bounds: str) -> Callable[[Release], dict]:
    return lambda release: {
        "TPU_VISIBLE_CHIPS": "0,1,2,3",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
        "TPU_PROCESS_BOUNDS": host_bounds,
        "XLARUN_SPMD": "1",
    }


SCENARIOS: dict[str, Scenario] = {
    "tpu-v4-8-vm": Scenario(
        "tpu",
        ("--nproc-per-node", "4"),
        "tpu-v4-vm",
        1,
        tpu_chip(1, "2,2,1", 1),
        metadata=tpu_vm("v4-8", "1,1,1", 0, ["10.130.0.10"]),
        processes_per_host=4,
    ),
    "tpu-v4-8-gke": Scenario(
        "tpu",
        ("--nproc-per-node", "4"),
        "tpu-v4-vm",
        3,
        tpu_chip(3, "2,2,1", 3),
        environ=gke("v4-8", "1,1,1", 0, "tpu-0"),
        processes_per_host=4,
    ),
    "tpu-v4-16-vm": Scenario(
        "tpu",
        static(2, 1, 4),
        "tpu-v4-vm",
        2,
        tpu_chip(2, "2,2,2", 6),
        metadata=tpu_vm("v4-16", "1,1,2", 1, V4_16_HOSTS),
        processes_per_host=4,
    ),
    "tpu-v4-16-gke": Scenario(
        "tpu",
        static(2, 1, 4),
        "tpu-v4-vm",
        2,
        tpu_chip(2, "2,2,2", 6),
        environ=gke("v4-16", "1,1,2", 1, "tpu-0,tpu-1"),
        processes_per_host=4,
    ),
    "tpu-v4-16-vm-one-process": Scenario(
        "tpu", static(2, 1, 1), "tpu-v4-vm", 0, tpu_one_chip_world, metadata=tpu_vm("v4-16", "1,1,2", 1, V4_16_HOSTS)
    ),
    "tpu-v4-16-gke-one-process": Scenario(
        "tpu", static(2, 1, 1), "tpu-v4-vm", 0, tpu_one_chip_world, environ=gke("v4-16", "1,1,2", 1, "tpu-0,tpu-1")
    ),
    "tpu-v4-8-vm-spmd": Scenario(
        "tpu",
        ("--spmd",),
        "tpu-v4-vm",
        0,
        tpu_whole_host("1,1,1"),
        metadata=tpu_vm("v4-8", "1,1,1", 0, ["10.130.0.10"]),
    ),
    "tpu-v4-16-gke-spmd": Scenario(
        "tpu",
        ("--spmd", *static(2, 1, 1)),
        "tpu-v4-vm",
        0,
        tpu_whole_host("1,1,2"),
        environ=gke("v4-16", "1,1,2", 1, "tpu-0,tpu-1"),
    ),
    "neuron-one-node": Scenario("neuron", ("--nproc-per-node", "2"), "trn1-32xlarge", 1, neuron_worker(1, 2, 1, 2)),
    "neuron-one-node-one-process": Scenario(
        "neuron", ("--nproc-per-node", "1"), "trn1-32xlarge", 0, neuron_worker(0, 1, 0, 1)
    ),
    "neuron-two-nodes": Scenario("neuron", static(2, 1, 2), "trn1-32xlarge", 1, neuron_worker(3, 4, 1, 2)),
    "neuron-two-nodes-one-process": Scenario("neuron", static(2, 1, 1), "trn1-32xlarge", 0, neuron_worker(1, 2, 0, 1)),
    "neuron-one-node-spmd": Scenario("neuron", ("--spmd",), "trn1-32xlarge", 0, neuron_spmd(None, ABSENT)),
    "neuron-two-nodes-spmd": Scenario(
        "neuron", ("--spmd", *static(2, 1, 1)), "trn1-32xlarge", 0, neuron_spmd(1, "32,32")
    ),
    "cuda-one-node": Scenario(
        "cuda",
        ("--nproc-per-node", "2"),
        "nvidia-8gpu",
        1,
        lambda release: {
            "PJRT_DEVICE": "CUDA",
            "PJRT_LOCAL_PROCESS_RANK": "1",
            "PJRT_LOCAL_PROCESS_COUNT": "2",
            "XLA_COORDINATOR_PORT": "61756",
        },
        releases=((2, 2), (2, 8)),
    ),
    "cuda-two-nodes": Scenario(
        "cuda",
        static(2, 1, 4),
        "nvidia-8gpu",
        3,
        lambda release: {
            "PJRT_DEVICE": "CUDA",
            "PJRT_LOCAL_PROCESS_RANK": "3",
            "PJRT_LOCAL_PROCESS_COUNT": "4",
            "RANK": "7",
            "XLA_COORDINATOR_PORT": "61756",
        },
        releases=((2, 2), (2, 8)),
    ),
    "cpu-two-processes": Scenario(
        "cpu",
        ("--device", "cpu", "--nproc-per-node", "2"),
        "gce-cpu-vm",
        1,
        lambda release: {"PJRT_DEVICE": "CPU", "PJRT_LOCAL_PROCESS_RANK": ABSENT, "PJRT_LOCAL_PROCESS_COUNT": ABSENT},
        split_world=True,
    ),
    "cpu-spmd": Scenario(
        "cpu",
        ("--device", "cpu", "--spmd", "--virtual-devices", "4"),
        "gce-cpu-vm",
        0,
        lambda release: {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "XLARUN_SPMD": "1"},
    ),
    "xpu-two-processes": Scenario(
        "xpu",
        ("--device", "xpu", "--nproc-per-node", "2"),
        "gce-cpu-vm",
        1,
        lambda release: {"PJRT_DEVICE": "XPU", "PJRT_LOCAL_PROCESS_RANK": "1"},
        releases=((2, 4), (2, 9)),
    ),
    "xpu-one-process": Scenario(
        "xpu",
        ("--device", "xpu"),
        "gce-cpu-vm",
        0,
        lambda release: {"PJRT_DEVICE": "XPU", "PJRT_LOCAL_PROCESS_RANK": "0"},
        releases=((2, 4), (2, 9)),
    ),
}

CASES = [(release, name) for release in SUPPORTED for name, scenario in SCENARIOS.items() if scenario.applies(release)]


def sources(release: Release) -> Path:
    """The release's fetched sources; a missing release skips, or fails under CI."""
    path = SOURCES / VERSIONS[release]
    if not (path / "COMPLETE").is_file():
        message = f"torch_xla {VERSIONS[release]} sources missing: run scripts/fetch-torch-xla-sources.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def dry_run(release: Release, scenario: Scenario, dist_info: Path) -> dict[str, str]:
    """The environment xlarun plans for the scenario's worker with ``release`` installed."""
    env = clean_env(
        {
            **scenario.environ,
            "XLARUN_HOST_ROOT": str(HOSTS / scenario.host),
            "PYTHONPATH": os.pathsep.join([str(dist_info), str(REPO)]),
        }
    )
    master = () if "--master-addr" in scenario.flags else ("--master-addr", MASTER)
    command = [sys.executable, "-m", "xlarun", "--dry-run", *master, *scenario.flags, "train.py"]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)["workers"][scenario.local_rank]["env"]


Probe = Callable[[Release], dict[str, Any]]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Probe:
    """Runs a release's scenarios once, on first use: ``probe(release)``."""
    return lru_cache(maxsize=None)(lambda release: run_release(release, tmp_path_factory.mktemp("release")))


def run_release(release: Release, work: Path) -> dict[str, Any]:
    """Every scenario of ``release``: the plans and what the release's own code made of them."""
    root = sources(release)
    dist_info = work / "site"
    (dist_info / f"torch_xla-{VERSIONS[release]}.dist-info").mkdir(parents=True, exist_ok=True)
    names = [name for name, scenario in SCENARIOS.items() if scenario.applies(release)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        plans = dict(
            zip(names, pool.map(lambda name: dry_run(release, SCENARIOS[name], dist_info), names), strict=True)
        )
    runs: dict[str, Any] = {}
    for name in names:
        scenario, planned = SCENARIOS[name], plans[name]
        base = {
            "libneuronxla": scenario.device == "neuron",
            "libtpu": scenario.device == "tpu",
            "cuda_build": scenario.device == "cuda",
            "metadata": scenario.metadata,
            "runtime": scenario.runtime(planned),
        }
        worker_env = {**scenario.environ, **planned}
        # What xlarun.init_process_group does first in a process launched for SPMD.
        switch = ["use_spmd"] if scenario.spmd and "XLA_USE_SPMD" not in planned else []
        init = scenario.joins_with_xla_init(release)
        runs[name] = {**base, "env": worker_env, "steps": ["import", *switch, *(["xla_init"] if init else [])]}
        if scenario.shows_break(release):
            runs[f"{name}/xla_init"] = {**base, "env": worker_env, "steps": ["import", *switch, "xla_init"]}
        if scenario.processes_per_host:
            alone = {
                key: value
                for key, value in worker_env.items()
                if not key.startswith(("TPU_VISIBLE", "TPU_PROCESS", "TPU_CHIPS_PER_PROCESS"))
                or key in scenario.environ
            }
            runs[f"{name}/alone"] = {**base, "env": alone, "steps": ["import", "xla_init"]}
    runs["tpu7x"] = {"env": {"PJRT_DEVICE": "TPU", **gke("tpu7x-8", "1,1,1", 0, "tpu-0")}, "steps": ["tpu_version"]}
    (work / "scenarios.json").write_text(json.dumps(runs))
    completed = subprocess.run(
        [
            sys.executable,
            str(TESTS / "xla_release_probe.py"),
            str(root),
            str(work / "scenarios.json"),
            str(work / "results.json"),
        ],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(work),
            "PYTHONDONTWRITEBYTECODE": "1",
        },  # the sources cache stays as fetched
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return {"plans": plans, "runs": runs, "results": json.loads((work / "results.json").read_text())}


def case_id(case: tuple[Release, str]) -> str:
    return f"{case[0][0]}.{case[0][1]}-{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_release_set_up_keeps_xlaruns_plan_and_configures_the_device(case: tuple[Release, str], probe: Probe) -> None:
    release, name = case
    scenario, outcome = SCENARIOS[name], probe(release)
    planned, result = outcome["plans"][name], outcome["results"][name]
    assert "error" not in result, result["error"]
    after = result["env"]
    assert {key: after.get(key) for key in planned} == planned, "torch_xla changed a value xlarun planned"
    expected = scenario.expect(release)
    assert {key: after.get(key) for key in expected} == expected
    if scenario.spmd:
        # Deprecated since 2.1; only Neuron's import-time set-up (2.5+) reads it before the program runs.
        assert ("XLA_USE_SPMD" in planned) == (scenario.device == "neuron" and release >= NEURON_IMPORT_CONFIGURES)
    if "rendezvous" in result:
        assert (result["rendezvous"]["rank"], result["rendezvous"]["world_size"]) == (
            int(planned["RANK"]),
            int(planned["WORLD_SIZE"]),
        ), "xla:// numbers the workers unlike the launcher"
    if scenario.processes_per_host:
        hosts = int(after["WORLD_SIZE"]) // int(after["LOCAL_WORLD_SIZE"])
        assert len(after["TPU_PROCESS_ADDRESSES"].split(",")) == scenario.processes_per_host * hosts
    elif scenario.device == "tpu" and "TPU_PROCESS_ADDRESSES" in after:
        # One process per host: under SPMD the slice's hosts, otherwise a world of one names only itself.
        hosts = int(after["GROUP_WORLD_SIZE"]) if scenario.spmd else 1
        assert len(after["TPU_PROCESS_ADDRESSES"].split(",")) == hosts


@pytest.mark.parametrize(
    "case",
    [case for case in CASES if SCENARIOS[case[1]].processes_per_host],
    ids=[case_id(case) for case in CASES if SCENARIOS[case[1]].processes_per_host],
)
def test_tpu_values_xlarun_presets_are_the_releases_own(case: tuple[Release, str], probe: Probe) -> None:
    release, name = case
    outcome = probe(release)
    planned, alone = outcome["plans"][name], outcome["results"][f"{name}/alone"]
    assert "error" not in alone, alone["error"]
    tpu_planned = {key: value for key, value in planned.items() if key.startswith("TPU_")}
    assert {key: alone["env"].get(key) for key in tpu_planned} == tpu_planned


@pytest.mark.parametrize("case", [case for case in CASES if SCENARIOS[case[1]].shows_break(case[0])], ids=case_id)
def test_where_xlarun_avoids_xla_init_the_release_really_breaks_it(case: tuple[Release, str], probe: Probe) -> None:
    release, name = case
    outcome = probe(release)
    planned, result = outcome["plans"][name], outcome["results"][f"{name}/xla_init"]
    rendezvous = result.get("rendezvous", {})
    numbered = (rendezvous.get("rank"), rendezvous.get("world_size"))
    misnumbered = bool(rendezvous) and numbered != (int(planned["RANK"]), int(planned["WORLD_SIZE"]))
    changed = {key for key in planned if result["env"].get(key) != planned[key]}
    assert "error" in result or changed or misnumbered, "xla:// works here: drop the break from the release facts"


@pytest.mark.parametrize("release", SUPPORTED, ids=lambda release: f"{release[0]}.{release[1]}")
def test_tpu7x_is_refused_exactly_where_the_release_cannot_read_it(release: Release, probe: Probe) -> None:
    result = probe(release)["results"]["tpu7x"]
    readable = "error" not in result
    refused = False
    try:
        preflight(
            "tpu",
            "pjrt",
            tpu_generation=7,
            tpu_library_path="/opt/libtpu.so",
            version_of={"torch": VERSIONS[release], "torch_xla": VERSIONS[release]}.get,
        )
    except UsageError:
        refused = True
    assert readable != refused
    assert readable == (release >= TPU_GENERATION_FIRST_RELEASE[7][1])


@pytest.mark.parametrize("release", SUPPORTED, ids=lambda release: f"{release[0]}.{release[1]}")
def test_every_runtime_call_the_worker_makes_exists(release: Release, probe: Probe) -> None:
    result = next(iter(probe(release)["results"].values()))
    assert result["runtime_names"] == [
        "global_ordinal",
        "is_spmd",
        "process_count",
        "process_index",
        "use_spmd",
        "world_size",
    ]
