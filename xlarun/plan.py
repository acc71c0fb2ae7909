"""From a node assignment to the exact workers to start: argv, environment, logs.

``worker_variables`` is the single source of what xlarun sets for a worker; the launch
and the dry run both use it, so the plan printed is the plan run. ``contract_env``
is its torchrun part: the variables torchrun gives every worker, as a pure function
of the node assignment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from xlarun.ranks import NodeAssignment

if TYPE_CHECKING:
    # Annotations only: the worker imports this module for LAUNCHED_MARKER.
    from xlarun.config import LaunchConfig
    from xlarun.deviceplan import DevicePlan

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


def dry_run_document(config: LaunchConfig, node: NodeAssignment, device: DevicePlan,
                     environ: Mapping[str, str], error_file_for: Callable[[int], str]) -> dict[str, Any]:
    """The dry run's JSON: the whole plan for this node, nothing started.

    ``env_bytes`` is the size of the largest worker's added environment (``KEY=value``
    strings with their terminators, as ``exec`` counts them): it stays the same at any
    world size but for the digits of ranks and sizes.
    """
    envs = [worker_variables(config, node, local_rank, device, environ, error_file_for(local_rank))
            for local_rank in range(node.local_world_size)]
    workers = [{"local_rank": local_rank, "rank": node.global_rank(local_rank),
                "argv": config.command.argv(local_rank), "env": env}
               for local_rank, env in enumerate(envs)]
    return {
        "run_id": node.run_id,
        "device": device.device,
        "runtime": device.runtime,
        "node_rank": node.node_rank,
        "nnodes": [config.min_nodes, config.max_nodes],
        "nproc_per_node": node.local_world_size,
        "world_size": node.world_size,
        "master_addr": node.master_addr,
        "master_port": node.master_port,
        "env_bytes": max(environment_bytes(env) for env in envs),
        "workers": workers,
    }


def environment_bytes(variables: Mapping[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) + 2 for key, value in variables.items())
