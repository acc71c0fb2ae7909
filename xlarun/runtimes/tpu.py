"""TPU variables under PJRT, in agreement with the TPU set-up of torch_xla 2.1 to 2.9.

torch_xla's ``xla://`` rendezvous configures a torchrun worker in
``torch_xla._internal.tpu``: ``configure_topology`` (several processes per host, one chip
each) or, from 2.4, ``configure_one_chip_topology`` (one process per host). Both only
*default* the variables (``os.environ.setdefault``), so values xlarun puts in the
environment win.

One chip per process (the default): xlarun presets the chip, the process port and,
when the slice's topology is known and a host runs several processes, the process
bounds, each the value torch_xla computes itself. Programs that never reach torch_xla's
``xla://`` set-up (``env://``, no process group) still get one chip each instead of
every process claiming the whole host. It leaves out two variables on purpose (but for
the one-chip world below, where they name the process itself):

- ``TPU_PROCESS_ADDRESSES``, one ``host:port`` per process of the slice: it grows
  with the world, and torch_xla derives it from the TPU metadata (or
  ``TPU_WORKER_HOSTNAMES``).
- ``CLOUD_TPU_TASK_ID``: torch_xla derives it as ``worker_id * local_world_size +
  local_rank`` from the TPU worker id, the truth about which host this is. Under
  ``TPU_SKIP_MDS_QUERY`` torch_xla also reads a preset ``CLOUD_TPU_TASK_ID`` *as* that
  worker id, so presetting it would make torch_xla misname its host.

SPMD (one process per host): torch_xla's ``xla://`` rendezvous calls
``configure_one_chip_topology`` for a single local process (2.4 and later; earlier,
``configure_topology`` with one chip per process), which would pin the process to chip
0. Presetting the whole-host topology (every chip visible, the host's chip bounds per
process, the slice's host bounds) keeps all chips in the process.

One process per host without SPMD: from 2.4 torch_xla makes that process a world of one
chip. Before 2.4 its rendezvous calls ``configure_topology(0, 1)``, which sets the slice's
bounds with one chip per process and waits forever for processes never started; there
xlarun presets the one-chip world 2.4 would set (bounds ``1,1,1``, with the process's
own address and task id 0, so the defaults for the whole slice are not filled in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from xlarun.exceptions import PlanError
from xlarun.runtimes.releases import XLA_INIT_PINS_ONE_LOCAL_PROCESS
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions

BASE_PROCESS_PORT = 8476
"""torch_xla's first TPU process port; it builds ``TPU_PROCESS_ADDRESSES`` with
``BASE_PROCESS_PORT + local_rank`` on every host, so ``TPU_PROCESS_PORT`` must match."""

ONE_CHIP_BOUNDS = "1,1,1"

GENERATIONS_WITH_CORE_BOUNDS = (7,)
"""TPU generations whose one-chip process bounds have a fourth, cores-per-chip, dimension."""

CHIPS_PER_HOST_BOUNDS_BY_COUNT = {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"}
"""Chip bounds of a TPU VM host by its chip count (v4/v5p hosts have 4 chips as 2x2;
v5e/v6e hosts have 1, 4 (2x2) or 8 (2x4)), for single-host topologies without metadata."""

_BOUNDS = r"^\d+,\d+,\d+$"
# The generation digit of an accelerator type, as torch_xla reads it (v4-8, v5litepod-16, tpu7x-8).
_ACCELERATOR_GENERATION = r"^(?:v|tpu)(\d)[A-Za-z]*-\d+$"


class TpuTopology(Struct, frozen=True):
    """A TPU slice's shape as torch_xla's metadata names it.

    ``host_bounds`` is the grid of hosts (``1,1,1`` for one host),
    ``chips_per_host_bounds`` the grid of chips on each host (``2,2,1``), and
    ``generation`` the TPU version when known.
    """

    host_bounds: str
    chips_per_host_bounds: str
    generation: int | None = None

    def __post_init__(self) -> None:
        for name in ("host_bounds", "chips_per_host_bounds"):
            value = getattr(self, name)
            if not re.match(_BOUNDS, value) or 0 in _dims(value):
                raise PlanError(f"TPU {name.replace('_', ' ')} {value!r} must be three positive integers like 2,2,1")

    @property
    def chips_per_host(self) -> int:
        x, y, z = _dims(self.chips_per_host_bounds)
        return x * y * z

    def one_chip_process_bounds(self) -> str:
        """``TPU_PROCESS_BOUNDS`` with one process per chip: host grid times chip grid."""
        pairs = zip(_dims(self.host_bounds), _dims(self.chips_per_host_bounds), strict=True)
        return ",".join(str(hosts * chips) for hosts, chips in pairs)


def _dims(bounds: str) -> tuple[int, ...]:
    return tuple(int(d) for d in bounds.split(","))


def generation_of(accelerator_type: str) -> int | None:
    """The TPU generation in an accelerator type such as ``v5litepod-16`` (5), or None."""
    match = re.match(_ACCELERATOR_GENERATION, accelerator_type)
    return int(match.group(1)) if match else None


def topology(
    environ: Mapping[str, str], local_chips: int | None, nnodes: int, generation: int | None = None
) -> TpuTopology | None:
    """The slice topology the launcher can know without asking the metadata server.

    From ``TPU_HOST_BOUNDS`` and ``TPU_CHIPS_PER_HOST_BOUNDS`` when set (GKE sets
    them; they are what torch_xla reads under ``TPU_SKIP_MDS_QUERY``), else for a
    single host from its chip count. ``generation`` (e.g. from the chips' PCI ids)
    is used when ``TPU_ACCELERATOR_TYPE`` does not name one. None when unknown.
    """
    accelerator_type = environ.get("TPU_ACCELERATOR_TYPE")
    if accelerator_type and generation_of(accelerator_type) is not None:
        generation = generation_of(accelerator_type)
    host_bounds = environ.get("TPU_HOST_BOUNDS")
    chips_per_host_bounds = environ.get("TPU_CHIPS_PER_HOST_BOUNDS")
    if host_bounds and chips_per_host_bounds:
        return TpuTopology(host_bounds, chips_per_host_bounds, generation)
    if nnodes == 1 and local_chips in CHIPS_PER_HOST_BOUNDS_BY_COUNT:
        return TpuTopology(ONE_CHIP_BOUNDS, CHIPS_PER_HOST_BOUNDS_BY_COUNT[local_chips], generation)
    return None


LOCAL_RANK_READER = "torch_xla's xla:// set-up numbers each process of a host (CLOUD_TPU_TASK_ID) by LOCAL_RANK"
"""Why every worker at ``LOCAL_RANK=0`` (``--virtual-local-rank``) cannot run on one TPU host
(``_internal/tpu.py``'s ``configure_topology``, called by ``xla://`` for several local processes)."""


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """TPU variables for one worker (see the module docstring for what is left out and why)."""
    shape = options.tpu_topology
    if options.spmd:
        if shape is None:
            raise PlanError(
                "SPMD on TPU needs the slice topology: set TPU_HOST_BOUNDS and "
                "TPU_CHIPS_PER_HOST_BOUNDS (the slice's tpu-env metadata values)"
            )
        return {
            "TPU_VISIBLE_CHIPS": ",".join(str(chip) for chip in range(shape.chips_per_host)),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": shape.chips_per_host_bounds,
            "TPU_PROCESS_BOUNDS": shape.host_bounds,
        }
    if shape is not None and node.local_world_size > shape.chips_per_host:
        raise PlanError(
            f"{node.local_world_size} processes per host: that exceeds the {shape.chips_per_host} "
            "TPU chips of a host, and TPU runs at most one process per chip"
        )
    variables = {
        "TPU_VISIBLE_CHIPS": str(local_rank),
        "TPU_PROCESS_PORT": str(BASE_PROCESS_PORT + local_rank),
    }
    if node.local_world_size == 1 and options.release < XLA_INIT_PINS_ONE_LOCAL_PROCESS:
        variables.update(
            {
                "TPU_CHIPS_PER_PROCESS_BOUNDS": ONE_CHIP_BOUNDS,
                "TPU_PROCESS_BOUNDS": ONE_CHIP_BOUNDS,
                "TPU_PROCESS_ADDRESSES": f"localhost:{BASE_PROCESS_PORT}",
                "CLOUD_TPU_TASK_ID": "0",
            }
        )
        return variables
    if shape is not None and node.local_world_size > 1 and shape.generation not in GENERATIONS_WITH_CORE_BOUNDS:
        # Both or neither: under TPU_SKIP_MDS_QUERY torch_xla reads a preset
        # TPU_CHIPS_PER_PROCESS_BOUNDS in place of the host's chip bounds, so
        # presetting it alone would shrink the process bounds torch_xla derives.
        # A single local process is left to torch_xla, which makes it a one-chip
        # world of its own: slice-wide bounds would wait for processes never started.
        # TPU7x is left to torch_xla: its process bounds gain a fourth (cores per
        # chip) dimension, which torch_xla cannot read back from TPU_PROCESS_BOUNDS.
        variables["TPU_CHIPS_PER_PROCESS_BOUNDS"] = ONE_CHIP_BOUNDS
        variables["TPU_PROCESS_BOUNDS"] = shape.one_chip_process_bounds()
    return variables
