"""AWS Neuron (trn1, trn2, inf2) variables under PJRT, for torch_xla 2.1 to 2.9.

From 2.5 torch_xla configures a Neuron worker when ``torch_xla`` is imported
(``torch_xla._internal.neuron.configure_pjrt_environment``); before 2.5 the
torch-neuronx package does. Either way these must be in the environment before the
worker's interpreter starts:

- ``NEURON_RT_ROOT_COMM_ID``: the one address every Neuron process of the job meets
  at. torch_xla defaults it to ``MASTER_ADDR`` with a hard-coded port; xlarun uses the
  job's coordinator port so two jobs on one host do not collide.
- ``NEURON_PJRT_PROCESS_INDEX`` and ``NEURON_PJRT_WORLD_SIZE``: this process's global
  index and the number of processes, one NeuronCore each. They replace
  ``NEURON_PJRT_PROCESSES_NUM_DEVICES``, a list with one entry per process that
  grows with the world; xlarun sets it only under SPMD across nodes (below).
- ``NEURON_RT_VISIBLE_CORES``: from 2.5 left to torch_xla, which sets it to the local
  rank at import. A user's own range (e.g. ``8-15``) must list exactly one core per local
  process; torch_xla then picks the local rank's entry of it.

Before 2.5 only torch_xla's ``xla://`` set-up picks the core, and it also overwrites
``NEURON_PJRT_PROCESS_INDEX`` with the local rank, so a second node takes the first one's
indices. :func:`xlarun.init_process_group` joins with ``env://`` there (see
:data:`xlarun.runtimes.releases.XLA_INIT_BREAKS`), and xlarun sets the local rank's core
itself, as ``xla://`` would.

SPMD (one process per node sees every core): from 2.5 the import-time set-up leaves the
process whole only when ``XLA_USE_SPMD=1`` is already set, so xlarun sets it there although
torch_xla deprecates the variable elsewhere. Across several nodes the Neuron runtime needs
each node's process index (the node rank) and ``NEURON_PJRT_PROCESSES_NUM_DEVICES``, the
NeuronCores of every process: one entry per node (``32,32`` for two trn1.32xlarge). It is the
one value xlarun sets that grows with the number of hosts, about 3 bytes a node.

The compile cache (``--compile-cache``, :func:`cache_env`): the Neuron compiler keeps the NEFF it makes
of each graph in ``NEURON_COMPILE_CACHE_URL`` (a directory or ``s3://``; by default
``/var/tmp/neuron-compile-cache``), one folder per module. Every rank gets the same directory, as
Neuron's own documented step before a run, ``neuron_parallel_compile torchrun ...``, has every rank of
the job compile into one cache; torch_xla's own persistent cache comes on top
(:func:`xlarun.runtimes.pjrt.cache_env`).
"""

from __future__ import annotations

import os

from xlarun.exceptions import PlanError
from xlarun.runtimes.limits import check_variable_size
from xlarun.runtimes.releases import NEURON_IMPORT_CONFIGURES

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions

PROCESSES_NUM_DEVICES = "NEURON_PJRT_PROCESSES_NUM_DEVICES"
CACHE_URL = "NEURON_COMPILE_CACHE_URL"
CACHE_SUBDIRECTORY = "neuron"


LOCAL_RANK_READER = (
    "import torch_xla sets PJRT_LOCAL_PROCESS_RANK to LOCAL_RANK and takes the NeuronCore at "
    "that place of NEURON_RT_VISIBLE_CORES"
)
"""Why every worker at ``LOCAL_RANK=0`` (``--virtual-local-rank``) cannot run on one Neuron host
(``_internal/neuron.py``'s ``configure_pjrt_environment``; narrowing ``NEURON_RT_VISIBLE_CORES``
to one core does not help, as it must list one core per local process)."""


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """Neuron variables for one worker."""
    variables = {"NEURON_RT_ROOT_COMM_ID": options.coordinator_address(node)}
    if not options.spmd:
        variables["NEURON_PJRT_PROCESS_INDEX"] = str(node.global_rank(local_rank))
        variables["NEURON_PJRT_WORLD_SIZE"] = str(node.world_size)
        if options.release < NEURON_IMPORT_CONFIGURES:
            variables["NEURON_RT_VISIBLE_CORES"] = str(local_rank)
        return variables
    if options.release >= NEURON_IMPORT_CONFIGURES:
        variables["XLA_USE_SPMD"] = "1"
    if node.nnodes > 1:
        variables["NEURON_PJRT_PROCESS_INDEX"] = str(node.node_rank)
        variables[PROCESSES_NUM_DEVICES] = processes_num_devices(options.local_units, node.nnodes)
    return variables


def processes_num_devices(cores_per_node: int | None, nnodes: int) -> str:
    """``NEURON_PJRT_PROCESSES_NUM_DEVICES`` for one SPMD process per node, each driving ``cores_per_node``."""
    if not cores_per_node:
        raise PlanError(
            f"Neuron under SPMD across nodes needs each node's NeuronCore count for "
            f"{PROCESSES_NUM_DEVICES}, and this host shows none: run on the Neuron host, or set "
            "NEURON_RT_VISIBLE_CORES to the cores of each node's process"
        )
    value = ",".join([str(cores_per_node)] * nnodes)
    check_variable_size(PROCESSES_NUM_DEVICES, value, f"{nnodes} nodes")
    return value


def visible_core_count(cores: str) -> int | None:
    """How many NeuronCores ``NEURON_RT_VISIBLE_CORES`` names (``8-15`` is 8, ``0,2,4-5`` is 4).

    None where it cannot be read; the plan then counts the host's cores instead.
    """
    count = 0
    for part in cores.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        count += int(last) - int(first) + 1 if dash else 1
    return count if count > 0 else None


def cache_env(root: str, writer: bool) -> dict[str, str]:
    """The Neuron compiler's cache in ``root``'s :data:`CACHE_SUBDIRECTORY`, the same for every rank."""
    return {CACHE_URL: os.path.join(root, CACHE_SUBDIRECTORY)}
