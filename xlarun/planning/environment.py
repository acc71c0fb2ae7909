"""What xlarun sets for each worker: torchrun's contract and the device's variables.

:func:`worker_variables` is the single source of a worker's variables; the agent and the
dry run (:mod:`xlarun.planning.dryrun`) both use it, so the plan printed is the plan run.
:func:`contract_env` is its torchrun part: the variables torchrun gives every worker, as a
pure function of the node assignment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xlarun.ranks import NodeAssignment

if TYPE_CHECKING:
    # Annotations only: the worker imports this module for LAUNCHED_MARKER.
    from xlarun.config import LaunchConfig
    from xlarun.planning.device import DevicePlan

LAUNCHED_MARKER = "XLARUN_LAUNCHED"
"""Set to ``1`` in every worker xlarun starts; :func:`xlarun.is_launched` reads it."""

def omp_threads_default(nproc_per_node: int, environ: Mapping[str, str]) -> str | None:
    """torchrun's rule: ``OMP_NUM_THREADS=1`` for several local workers unless the user chose."""
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in environ:
        return "1"
    return None


def contract_env(node: NodeAssignment, local_rank: int, *, role: str, max_restarts: int,
                 environ: Mapping[str, str], error_file: str) -> dict[str, str]:
    """Every variable the launcher sets or changes for one worker under torchrun's contract.

    ``environ`` is the launcher's own environment; the worker inherits it, and this
    mapping is laid over it. With one role, role ranks and sizes equal the global ones.
    """
    rank = node.global_rank(local_rank)
    env = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(node.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": role,
        "LOCAL_WORLD_SIZE": str(node.local_world_size),
        "WORLD_SIZE": str(node.world_size),
        "GROUP_WORLD_SIZE": str(node.nnodes),
        "ROLE_WORLD_SIZE": str(node.world_size),
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(node.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": node.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(node.agent_store),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": error_file,
        LAUNCHED_MARKER: "1",
    }
    omp = omp_threads_default(node.local_world_size, environ)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return env


def worker_variables(config: LaunchConfig, node: NodeAssignment, local_rank: int, device: DevicePlan,
                     environ: Mapping[str, str], error_file: str) -> dict[str, str]:
    """Every variable xlarun sets or changes for one worker (the rest is inherited)."""
    variables = contract_env(node, local_rank, role=config.role, max_restarts=config.max_restarts,
                             environ=environ, error_file=error_file)
    variables.update(device.variables(node, local_rank))
    return variables
