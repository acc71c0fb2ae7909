"""AWS Neuron (trn1, trn2, inf2) variables under PJRT, in agreement with torch_xla 2.9.

torch_xla configures a Neuron worker when ``torch_xla`` is imported
(``torch_xla._internal.neuron.configure_pjrt_environment``), so these must be in the
environment before the worker's interpreter starts:

- ``NEURON_RT_ROOT_COMM_ID``: the one address every Neuron process of the job meets
  at. torch_xla defaults it to ``MASTER_ADDR`` with a hard-coded port; xlarun uses the
  job's coordinator port so two jobs on one host do not collide.
- ``NEURON_PJRT_PROCESS_INDEX`` and ``NEURON_PJRT_WORLD_SIZE``: this process's global
  index and the number of processes, one NeuronCore each. They replace
  ``NEURON_PJRT_PROCESSES_NUM_DEVICES``, a list with one entry per process that
  grows with the world; xlarun never sets it.
- ``NEURON_RT_VISIBLE_CORES`` is left to torch_xla, which sets it to the local rank.
  A user's own range (e.g. ``8-15``) must list exactly one core per local process;
  torch_xla then picks the local rank's entry of it.

Under SPMD torch_xla sets no per-process Neuron variables (one process sees all the
host's cores); xlarun then gives only the root communication address.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """Neuron variables for one worker."""
    variables = {"NEURON_RT_ROOT_COMM_ID": options.coordinator_address(node)}
    if not options.spmd:
        variables["NEURON_PJRT_PROCESS_INDEX"] = str(node.global_rank(local_rank))
        variables["NEURON_PJRT_WORLD_SIZE"] = str(node.world_size)
    return variables
