"""What xlarun checks and plans per device and per installed torch_xla release, without hardware.

- A device whose runtime package is missing is refused alike for every device; a dry run,
  which plans for other machines, is not refused (a device this host lacks, launched for real:
  ``tests/launch/test_device_checks.py``).
- Releases outside the supported range, TPU7x before 2.9 and XPU before 2.4 are refused.
- The translations and the worker's ``init_method`` follow the installed release
  (:mod:`xlarun.runtimes.releases`); ``tests/launch/test_release_matrix.py`` runs each release's own
  code on them.
- An empty master address is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO, TESTS, prepare, refusal

from xlarun import worker as worker_side
from xlarun.exceptions import UsageError
from xlarun.planning import packages
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, neuron, xla_env
from xlarun.runtimes.releases import NEWEST, SUPPORTED, release_of, xla_init_break

HOSTS = TESTS / "fixtures" / "hosts"


def installed(tmp_path: Path, **versions: str) -> dict[str, str]:
    """An environment whose Python finds these distributions first (xlarun reads only their metadata)."""
    site = tmp_path / "site"
    for name, version in versions.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def nodes(nnodes: int, nproc: int, node_rank: int) -> NodeAssignment:
    return NodeAssignment.single_node("job", nproc, "10.0.0.1", 29500, node_rank=node_rank, nnodes=nnodes)


# --- a device or runtime this host lacks ------------------------------------------------------------


@pytest.mark.torch_xla  # torch_xla's own packages; the TorchTPU stack brings libtpu
@pytest.mark.parametrize(
    "device, message",
    [
        ("tpu", "device tpu needs libtpu"),
        ("neuron", "device neuron needs the AWS Neuron SDK's libneuronxla package"),
    ],
)
def test_a_missing_runtime_package_is_refused_alike_for_every_device(device: str, message: str) -> None:
    assert message in refusal("--device", device, "t.py", env={"XLARUN_HOST_ROOT": str(HOSTS / "gce-cpu-vm")})


@pytest.mark.parametrize("device", ["tpu", "neuron", "cuda"])
def test_a_dry_run_plans_for_a_machine_this_host_is_not(device: str) -> None:
    assert prepare("--dry-run", "--device", device, "t.py").device.device == device


@pytest.mark.torch_xla  # under TorchTPU a TPU_LIBRARY_PATH that names no file is refused
def test_the_host_check_counts_the_devices_it_finds() -> None:
    # A TPU VM host with its libtpu: nothing to refuse.
    env = {"XLARUN_HOST_ROOT": str(HOSTS / "tpu-v4-vm"), "TPU_LIBRARY_PATH": "/opt/libtpu.so"}
    assert prepare("--device", "tpu", "--nproc-per-node", "auto", "t.py", env=env).config.nproc_per_node == 4


# --- releases ----------------------------------------------------------------------------------------


def versions(torch_xla: str, **others: str) -> packages.VersionLookup:
    return {"torch_xla": torch_xla, "torch": torch_xla, "libtpu": "0.0.21", "libneuronxla": "2.2.0", **others}.get


@pytest.mark.parametrize("version", ["2.10.0", "3.0.0"])
def test_a_release_newer_than_the_supported_ones_is_refused_naming_them(version: str) -> None:
    with pytest.raises(UsageError, match=r"newer than .*\(2\.1 to 2\.9 under PJRT, or 2\.0 and older under XRT\)"):
        packages.preflight("tpu", "pjrt", version_of=versions(version))
    packages.preflight("cpu", "pjrt", version_of=versions(version))  # plain CPU workers need no XLA


@pytest.mark.parametrize("version, refused", [("2.8.1", True), ("2.9.0", False)])
def test_tpu7x_needs_torch_xla_2_9(version: str, refused: bool) -> None:
    check = lambda: packages.preflight("tpu", "pjrt", tpu_generation=7, version_of=versions(version))  # noqa: E731
    if refused:
        with pytest.raises(UsageError, match="TPU7x chips need torch_xla 2.9 or newer"):
            check()
    else:
        check()
    packages.preflight("tpu", "pjrt", tpu_generation=4, version_of=versions(version))


def test_tpu7x_is_read_from_the_accelerator_type_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's chips are v4s; the accelerator type names TPU7x, which torch_xla 2.8 cannot drive.
    site = installed(tmp_path, torch_xla="2.8.1", torch="2.8.0")["PYTHONPATH"].split(os.pathsep)[0]
    monkeypatch.syspath_prepend(site)
    env = {"XLARUN_HOST_ROOT": str(HOSTS / "tpu-v4-vm"), "TPU_LIBRARY_PATH": "/opt/libtpu.so"}
    with pytest.raises(UsageError, match="TPU7x chips need torch_xla 2.9 or newer"):
        prepare("--device", "tpu", "t.py", env={**env, "TPU_ACCELERATOR_TYPE": "tpu7x-8"})
    assert prepare("--device", "tpu", "t.py", env={**env, "TPU_ACCELERATOR_TYPE": "v4-8"}).device.device == "tpu"


@pytest.mark.parametrize("version, refused", [("2.3.0", True), ("2.4.0", False)])
def test_xpu_needs_its_plugin(version: str, refused: bool) -> None:
    if refused:
        with pytest.raises(UsageError, match="device xpu needs torch_xla 2.4 or newer"):
            packages.preflight("xpu", "pjrt", version_of=versions(version))
    else:
        packages.preflight("xpu", "pjrt", version_of=versions(version))


def test_the_release_is_read_from_metadata_and_the_newest_is_planned_without_torch_xla() -> None:
    assert release_of("2.5.1+libtpu") == (2, 5)
    assert release_of(None) == NEWEST == SUPPORTED[-1]


@pytest.mark.parametrize(
    "release, device, spmd, local_processes, breaks",
    [
        ((2, 1), "tpu", True, 1, True),  # the rendezvous returns device ordinals under SPMD
        ((2, 2), "tpu", True, 1, False),
        ((2, 1), "neuron", False, 4, True),  # initialize_env overwrites the process index
        ((2, 4), "neuron", False, 4, True),
        ((2, 5), "neuron", False, 4, False),
        ((2, 5), "neuron", False, 1, True),  # no configure_single_process
        ((2, 6), "neuron", True, 1, True),
        ((2, 7), "neuron", False, 1, False),
        ((2, 9), "xpu", False, 1, True),
        ((2, 9), "xpu", False, 2, False),
        ((2, 1), "tpu", False, 1, False),  # fixed by presetting the one-chip world instead
        ((2, 9), "cpu", False, 2, False),
    ],
)
def test_xla_init_breaks_where_the_release_facts_say(release, device, spmd, local_processes, breaks) -> None:
    assert (xla_init_break(release, device, spmd=spmd, local_processes=local_processes) is not None) == breaks


@pytest.mark.parametrize(
    "version, environ, backend, spmd, method",
    [
        ("2.5.1", {"PJRT_DEVICE": "NEURON", "LOCAL_WORLD_SIZE": "1"}, "xla", False, "env://"),
        ("2.7.0", {"PJRT_DEVICE": "NEURON", "LOCAL_WORLD_SIZE": "1"}, "xla", False, "xla://"),
        ("2.1.0", {"PJRT_DEVICE": "NEURON", "LOCAL_WORLD_SIZE": "8"}, "xla", False, "env://"),
        ("2.1.0", {"PJRT_DEVICE": "TPU", "LOCAL_WORLD_SIZE": "1"}, "gloo", True, "env://"),
        ("2.9.0", {"PJRT_DEVICE": "TPU", "LOCAL_WORLD_SIZE": "1"}, "gloo", True, "xla://"),
        ("2.9.0", {"PJRT_DEVICE": "TPU", "LOCAL_WORLD_SIZE": "4"}, "gloo", False, "env://"),
    ],
)
def test_the_worker_joins_with_what_works_on_its_release(
    monkeypatch: pytest.MonkeyPatch, version: str, environ: dict[str, str], backend: str, spmd: bool, method: str
) -> None:
    monkeypatch.setattr(worker_side, "installed_version", lambda name: version)
    assert worker_side.default_init_method(backend, spmd, environ) == method


# --- translations per release ---------------------------------------------------------------------------


def test_tpu_before_2_4_gets_the_one_chip_world_xla_init_would_not_set() -> None:
    env = xla_env(XlaOptions("tpu", "pjrt", release=(2, 1)), nodes(2, 1, 1), 0)
    assert {
        key: env[key]
        for key in (
            "TPU_VISIBLE_CHIPS",
            "TPU_CHIPS_PER_PROCESS_BOUNDS",
            "TPU_PROCESS_BOUNDS",
            "TPU_PROCESS_ADDRESSES",
            "CLOUD_TPU_TASK_ID",
        )
    } == {
        "TPU_VISIBLE_CHIPS": "0",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_ADDRESSES": "localhost:8476",
        "CLOUD_TPU_TASK_ID": "0",
    }
    later = xla_env(XlaOptions("tpu", "pjrt", release=(2, 4)), nodes(2, 1, 1), 0)
    assert not {"TPU_PROCESS_BOUNDS", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID"} & set(later)


def test_neuron_before_2_5_gets_its_core_which_import_does_not_set() -> None:
    assert xla_env(XlaOptions("neuron", "pjrt", release=(2, 1)), nodes(2, 4, 1), 3)["NEURON_RT_VISIBLE_CORES"] == "3"
    assert "NEURON_RT_VISIBLE_CORES" not in xla_env(XlaOptions("neuron", "pjrt", release=(2, 5)), nodes(2, 4, 1), 3)


@pytest.mark.parametrize("release, flag", [((2, 1), False), ((2, 4), False), ((2, 5), True), ((2, 9), True)])
def test_xla_use_spmd_only_where_neurons_import_time_set_up_reads_it(release, flag: bool) -> None:
    options = XlaOptions("neuron", "pjrt", spmd=True, release=release, local_units=32)
    assert ("XLA_USE_SPMD" in xla_env(options, nodes(1, 1, 0), 0)) == flag
    cpu = xla_env(XlaOptions("cpu", "pjrt", spmd=True, virtual_devices=2, release=release), nodes(1, 1, 0), 0)
    assert "XLA_USE_SPMD" not in cpu and cpu["XLARUN_SPMD"] == "1"


def test_neuron_spmd_across_nodes_counts_the_users_visible_cores() -> None:
    env = {"XLARUN_HOST_ROOT": str(HOSTS / "trn1-32xlarge"), "NEURON_RT_VISIBLE_CORES": "0-15"}
    prepared = prepare(
        "--dry-run",
        "--device",
        "neuron",
        "--spmd",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "t.py",
        env=env,
    )
    variables = prepared.device.variables(nodes(2, 1, 1), 0)
    assert variables["NEURON_PJRT_PROCESSES_NUM_DEVICES"] == "16,16"
    assert variables["NEURON_PJRT_PROCESS_INDEX"] == "1"


@pytest.mark.parametrize("cores, count", [("8-15", 8), ("0,2,4-5", 4), ("3", 1), ("x", None), ("5-", None)])
def test_visible_core_count(cores: str, count: int | None) -> None:
    assert neuron.visible_core_count(cores) == count


def test_neuron_cores_per_node_list_is_refused_past_linuxs_limit() -> None:
    with pytest.raises(UsageError, match="128 KiB"):
        neuron.processes_num_devices(128, 40_000)


# --- the master address -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, env, source",
    [
        (["--master_addr", ""], {}, "--master-addr=''"),
        (["--master-addr", "  "], {}, "--master-addr='  '"),
        ([], {"PET_MASTER_ADDR": ""}, "--master-addr (from PET_MASTER_ADDR)=''"),
    ],
)
def test_an_empty_master_address_is_refused(argv: list[str], env: dict[str, str], source: str) -> None:
    assert refusal(*argv, "t.py", env=env) == f"{source} is invalid (empty): expected a host name or address"


# --- TorchNeuron's torch pairing: the requirement in torch-neuronx's own metadata ---------------------------


@pytest.mark.parametrize(
    "metadata, requirement",
    [
        ("Requires-Dist: torch==2.13.*\n", "==2.13.*"),
        ("Requires-Dist: torch (==2.14.*)\n", "==2.14.*"),  # the older parenthesised form
        ("Requires-Dist: torch >=2.13, <2.15 ; python_version >= '3.10'\n", ">=2.13,<2.15"),
        ("Requires-Dist: torch-xla==2.9.*\nRequires-Dist: torch[opt]==2.9.*\n", "==2.9.*"),
        ("Requires-Dist: torch==2.13.*; extra == 'dev'\n", None),  # an extra's requirement is optional
        ("Requires-Dist: numpy\n\nRequires-Dist: torch==9.9.*\n", None),  # the description is not metadata
    ],
)
def test_the_torch_requirement_is_read_from_the_installed_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metadata: str, requirement: str | None
) -> None:
    folder = tmp_path / "torch_neuronx-2.13.3.0.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-neuronx\n{metadata}")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert packages.installed_torch_requirement("torch-neuronx") == requirement


@pytest.mark.parametrize(
    "version, specifier, meets",
    [
        ("2.13.1+cpu", "==2.13.*", True),
        ("2.9.0", "==2.13.*", False),
        ("2.13.0a0+git1", "==2.13.*", True),
        ("2.14.1", ">=2.13,<2.15", True),
        ("2.15.0", ">=2.13,<2.15", False),
        ("2.14.3", "~=2.14.0", True),
        ("2.15.0", "~=2.14.0", False),
        ("2.13", "==2.13.0", True),
        ("2.13.2", "!=2.13.*", False),
    ],
)
def test_a_version_meets_a_requirement_clause_by_clause(version: str, specifier: str, meets: bool) -> None:
    assert packages.satisfies(version, specifier) is meets


@pytest.mark.parametrize("torch, refused", [("2.9.0", True), ("2.13.1", False), (None, True)])
def test_torchneuron_pairs_with_the_torch_its_package_requires(torch: str | None, refused: bool) -> None:
    lookup = {"torch_neuronx": "2.13.3.0", "torch-neuronx": "2.13.3.0", "torch": torch}.get
    check = lambda: packages.preflight(
        "neuron",
        "torchneuron",
        version_of=lookup,  # noqa: E731
        torch_requirement_of={"torch-neuronx": "==2.13.*"}.get,
    )
    if refused:
        with pytest.raises(UsageError, match=r"^torch-neuronx 2\.13\.3\.0 needs torch==2\.13\.\* \(its requirement\)"):
            check()
    else:
        check()
