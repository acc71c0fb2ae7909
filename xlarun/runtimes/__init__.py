"""Translate a worker's place in the world into the variables its XLA runtime reads.

The launcher sets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``TORCHELASTIC_RUN_ID``, ...); :func:`xla_env` adds what the XLA device needs on top,
as pure functions of the plan, one module per runtime or device:
:mod:`~xlarun.runtimes.pjrt` (every PJRT device), :mod:`~xlarun.runtimes.tpu`,
:mod:`~xlarun.runtimes.neuron`, :mod:`~xlarun.runtimes.cuda`,
:mod:`~xlarun.runtimes.cpu` and :mod:`~xlarun.runtimes.xrt` (torch_xla 2.0 and older); and the
devices' own backends without torch_xla, :mod:`~xlarun.runtimes.torchtpu` (TorchTPU) and
:mod:`~xlarun.runtimes.torchneuron` (TorchNeuron), which get none of torch_xla's variables.
Where torch_xla releases differ, the modules read :attr:`XlaOptions.release` against the
facts in :mod:`~xlarun.runtimes.releases`.

The compile cache (``--compile-cache DIR``, :class:`CompileCache`): each runtime names the variables its
compiler's cache reads, in a folder of DIR of its own (:data:`_CACHE_ENV`); torch_xla alone needs one
writer per directory, which :meth:`CompileCache.writes` picks.

Size: what :func:`xla_env` returns has the same variables with the same fixed text
at any world size; only the digits of numbers (ranks, sizes, ports, bounds) vary.
No value lists one entry per worker, so a worker's environment grows only with the
logarithm of the world size: a few bytes between 2 and a million workers, far below
Linux's 128 KiB limit on one variable. One value lists one entry per host: Neuron under
SPMD across several nodes needs ``NEURON_PJRT_PROCESSES_NUM_DEVICES`` (about 3 bytes a
node, see :mod:`~xlarun.runtimes.neuron`). One lists one entry per device: TorchTPU's address
list (about 18 bytes a device, see :mod:`~xlarun.runtimes.torchtpu`), which torch_tpu itself
requires. A plan where either would pass the limit is refused (:mod:`~xlarun.runtimes.limits`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from xlarun.exceptions import PlanError
from xlarun.host.ports import host_port
from xlarun.ranks import NodeAssignment
from xlarun.runtimes.releases import NEWEST, Release
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from types import ModuleType

    from xlarun.runtimes.megascale import MegaScale
    from xlarun.runtimes.torchtpu import TpuSlice
    from xlarun.runtimes.tpu import TpuTopology

UNPRIVILEGED_PORTS = (1024, 65535)
_PORT_RANGE_SIZE = UNPRIVILEGED_PORTS[1] - UNPRIVILEGED_PORTS[0] + 1
COORDINATOR_PORT_SHIFT = 32256
"""Half of the unprivileged port range: the coordinator port's distance from MASTER_PORT."""

_PJRT_DEVICE_MODULES = ("tpu", "neuron", "cuda", "cpu")
"""The devices with PJRT variables of their own, each in its module; a device not listed (xpu) needs only the
common ones."""

NATIVE_RUNTIMES: Mapping[str, str] = {"torchtpu": "tpu", "torchneuron": "neuron"}
"""The runtimes that are not torch_xla's, each a device's own PyTorch backend, and their device."""

_PLACED_BY_LOCAL_RANK = ("tpu", "neuron", "cuda")
"""The devices whose module says how their runtime places a process by its local rank (``LOCAL_RANK_READER``);
xpu's PJRT plugin does too, and CPU processes share no device."""


def runtime_module(name: str) -> ModuleType:
    """The module of one runtime or device (``cpu``, ``torchtpu``, ...), loaded when a plan first needs it:
    a launch loads its own device's and no other."""
    return importlib.import_module(f"{__name__}.{name}")


_CACHED_RUNTIMES = ("pjrt", "torchtpu", "torchneuron")
"""The runtimes whose module gives its compile cache's variables (``cache_env``); XRT's releases (torch_xla 2.0
and older) have no persistent cache."""
_CACHED_DEVICES = ("neuron",)
"""The devices whose compiler keeps a cache of its own under torch_xla's (Neuron's NEFF), in their module."""

CACHE_WRITERS = ("job", "node")
"""Who writes a torch_xla cache: global rank 0 alone (``job``, for a directory every node may share), or
each node's local rank 0 (``node``, for a directory on each node's own disk)."""


class CompileCache(Struct, frozen=True):
    """``--compile-cache``: the directory (absolute) that every runtime's compile cache goes under, and who
    writes torch_xla's (:data:`CACHE_WRITERS`)."""

    root: str
    writers: str = "job"

    def writes(self, node: NodeAssignment, local_rank: int) -> bool:
        """Whether this worker is its cache directory's one writer.

        The launcher cannot see whether the nodes' DIR is one file system, so by default it plans for the
        case where two writers would race: global rank 0 writes, every other rank only reads (on a disk
        of each node's own, the other nodes then never fill theirs). ``node`` says the directory is each
        node's own, so each node's local rank 0 writes it.
        """
        if self.writers == "node":
            return local_rank == 0
        return node.global_rank(local_rank) == 0


def compile_cache_env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """The variables of the compile cache for one worker: its runtime's, and its device's under torch_xla."""
    cache = options.compile_cache
    if cache is None:
        return {}
    writer = cache.writes(node, local_rank)
    modules = [options.runtime] if options.runtime in _CACHED_RUNTIMES else []
    if options.runtime == "pjrt" and options.device in _CACHED_DEVICES:
        modules.append(options.device)
    variables: dict[str, str] = {}
    for name in modules:
        variables.update(runtime_module(name).cache_env(cache.root, writer))
    return variables


def coordinator_port(master_port: int, override: int | None = None) -> int:
    """The port of the job's XLA coordinator (Neuron root, XLA:GPU coordinator, XRT mesh).

    ``override`` (the user's coordinator port) when given; it only has to differ from
    ``master_port``, which may then be one the launcher has not picked yet (0, as a
    standalone dry run plans it). Otherwise MASTER_PORT moved half
    the unprivileged range (1024-65535) along it, wrapping around:
    ``1024 + (MASTER_PORT - 1024 + 32256) mod 64512``. Every node computes the same
    port from the same MASTER_PORT without talking; it is never MASTER_PORT itself;
    and jobs on neighbouring master ports (29500, 29501, ...) get neighbouring
    coordinator ports far away (61756, 61757, ...) instead of each other's master port,
    as a ``MASTER_PORT + 1`` rule would give.
    """
    if override is not None:
        if override == master_port:
            raise PlanError(f"coordinator port {override} is the master port: choose another port")
        return override
    if not 1 <= master_port <= UNPRIVILEGED_PORTS[1]:
        raise PlanError(f"master port {master_port} is not a TCP port: use 1-65535")
    return UNPRIVILEGED_PORTS[0] + (master_port - UNPRIVILEGED_PORTS[0] + COORDINATOR_PORT_SHIFT) % _PORT_RANGE_SIZE


class XlaOptions(Struct, frozen=True):
    """The XLA side of a launch plan, the same for every worker of the job.

    ``device`` and ``runtime`` are resolved (see :func:`xlarun.devices.resolve_device`
    and :func:`xlarun.packages.resolve_runtime`). ``virtual_devices`` is CPU only.
    ``coordinator_port`` overrides :func:`coordinator_port`'s rule.
    ``tpu_topology`` is the slice shape when known (:func:`xlarun.runtimes.tpu.topology`);
    TPU under SPMD needs it. ``release`` is the installed torch_xla's ``(major, minor)``
    (:data:`~xlarun.runtimes.releases.NEWEST` where none is installed). ``local_units`` is
    how many devices (TPU chips, NeuronCores, GPUs) one node's processes share, when known;
    Neuron under SPMD across nodes needs it. ``tpu_slice`` is what TorchTPU needs to know of the
    slice beyond its shape (:class:`~xlarun.runtimes.torchtpu.TpuSlice`). ``megascale`` holds the
    settings that join several TPU slices into one job (:mod:`~xlarun.runtimes.megascale`), None for one.
    ``compile_cache`` is where the compilers keep what they compiled (:class:`CompileCache`), None for
    the runtimes' own defaults.
    """

    device: str
    runtime: str
    spmd: bool = False
    virtual_devices: int | None = None
    coordinator_port: int | None = None
    tpu_topology: TpuTopology | None = None
    release: Release = NEWEST
    local_units: int | None = None
    tpu_slice: TpuSlice | None = None
    megascale: MegaScale | None = None
    compile_cache: CompileCache | None = None

    def __post_init__(self) -> None:
        if self.virtual_devices is not None and self.device != "cpu":
            raise PlanError(f"virtual devices exist on the cpu device only, not on {self.device}")
        if self.spmd and self.runtime == "xrt":
            raise PlanError("SPMD needs the PJRT runtime, not XRT")
        native_device = NATIVE_RUNTIMES.get(self.runtime)
        if native_device is not None and self.device != native_device:
            raise PlanError(f"the {self.runtime} runtime runs on device {native_device}, not {self.device}")
        if native_device is not None and self.spmd:
            raise PlanError(
                f"SPMD is torch_xla's, and the {self.runtime} runtime has no torch_xla: it runs one process per device"
            )

    def coordinator_port_for(self, node: NodeAssignment) -> int:
        return coordinator_port(node.master_port, self.coordinator_port)

    def coordinator_address(self, node: NodeAssignment) -> str:
        """``MASTER_ADDR:<coordinator port>``, the one address the whole job meets at."""
        return host_port(node.master_addr, self.coordinator_port_for(node))


def xla_env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """Every variable xlarun adds to one worker's environment for XLA.

    torchrun's own variables are not included; the launcher adds them. Raises
    :class:`PlanError` for a plan the device cannot run (e.g. more TPU processes than
    chips) and for a coordinator port equal to the master port.
    """
    if options.coordinator_port is not None:
        # An override equal to MASTER_PORT is refused on every device, also on those
        # that have no coordinator (cpu, xpu, tpu): the same flags must not be accepted
        # on one device and refused on another.
        options.coordinator_port_for(node)
    if options.runtime == "xrt":
        xrt_variables: dict[str, str] = runtime_module("xrt").env(options, node, local_rank)
        return xrt_variables
    variables: dict[str, str]
    if options.runtime in NATIVE_RUNTIMES:
        variables = runtime_module(options.runtime).env(options, node, local_rank)
    else:
        variables = runtime_module("pjrt").env(options, node, local_rank)
        if options.device in _PJRT_DEVICE_MODULES:
            variables.update(runtime_module(options.device).env(options, node, local_rank))
    if options.megascale is not None:
        # libtpu joins the slices, under torch_xla and TorchTPU alike.
        variables.update(options.megascale.variables(node.master_addr))
    variables.update(compile_cache_env(options, node, local_rank))
    return variables


def local_rank_reader(device: str) -> str | None:
    """How the device's runtime places each of several local processes by its local rank, or None
    where it does not (CPU): the reason workers that all get ``LOCAL_RANK=0`` (torchrun's
    ``--virtual-local-rank``) cannot share the host's devices."""
    if device == "xpu":
        from xlarun.runtimes.pjrt import PLUGIN_LOCAL_RANK_READER

        return PLUGIN_LOCAL_RANK_READER
    if device not in _PLACED_BY_LOCAL_RANK:
        return None
    reader: str = runtime_module(device).LOCAL_RANK_READER
    return reader


def apply_user_precedence(planned: dict[str, str], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Let the user's own settings win: drop from ``planned`` every variable ``environ`` has.

    Returns the remaining variables and the notices to print: none, or one line
    naming the kept variables whose value differs from the planned one (a value equal to
    xlarun's changes nothing worth a line), without the ``xlarun:`` prefix the launcher's
    console lines all get. A per-rank value may equal one rank's planned value and not
    another's, so :func:`xlarun.deviceplan.check_device_plan` gathers every rank's notice.
    """
    kept = [name for name in planned if name in environ and environ[name] != planned[name]]
    remaining = {name: value for name, value in planned.items() if name not in environ}
    if not kept:
        return remaining, []
    return remaining, [
        f"keeping your own {', '.join(kept)} from the environment instead of the values xlarun would set"
    ]
