"""TorchTPU (``torch_tpu`` 0.2.0, torch 2.11 to 2.15, on libtpu; no torch_xla): what a worker needs
before its interpreter starts.

Facts, from ``../shared/reference/torchtpu-torchneuron.md`` (read from the 0.2.0 wheel, run on a CPU
machine; nothing here ran on a TPU):

- Three values are decided in the parent, before any worker starts, and are identical on every rank
  ("Nothing upstream populates these", ``torch_tpu/_internal/distributed/distributed.py``):
  ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one ``host:port`` per rank), ``TORCH_TPU_TOPOLOGY`` and
  ``TORCH_TPU_XPROF_SESSION_ID``. The C++ reads each once, at first use, so they must be in the
  environment when the interpreter starts. torch_tpu's own recipe is to ``eval`` the ``KEY="value"``
  lines of ``python -m torch.tpu.distributed`` and then run torchrun; xlarun plans them itself.
- A worker takes entry ``RANK % len(addresses)`` as its own and binds its port; each entry must split
  on ``:`` into exactly two parts, so an IPv6 literal cannot be one. From ``LOCAL_RANK`` and the
  list it derives libtpu's ``TPU_VISIBLE_DEVICES``, ``TPU_PROCESS_*``, ``TPU_HOST_BOUNDS`` and
  ``CLOUD_TPU_TASK_ID`` itself, overwriting any a launcher would set: so xlarun sets none of
  torch_xla's variables (``PJRT_DEVICE``, ``TPU_VISIBLE_CHIPS``, ...), only torchrun's contract and these.
- One host (:func:`set_tpu_launch_env`'s single-host path): ``localhost:<port>``, one per rank, on
  ports picked unused (portpicker; nothing holds them). xlarun picks them free too, at each attempt
  (:attr:`~xlarun.ranks.NodeAssignment.worker_ports`).
- Several hosts: ``<host>:<TORCH_TPU_BASE_PORT + i>`` (base 8070), ``i`` below the devices per host,
  host-major in ``TPU_WORKER_HOSTNAMES`` order; the list does not depend on the node rank, so every
  host builds the same bytes. xlarun takes the hosts from the rendezvous, in node-rank order
  (:attr:`~xlarun.ranks.NodeAssignment.hosts`, each node's ``--local-addr`` or name), so neither
  ``TPU_WORKER_HOSTNAMES`` nor the metadata server is needed; where the user set
  ``TPU_WORKER_HOSTNAMES``, it must name as many hosts as joined.
- RANK is ``NODE_RANK * D + LOCAL_RANK`` and rank r binds entry r, so the node rank must be the host's
  place in the slice: libtpu maps task ids to chips. A host's worker number (the metadata's
  ``agent-worker-number``, GKE's ``TPU_WORKER_ID`` or ``JOB_COMPLETION_INDEX``), where known, must
  equal its node rank.
- ``TORCH_TPU_TOPOLOGY``: on one host torch_tpu's table by chip kind and device count
  (:data:`TOPOLOGY_BY_CHIP`; a count it lacks raises ``No TPU topology found for count``). Across
  hosts torch_tpu would fill in *this host's* topology; xlarun sets the slice's (chips per host times
  the host grid, or GKE's ``TPU_TOPOLOGY``; the devices per chip appended on TPU7x), and leaves it out
  where it does not know it.
- ``TORCH_TPU_XPROF_SESSION_ID`` is ``str(time.time_ns())``, per host in torch_tpu's recipe; xlarun
  gives the whole job one (:attr:`~xlarun.ranks.NodeAssignment.job_started_ns`).
- ``TORCH_TPU_DEVICES_PER_HOST``: with it and ``LOCAL_RANK`` the process group keeps a node-local
  store in ``/dev/shm`` (otherwise it warns "Node-local store disabled"); torch_tpu's recipe never
  sets it.

- Several slices (multislice, :mod:`~xlarun.runtimes.megascale`): the slice builder joins one slice's
  chips, and MegaScale joins the slices. So the address list, the topology and the devices per host are
  the slice's (:func:`this_slice`): its hosts only, as ``set_tpu_launch_env`` builds them from that
  slice's ``TPU_WORKER_HOSTNAMES``; a worker takes entry ``RANK % len``, its own place in its slice
  since node ranks count slice by slice. The profiling session is the job's, one for every slice.

The compile cache (``--compile-cache``, :func:`cache_env`), read from torch_tpu 0.2.0's libraries
(``csrc/common/tier2_compilation_cache.cc``'s strings; nothing ran on a TPU): tier 2 is a cache on the
host, under ``/dev/shm/torch_tpu_cache``, named by ``TORCH_TPU_TIER2_COMPILATION_CACHE``, shared by the
host's processes through a lock file per entry, and disabled at world size 1; tier 3 is a directory (or
``gs://``) under ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``, with a path of its own per process
("Tier-3 compilation cache path for this process"). Both are read once, at first use. xlarun names tier
2 after the cache's directory (:func:`tier2_name`), so runs with one ``--compile-cache`` share it while
the host's memory keeps it, and roots tier 3 in the directory: every rank gets both, as torch_tpu
itself keeps its processes apart.

The address list is the one value that grows with the job, about 18 bytes a device: past Linux's
limit for one variable at about 7,280 devices (:mod:`~xlarun.runtimes.limits`), where it is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

from xlarun.exceptions import PlanError
from xlarun.runtimes.limits import check_variable_size
from xlarun.runtimes.megascale import MegaScale
from xlarun.runtimes.tpu import TpuTopology
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions

ADDRESSES = "TORCH_TPU_SLICEBUILDER_ADDRESSES"
TOPOLOGY = "TORCH_TPU_TOPOLOGY"
SESSION_ID = "TORCH_TPU_XPROF_SESSION_ID"
DEVICES_PER_HOST = "TORCH_TPU_DEVICES_PER_HOST"
BASE_PORT_VARIABLE = "TORCH_TPU_BASE_PORT"
TIER2_CACHE = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TIER3_CACHE_ROOT = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
CACHE_SUBDIRECTORY = "torchtpu"

DEFAULT_BASE_PORT = 8070
"""torch_tpu's first port on every host of a multi-host job, unless ``TORCH_TPU_BASE_PORT`` says another."""

_V4_V5P = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}
TOPOLOGY_BY_CHIP: Mapping[str, Mapping[int, str]] = {
    "0x005e": _V4_V5P,  # v4
    "0x0062": _V4_V5P,  # v5p
    "0x0063": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},  # v5e (open-source build; Google's internal one: 2,2,2)
    "0x006f": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},  # v6e
    "0x0076": {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},  # TPU7x: the 4th field is the devices per chip
}
"""torch_tpu 0.2.0's single-host topologies, by the chips' PCI device id and the device count
(``torch_tpu/_internal/utils/hardware.py``): the count is the workers asked for, or the host's devices."""

CHIP_NAMES: Mapping[str, str] = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e", "0x0076": "TPU7x"}

DEVICES_PER_CHIP: Mapping[str, int] = {"0x0076": 2}
"""Devices a chip exposes where more than one (``hardware.py``'s ``_DEVICES_PER_CHIP``: TPU7x splits its two
TensorCores into two devices, so a 4-chip host runs 8 ranks); one elsewhere, megacore v4 and v5p included."""

ACCELERATOR_CHIPS: Mapping[str, str] = {
    "v4": "0x005e",
    "v5p": "0x0062",
    "v5litepod": "0x0063",
    "v5e": "0x0063",
    "v6e": "0x006f",
    "tpu7x": "0x0076",
}
"""The chip of an accelerator type's name before its ``-<size>`` (``v5litepod-16``: v5e)."""


class TpuSlice(Struct, frozen=True):
    """What the launcher knows of the TPU slice beyond its shape (:class:`~xlarun.runtimes.tpu.TpuTopology`).

    ``chip`` is the chips' PCI device id (:data:`TOPOLOGY_BY_CHIP`), ``base_port`` the first port of every
    host's addresses, ``worker`` this host's number in the slice where something says it,
    ``worker_hostnames`` the user's ``TPU_WORKER_HOSTNAMES`` (checked against the hosts that joined), and
    ``chip_mesh`` the slice's chips as GKE's ``TPU_TOPOLOGY`` gives them (``2x4x4``, written ``2,4,4``).
    """

    chip: str | None = None
    base_port: int = DEFAULT_BASE_PORT
    worker: int | None = None
    worker_hostnames: tuple[str, ...] = ()
    chip_mesh: str | None = None

    @property
    def devices_per_chip(self) -> int:
        return DEVICES_PER_CHIP.get(self.chip or "", 1)


def chip_of_accelerator_type(accelerator_type: str) -> str | None:
    """The chip of an accelerator type such as ``v6e-8`` (``0x006f``), or None."""
    return ACCELERATOR_CHIPS.get(accelerator_type.rpartition("-")[0].lower())


def single_host_topology(chip: str | None, devices: int) -> str:
    """``TORCH_TPU_TOPOLOGY`` for ``devices`` ranks on one host of ``chip``, as torch_tpu's table has it."""
    table = TOPOLOGY_BY_CHIP.get(chip or "")
    if table is None:
        raise PlanError(
            f"TorchTPU has no topology for TPU chips of PCI id {chip}: it knows {', '.join(CHIP_NAMES.values())}"
        )
    if devices not in table:
        raise PlanError(
            f"TorchTPU has no topology for {devices} devices on one {CHIP_NAMES[chip or '']} host: "
            f"run {', '.join(map(str, table))} workers"
        )
    return table[devices]


def chip_mesh(text: str) -> str:
    """A chip mesh such as GKE's ``TPU_TOPOLOGY`` (``2x4x4``; v5e and v6e have two fields, ``4x4``) in
    ``TORCH_TPU_TOPOLOGY``'s spelling, three fields (``2,4,4``, ``4,4,1``), as torch_tpu pads them."""
    fields = re.split(r"[xX,]", text.strip())
    if not 2 <= len(fields) <= 3 or not all(field.isdigit() and int(field) > 0 for field in fields):
        raise PlanError(f"TPU_TOPOLOGY={text!r} is not a slice's chip mesh such as 2x4x4 or 4x4")
    return ",".join(str(int(field)) for field in [*fields, "1"][:3])


def slice_topology(shape: TpuTopology | None, facts: TpuSlice) -> str | None:
    """``TORCH_TPU_TOPOLOGY`` for a whole slice, or None where unknown: its chip mesh (the host grid times
    each host's chip grid, else GKE's ``TPU_TOPOLOGY``), with the devices per chip as a fourth field
    where there are several (TPU7x), as on one host."""
    mesh = shape.one_chip_process_bounds() if shape is not None else facts.chip_mesh
    if mesh is None or facts.devices_per_chip == 1:
        return mesh
    return f"{mesh},{facts.devices_per_chip}"


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """TorchTPU's variables for one worker (see the module docstring); none depends on the local rank."""
    facts = options.tpu_slice or TpuSlice()
    if node.world_size != node.nnodes * node.local_world_size:
        raise PlanError(
            f"TorchTPU runs as many workers on every host (rank r binds entry r of one list), but "
            f"{node.world_size} workers on {node.nnodes} nodes are not {node.local_world_size} each"
        )
    first, hosts = this_slice(node, options.megascale)
    if node.worker_ports:
        addresses = ",".join(f"localhost:{port}" for port in node.worker_ports)
    else:
        addresses = slice_addresses(node, facts, first, hosts)
    check_variable_size(ADDRESSES, addresses, f"{hosts * node.local_world_size} devices on {hosts} hosts")
    variables = {
        ADDRESSES: addresses,
        DEVICES_PER_HOST: str(node.local_world_size),
        SESSION_ID: str(node.job_started_ns),
    }
    shape = options.tpu_topology
    if hosts == 1:
        variables[TOPOLOGY] = single_host_topology(facts.chip, node.local_world_size)
        return variables
    if shape is not None and node.local_world_size != shape.chips_per_host * facts.devices_per_chip:
        raise PlanError(
            f"TorchTPU across hosts runs one worker per device, "
            f"{shape.chips_per_host * facts.devices_per_chip} on each host of the slice, "
            f"not {node.local_world_size}"
        )
    topology = slice_topology(shape, facts)
    if topology is not None:
        variables[TOPOLOGY] = topology
    return variables


def this_slice(node: NodeAssignment, joined: MegaScale | None) -> tuple[int, int]:
    """The first node rank of this host's TPU slice and the slice's host count: the whole job for one slice.

    Several slices (``joined``) split the nodes into as many hosts each, slice s holding node ranks
    s × hosts per slice onwards (:func:`~xlarun.runtimes.megascale.node_rank`). The slice builder
    joins one slice's chips, so its address list and topology are the slice's; MegaScale joins the
    slices. Refuses nodes that do not split evenly and a node rank outside its slice's.
    """
    if joined is None:
        return 0, node.nnodes
    if node.nnodes % joined.slices:
        raise PlanError(
            f"{node.nnodes} nodes do not make {joined.slices} TPU slices of as many hosts each: every "
            "slice of a multislice job must have as many hosts"
        )
    hosts = node.nnodes // joined.slices
    first = joined.slice_id * hosts
    if not first <= node.node_rank < first + hosts:
        raise PlanError(
            f"node rank {node.node_rank} is not one of slice {joined.slice_id}'s ({first} to "
            f"{first + hosts - 1}, {hosts} hosts a slice): the node rank must be slice id x hosts "
            "per slice + the host's worker number"
        )
    return first, hosts


def slice_addresses(node: NodeAssignment, facts: TpuSlice, first: int = 0, hosts: int | None = None) -> str:
    """The list of this host's slice, the ``hosts`` nodes from node rank ``first`` (every node by default):
    ``<host>:<base + i>``, host-major in node-rank order, the same on every host of the slice.

    Refuses a host whose number in the slice is not its node rank's place in it, a
    ``TPU_WORKER_HOSTNAMES`` that names another count of hosts, and IPv6 literals (an entry must split
    on ``:`` in two).
    """
    hosts = node.nnodes if hosts is None else hosts
    if len(node.hosts) != node.nnodes:
        raise PlanError(
            f"TorchTPU's address list needs the addresses of all {node.nnodes} nodes, which only a rendezvous learns"
        )
    if facts.worker is not None and facts.worker != node.node_rank - first:
        raise PlanError(
            f"this host is worker {facts.worker} of its TPU slice but node rank {node.node_rank}: "
            "libtpu maps task ids to chips, so the node rank must be the slice's worker number"
            + (f" after the {first} hosts of the slices before it" if first else "")
        )
    if facts.worker_hostnames and len(facts.worker_hostnames) != hosts:
        raise PlanError(
            f"TPU_WORKER_HOSTNAMES names {len(facts.worker_hostnames)} hosts, but {hosts} "
            + ("nodes joined the job" if hosts == node.nnodes else "nodes make a slice")
        )
    slice_hosts = node.hosts[first : first + hosts]
    literal = next((host for host in slice_hosts if ":" in host), None)
    if literal is not None:
        raise PlanError(
            f"TorchTPU splits each address on ':' in two, so node address {literal} cannot be one: "
            "give the nodes IPv4 addresses or names"
        )
    return ",".join(
        f"{host}:{facts.base_port + index}" for host in slice_hosts for index in range(node.local_world_size)
    )


def tier2_name(root: str) -> str:
    """Tier 2's name for the cache in ``root``: the same for every run given that directory, another for
    another directory, and a plain file name (torch_tpu places it under ``/dev/shm``)."""
    return "xlarun-" + hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]


def cache_env(root: str, writer: bool) -> dict[str, str]:
    """TorchTPU's tier 2 name and tier 3 root (``root``'s :data:`CACHE_SUBDIRECTORY`), the same for every rank."""
    return {TIER2_CACHE: tier2_name(root), TIER3_CACHE_ROOT: os.path.join(root, CACHE_SUBDIRECTORY)}
