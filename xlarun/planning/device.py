"""Device planning: which device and runtime the workers get, how many, and their XLA variables.

Usage::

    device = plan_device(DeviceRequest("auto", "auto"), environ, nnodes=1, nproc=NprocRequest(word="auto"),
                         dry_run=False)
    nproc = count_workers(NprocRequest(word="auto"), device, environ)
    notices = check_device_plan(device, probe_node)   # lines for the caller to print
    device.variables(node, local_rank)                # what one worker gets

Everything is decided from the host's files (:mod:`xlarun.host.devices`), the installed
packages' metadata (:mod:`xlarun.planning.packages`) and the environment, without importing torch.
The per-runtime translations live in :mod:`xlarun.runtimes`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from xlarun import structs
from xlarun.config import DEFAULT_MASTER_PORT, LaunchConfig, NprocRequest, Topology
from xlarun.exceptions import PlanError
from xlarun.flags import flag
from xlarun.host.devices import (
    host_root,
    local_unit_count,
    nvidia_gpu_count,
    resolve_device,
    tpu_chip_id,
    tpu_generation,
)
from xlarun.planning.packages import (
    FIRST_WITH_CUDA_NAME,
    FIRST_WITHOUT_CUDA,
    device_backend_packages,
    preflight,
    resolve_runtime,
)
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import NATIVE_RUNTIMES, CompileCache, XlaOptions, apply_user_precedence, xla_env
from xlarun.runtimes.releases import installed_version, major_minor, release_of
from xlarun.structs import Struct, field

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.runtimes import torchtpu


class DeviceRequest(Struct, frozen=True):
    """The device side of the command line: device, runtime, SPMD and their kin."""

    device: str = "auto"
    runtime: str = "auto"
    spmd: bool = False
    virtual_devices: int | None = None
    coordinator_port: int | None = None
    compile_cache: CompileCache | None = None


class DevicePlan(Struct, frozen=True):
    """What the device layer decided; the launcher only reports and applies it.

    ``user_environ`` is the launcher's environment: a variable the user set there is kept
    instead of the planned one.
    """

    device: str = "cpu"
    runtime: str = "pjrt"
    xla: XlaOptions | None = None
    spmd: bool = False
    user_environ: Mapping[str, str] = field(default_factory=dict)
    local_units: int | None = None
    """What ``--nproc-per-node auto`` starts: the device's units on this host, or on the host a
    dry run assumes (:data:`DRY_RUN_HOSTS`); None for cpu and xpu, where torchrun's rule applies."""
    notices: tuple[str, ...] = ()
    """Lines to print before the workers start; a dry run shows the same lines."""
    assumed: tuple[str, ...] = ()
    """What a dry run assumed about a machine it cannot see, one line each."""
    torch_xla_version: str | None = None
    """The installed torch_xla, None without one."""

    @property
    def compile_cache(self) -> CompileCache | None:
        """Where the workers' compilers keep what they compiled (``--compile-cache``), None where not asked."""
        return self.xla.compile_cache if self.xla is not None else None

    @property
    def plans_slice_addresses(self) -> bool:
        """TorchTPU's address list: on one node the launcher picks its workers' ports, across nodes
        the rendezvous learns every node's address (see :mod:`~xlarun.runtimes.torchtpu`)."""
        return self.runtime == "torchtpu"

    @property
    def slice_worker(self) -> int | None:
        """This host's place in the job by its TPU slice, where the environment or the cluster says it
        (TorchTPU): its number in the slice, after the hosts of the slices before it where MegaScale joins
        several (their count known from ``TPU_WORKER_HOSTNAMES``)."""
        facts = self.xla.tpu_slice if self.xla is not None else None
        if facts is None or facts.worker is None or self.xla is None:
            return None
        if self.xla.megascale is None:
            return facts.worker
        from xlarun.runtimes import megascale  # a TPU's module: only a TPU plan loads it

        hosts_per_slice = len(facts.worker_hostnames) or None
        return megascale.node_rank(self.xla.megascale, facts.worker, hosts_per_slice) if hosts_per_slice else None

    def variables(self, node: NodeAssignment, local_rank: int) -> dict[str, str]:
        """The XLA variables one worker gets, less those the user set."""
        return self.translate(node, local_rank)[0]

    def translate(self, node: NodeAssignment, local_rank: int) -> tuple[dict[str, str], list[str]]:
        """The variables and the notices naming the user's variables kept instead of planned ones."""
        if self.xla is None:
            return {}, []
        variables, notices = apply_user_precedence(xla_env(self.xla, node, local_rank), self.user_environ)
        if self.xla.megascale is not None:
            # Planned from the user's own values where given, so none is overridden; listed in full, so that
            # a plan shows every worker's MegaScale settings, the same on every host of the job.
            variables.update(self.xla.megascale.variables(node.master_addr))
        return variables, notices


class AssumedHost(Struct, frozen=True):
    """A machine a dry run plans for when this host lacks the device asked for."""

    units: int
    """Its TPU chips, NeuronCores or GPUs: what ``--nproc-per-node auto`` would start there."""
    name: str
    lacking: str
    """What this host lacks, as the dry run's line says it."""
    tpu_chip: str | None = None
    """The PCI device id of its TPU chips (TorchTPU's topologies differ by chip)."""


DRY_RUN_HOSTS: Mapping[str, AssumedHost] = {
    "tpu": AssumedHost(4, "a TPU VM host with 4 chips in 2,2,1 (v4-8, v5p-8)", "TPU chips", tpu_chip="0x005e"),
    "neuron": AssumedHost(32, "a trn1.32xlarge (32 NeuronCores)", "Neuron devices"),
    "cuda": AssumedHost(8, "a host with 8 GPUs", "NVIDIA GPUs"),
}
"""What a dry run on a host without the device assumes, so that a laptop can plan for a TPU VM
or a Trainium instance; docs/devices.md lists these defaults."""

TPU_HOST_8_CHIPS = AssumedHost(
    8, "a TPU VM host with 8 chips in 2,4,1 (v5litepod-8, v6e-8)", "TPU chips", tpu_chip="0x006f"
)
"""The host a TPU dry run assumes instead when the worker count given needs more than 4 chips."""


def plan_device(
    request: DeviceRequest,
    environ: Mapping[str, str],
    *,
    nnodes: int,
    nproc: NprocRequest,
    dry_run: bool,
    user_environ: Mapping[str, str] | None = None,
) -> DevicePlan:
    """Resolve device and runtime, check the installed packages can run them, and plan the variables.

    ``user_environ`` is the launcher's own environment where ``environ`` adds what a cluster says of
    the device (a TPU VM's metadata): only the user's own values are kept instead of planned ones.

    A dry run plans what a real run in the same environment would, with two differences: it
    skips the package checks, and on a host without the device it plans for the host in
    :data:`DRY_RUN_HOSTS`, saying so in :attr:`DevicePlan.assumed` where that changed the plan.
    """
    root = host_root(environ)
    # A device's own runtime names its device: --runtime torchtpu plans for TPU wherever it runs.
    native_device = NATIVE_RUNTIMES.get(request.runtime)
    device = resolve_device(
        native_device if native_device and request.device == "auto" else request.device, environ, root
    )
    torch_xla_version = installed_version("torch_xla")
    runtime = resolve_runtime(request.runtime, torch_xla_version, device, request.spmd)
    notices: list[str] = []
    if (
        device == "cuda"
        and request.device == "auto"
        and "PJRT_DEVICE" not in environ
        and not xla_has_cuda(torch_xla_version)
    ):
        # A GPU host running a plain torchrun job (NCCL, gloo) must not be refused for lack of XLA:GPU.
        device = "cpu"
        if torch_xla_version is not None:
            notices.append(
                f"this host has {nvidia_gpu_count(root)} NVIDIA GPUs, but torch_xla {torch_xla_version} "
                "has no XLA:GPU (only 2.2 to 2.8 do): workers get PJRT_DEVICE=CPU, so XLA tensors go "
                "to the CPU; plain CUDA and NCCL code is unaffected"
            )
    units = local_unit_count(device, root)
    host = assumed_host(device, nproc, request.spmd) if dry_run and units == 0 else None
    host_used = host is not None and nproc.word in ("auto", device) and not request.spmd
    topology = generation = tpu_slice = joined = None
    if device == "tpu":
        # Each device's modules load only where its plan needs them.
        from xlarun.runtimes import megascale, tpu

        joined = megascale.read_megascale(environ)
        generation = tpu.generation_of(environ.get("TPU_ACCELERATOR_TYPE", "")) or tpu_generation(root)
        topology = tpu.topology(environ, units, nnodes, generation)
        if topology is None and host is not None:
            topology = tpu.topology(environ, host.units, nnodes, generation)
            host_used = host_used or topology is not None
    if runtime == "torchtpu":
        from xlarun.runtimes import torchtpu

        tpu_slice = plan_tpu_slice(environ, root, host)
        if nnodes > 1 and torchtpu.slice_topology(topology, tpu_slice) is None and torchtpu.TOPOLOGY not in environ:
            raise PlanError(
                f"TorchTPU across hosts needs the slice's topology, where torch_tpu would put one "
                f"host's: set TPU_HOST_BOUNDS and TPU_CHIPS_PER_HOST_BOUNDS (the tpu-env metadata's "
                f"HOST_BOUNDS and CHIPS_PER_HOST_BOUNDS), TPU_TOPOLOGY (GKE's) or {torchtpu.TOPOLOGY}, "
                f"or on a TPU VM use {flag('cluster')} tpu-vm"
            )
    local_units = node_units = host.units if host is not None else units
    if tpu_slice is not None and local_units:
        # A TPU7x chip exposes two devices, each a rank of its own.
        local_units = node_units = local_units * tpu_slice.devices_per_chip
    if device == "neuron" and environ.get("NEURON_RT_VISIBLE_CORES"):
        from xlarun.runtimes import neuron

        node_units = neuron.visible_core_count(environ["NEURON_RT_VISIBLE_CORES"]) or node_units
    xla = XlaOptions(
        device=device,
        runtime=runtime,
        spmd=request.spmd,
        virtual_devices=request.virtual_devices,
        coordinator_port=request.coordinator_port,
        tpu_topology=topology,
        release=release_of(torch_xla_version),
        local_units=node_units,
        tpu_slice=tpu_slice,
        megascale=joined,
        compile_cache=request.compile_cache,
    )
    if not dry_run:
        preflight(
            device,
            runtime,
            spmd=request.spmd,
            virtual_devices=request.virtual_devices,
            tpu_library_path=environ.get("TPU_LIBRARY_PATH"),
            tpu_generation=generation,
        )
        if units == 0:
            # Detection never picks a device the host lacks: it was asked for, by flag or PJRT_DEVICE.
            raise PlanError(
                f"device {device} was asked for, but this host has no {DRY_RUN_HOSTS[device].lacking}: "
                f"run on a {device} host, or plan for one with {flag('dry_run')}"
            )
    assumed = (assumption(device, host),) if host is not None and host_used else ()
    return DevicePlan(
        device=device,
        runtime=runtime,
        xla=xla,
        spmd=request.spmd,
        user_environ=dict(environ if user_environ is None else user_environ),
        local_units=local_units,
        notices=tuple(notices),
        assumed=assumed,
        torch_xla_version=torch_xla_version,
    )


def plan_tpu_slice(environ: Mapping[str, str], root: str, host: AssumedHost | None) -> torchtpu.TpuSlice:
    """What TorchTPU needs of the slice beyond its shape, from the environment and the host's chips.

    The chip from ``TPU_ACCELERATOR_TYPE``, else the host's PCI ids, else the host a dry run
    assumes. This host's worker number from GKE's ``TPU_WORKER_ID`` (which ``--cluster tpu-vm``
    fills from the metadata's ``agent-worker-number``), else ``JOB_COMPLETION_INDEX`` (Kubernetes
    Indexed Jobs). ``TPU_WORKER_HOSTNAMES`` counts only with two names or more: a single-host
    TPU VM sets it to its own name, as torch_tpu notes. The slice's chips from GKE's ``TPU_TOPOLOGY``.
    """
    from xlarun.runtimes import torchtpu

    chip = (
        torchtpu.chip_of_accelerator_type(environ.get("TPU_ACCELERATOR_TYPE", ""))
        or tpu_chip_id(root)
        or (host.tpu_chip if host is not None else None)
    )
    base_port = _whole_number(environ, torchtpu.BASE_PORT_VARIABLE)
    if base_port is not None and not 1 <= base_port <= 65535:
        raise PlanError(f"{torchtpu.BASE_PORT_VARIABLE}={base_port} is not a TCP port: use 1-65535")
    worker = _whole_number(environ, "TPU_WORKER_ID")
    if worker is None:
        worker = _whole_number(environ, "JOB_COMPLETION_INDEX")
    hostnames = tuple(name for name in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if name)
    mesh = environ.get("TPU_TOPOLOGY")
    return torchtpu.TpuSlice(
        chip=chip,
        base_port=torchtpu.DEFAULT_BASE_PORT if base_port is None else base_port,
        worker=worker,
        worker_hostnames=hostnames if len(hostnames) > 1 else (),
        chip_mesh=torchtpu.chip_mesh(mesh) if mesh else None,
    )


def _whole_number(environ: Mapping[str, str], name: str) -> int | None:
    """``environ[name]`` as a whole number, None where unset or empty; refused where it is not one."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise PlanError(f"{name}={environ[name]!r} is not a whole number")
    return int(text)


def check_slice_seating(device: DevicePlan, topology: Topology, max_nodes: int) -> None:
    """Refuse a job across TPU hosts under TorchTPU where this host's place in the slice is unknown
    (c10d) or past its nodes.

    libtpu maps task ids to chips, and TorchTPU's ranks bind the address list in node-rank order,
    so the node rank must be the host's number in the slice. A c10d rendezvous hands out node
    ranks by arrival; with every host's number known it orders the nodes by it instead.
    """
    worker = device.slice_worker
    if not device.plans_slice_addresses or max_nodes == 1:
        return
    if worker is not None and worker >= max_nodes:
        raise PlanError(
            f"this host is worker {worker} of its TPU slice, past the job's {max_nodes} nodes: give "
            f"{flag('nnodes')} the slice's host count"
        )
    if topology is Topology.C10D and worker is None:
        raise PlanError(
            "TorchTPU across hosts needs each node rank to be the host's worker number in its TPU "
            "slice (libtpu maps task ids to chips), and a c10d rendezvous would hand them out by "
            f"arrival: set TPU_WORKER_ID or JOB_COMPLETION_INDEX, use {flag('cluster')} tpu-vm or "
            f"gke-tpu, or give {flag('node_rank')} with {flag('rdzv_backend')} static"
        )


def assumed_host(device: str, nproc: NprocRequest, spmd: bool) -> AssumedHost | None:
    """The machine a dry run plans for in place of this host, which lacks ``device`` (None for cpu, xpu)."""
    if device == "tpu" and not spmd and (nproc.count or 0) > DRY_RUN_HOSTS["tpu"].units:
        return TPU_HOST_8_CHIPS
    return DRY_RUN_HOSTS.get(device)


def assumption(device: str, host: AssumedHost) -> str:
    """The line a dry run prints for the machine it assumed."""
    another = f"give {flag('nproc_per_node')} N"
    if device == "tpu":
        another = f"set TPU_HOST_BOUNDS and TPU_CHIPS_PER_HOST_BOUNDS, or {another},"
    return f"this host has no {host.lacking}: the plan assumes {host.name}; {another} to plan for another"


TORCHRUN_WORDS = ("auto", "cpu", "gpu", "xpu")
DEVICE_WORDS = ("tpu", "neuron")
"""The devices whose PyTorch backends (TorchTPU, TorchNeuron) take torch's PrivateUse1 name for their own: what
``--nproc-per-node tpu`` or ``neuron`` counts is what ``auto`` counts there, from the host's files, no torch."""
NPROC_ALLOWED = (
    f"expected a positive integer, {', '.join(TORCHRUN_WORDS[:-1])} or {TORCHRUN_WORDS[-1]}, "
    f"{', '.join(DEVICE_WORDS)} or a device backend's name"
)
"""What ``--nproc-per-node`` takes, as its refusals say it."""


def count_workers(request: NprocRequest, device: DevicePlan, environ: Mapping[str, str]) -> int:
    """This node's worker count: a number as given; ``auto`` counts the device's local units.

    Raises :class:`PlanError` worded as a sentence about the requested count.

    Under SPMD one process sees every local device. ``cpu``/``gpu``, and ``auto``
    without an accelerator, follow torchrun's rule: GPUs where the host shows them,
    else CPUs. ``tpu`` and ``neuron`` count what ``auto`` counts on that device; another word is
    torchrun's PrivateUse1 case (``determine_local_world_size``): the installed torch's PrivateUse1
    backend's name, counting the devices that backend sees (:func:`privateuse1_count`).
    """
    if device.spmd:
        if request.count not in (None, 1) or request.word not in (None, "auto"):
            raise PlanError(
                "cannot run under SPMD, where one process per node sees every local device: drop it or set it to 1"
            )
        return 1
    if request.count is not None:
        return request.count
    # Never 0: a host without the device was refused (or a host with it assumed) by plan_device.
    if request.word == "auto" and device.local_units:
        return device.local_units
    if request.word in DEVICE_WORDS:
        if device.device != request.word or not device.local_units:
            raise PlanError(
                f"found no {DRY_RUN_HOSTS[request.word].lacking} on this host (the device is {device.device}): "
                "give a number, cpu or auto"
            )
        return device.local_units
    if request.word not in TORCHRUN_WORDS:
        return privateuse1_count(str(request.word), environ)
    if request.word == "xpu":
        xpus = torch_xpu_count(environ)
        if not xpus:
            raise PlanError("found no XPU on this host (torch.xpu sees none): give a number, cpu or auto")
        return xpus
    cpus = os.cpu_count() or 1
    gpus = nvidia_gpu_count(host_root(environ))
    if request.word == "cpu":
        return cpus
    if request.word == "gpu" and not gpus:
        raise PlanError("found no visible GPU on this host: give a number, cpu or auto")
    return gpus or cpus


XPU_COUNT_PROBE = "import torch; print(torch.xpu.device_count() if torch.xpu.is_available() else 0)"


def torch_xpu_count(environ: Mapping[str, str]) -> int:
    """torchrun 2.10's count for ``--nproc-per-node xpu``: ``torch.xpu.device_count()``.

    Asked of torch in a child process, and only for that word: the launcher itself never
    imports torch on one node, and nothing in /sys says how many devices Level Zero makes
    of a card (a Max 1550 is one or two). 0 where torch or an XPU is missing.
    """
    probe = subprocess.run(
        [sys.executable, "-c", XPU_COUNT_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        stdin=subprocess.DEVNULL,
    )
    words = probe.stdout.split()
    return int(words[-1]) if probe.returncode == 0 and words and words[-1].isdigit() else 0


STAND_IN_WORKER_PORT = 40000
"""The first of the stand-ins for the ports a launch picks for its workers on one host (TorchTPU's):
five digits, as the kernel's picks have, so that the plan's sizes are the real run's."""


def stand_in_ports(device: DevicePlan) -> tuple[int, int]:
    """Two master ports to plan with where the launcher picks the real one: never the coordinator
    port given, which a master port must differ from."""
    override = device.xla.coordinator_port if device.xla is not None else None
    first, second = [port for port in range(DEFAULT_MASTER_PORT, DEFAULT_MASTER_PORT + 3) if port != override][:2]
    return first, second


def probe_node(config: LaunchConfig, device: DevicePlan) -> NodeAssignment:
    """This node as the flags place it, for checking the device plan before any rendezvous.

    A master port the launcher has yet to pick (``--standalone``, and c10d's, which node rank
    0's agent picks at the rendezvous) is planned as a stand-in: the device rules only need
    some port to derive the coordinator's from.
    """
    master_addr, master_port = config.store_address()
    if config.topology in (Topology.STANDALONE, Topology.C10D):
        master_addr, master_port = config.master_addr, stand_in_ports(device)[0]
    node = NodeAssignment.single_node(
        config.rdzv_id,
        config.nproc_per_node,
        master_addr,
        master_port,
        node_rank=min(config.node_rank, config.max_nodes - 1),
        nnodes=config.max_nodes,
    )
    return with_slice_stand_ins(node, config, device)


def with_slice_stand_ins(
    node: NodeAssignment, config: LaunchConfig, device: DevicePlan, variant: int = 0
) -> NodeAssignment:
    """``node`` with stand-ins for what TorchTPU's address list takes from the start or the rendezvous.

    On one node the ports the launcher picks for its workers; across nodes every node's address,
    each assumed as long as this node's own or the store's (:func:`stand_in_node_address`); and the
    job's start, its profiling session. ``variant`` 1 gives the alternative, whose every stand-in
    differs. A c10d node whose number in the slice is known takes that number as its node rank,
    as the rendezvous seats it (:func:`~xlarun.planning.device.check_slice_seating`).
    """
    if not device.plans_slice_addresses:
        return node
    if config.topology in (Topology.STANDALONE, Topology.LONE_NODE):
        first = STAND_IN_WORKER_PORT + variant * node.local_world_size
        return structs.replace(
            node, worker_ports=tuple(range(first, first + node.local_world_size)), job_started_ns=variant
        )
    worker = device.slice_worker
    if config.topology is Topology.C10D and worker is not None:
        node = structs.replace(
            node,
            node_rank=worker,
            nnodes=config.max_nodes,
            rank_offset=worker * node.local_world_size,
            world_size=config.max_nodes * node.local_world_size,
        )
    host = stand_in_node_address(config)
    # The alternative's addresses are as long, so that both plans fit Linux's limit or neither does.
    return structs.replace(node, hosts=("x" * len(host) if variant else host,) * node.nnodes, job_started_ns=variant)


def stand_in_node_address(config: LaunchConfig) -> str:
    """What a plan takes each node's address for before a rendezvous learns them: this node's
    ``--local-addr``, else the address of the job's store."""
    return config.local_addr or config.store_address()[0]


PRIVATEUSE1_PROBE = (
    "import torch; name = torch._C._get_privateuse1_backend_name(); module = getattr(torch, name, None); "
    "print(name, module.device_count() if module is not None and hasattr(module, 'device_count') else 0)"
)


def privateuse1_count(word: str, environ: Mapping[str, str]) -> int:
    """The devices of the installed torch's PrivateUse1 backend named ``word`` (torchrun's
    ``_get_privateuse1_backend_name()`` case, counted with ``torch.<name>.device_count()``).

    A backend takes the name when torch loads it: the packages of the ``torch.backends`` entry point
    group, which ``import torch`` loads. Without one the name is torch's own ``privateuseone`` and the
    word is refused at once; with one, torch is asked in a child process, only for such a word, as for
    ``xpu`` (the launcher itself never imports torch on one node).
    """
    if not device_backend_packages():
        raise PlanError(f"is invalid (no installed package gives torch a device backend): {NPROC_ALLOWED}")
    probe = subprocess.run(
        [sys.executable, "-c", PRIVATEUSE1_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(environ),
        stdin=subprocess.DEVNULL,
    )
    words = probe.stdout.split()
    if probe.returncode != 0 or len(words) < 2 or not words[-1].isdigit():
        raise PlanError(f"is invalid (torch could not be asked for its device backend): {NPROC_ALLOWED}")
    name, count = words[-2], int(words[-1])
    if name != word:
        raise PlanError(f"is invalid (not this torch's device backend, {name}): {NPROC_ALLOWED}")
    if not count:
        raise PlanError(f"found no {name} device on this host (torch.{name} sees none): give a number, cpu or auto")
    return count


def check_device_plan(device: DevicePlan, probe: NodeAssignment) -> list[str]:
    """Translate the probe's workers now, so a plan the device cannot run fails before anything starts.

    The device's rules (chips per host, SPMD, coordinator port) depend only on this node's
    worker count and the flags, not on what a rendezvous later decides. Returns the notices
    to print: the user's own variables kept instead of differing planned ones, each line once.
    """
    notices: list[str] = []
    for local_rank in range(probe.local_world_size):
        notices.extend(notice for notice in device.translate(probe, local_rank)[1] if notice not in notices)
    return notices


def cpu_split_world(device: DevicePlan, nproc_per_node: int, nnodes: int) -> str | None:
    """Why XLA collectives cannot join these CPU processes, or None where they can (or XLA is absent).

    PJRT's CPU client has no cross-process collectives: every CPU process is an XLA world
    of one, whatever the launcher says, so ``init_process_group("xla")`` or ``xla://``
    joins nothing (on one node each process even serves the store itself).
    """
    if (
        device.device != "cpu"
        or device.runtime != "pjrt"
        or device.spmd
        or nproc_per_node * nnodes < 2
        or device.torch_xla_version is None
    ):
        return None
    processes = f"{nproc_per_node}" if nnodes == 1 else f"{nproc_per_node} x {nnodes}"
    return (
        f"PJRT's CPU client makes each of the {processes} CPU processes an XLA world of its own (rank 0 of "
        f"1), so init_process_group('xla') and xla:// join no other process; for several XLA devices use "
        f"{flag('spmd')} {flag('virtual_devices')} N (one process), for collectives between CPU processes "
        "the gloo backend"
    )


def xla_has_cuda(torch_xla_version: str | None) -> bool:
    """XLA:GPU exists in torch_xla 2.2 to 2.8 only."""
    return torch_xla_version is not None and FIRST_WITH_CUDA_NAME <= major_minor(torch_xla_version) < FIRST_WITHOUT_CUDA
