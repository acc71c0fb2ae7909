"""From a node assignment to the exact workers to start: argv, environment, logs.

``worker_variables`` is the single source of what xlarun sets for a worker; the launch
and ``--dry-run`` both use it, so the plan printed is the plan run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from xlarun.config import LaunchConfig
from xlarun.ranks import NodeAssignment
from xlarun.workerenv import contract_env

# Extra per-worker variables from a device translation: (node, local_rank) -> variables.
DeviceVariables = Callable[[NodeAssignment, int], Mapping[str, str]]


@dataclass(frozen=True)
class DevicePlan:
    """What the device layer decided; the launcher only reports and applies it."""

    device: str = "cpu"
    runtime: str = "pjrt"
    variables: Optional[DeviceVariables] = None
    spmd: bool = False
    explicit: bool = False


def worker_variables(config: LaunchConfig, node: NodeAssignment, local_rank: int, device: DevicePlan,
                     environ: Mapping[str, str], error_file: str) -> dict[str, str]:
    """Every variable xlarun sets or changes for one worker (the rest is inherited)."""
    variables = contract_env(node, local_rank, role=config.role, max_restarts=config.max_restarts,
                             environ=environ, error_file=error_file)
    if device.variables is not None:
        variables.update(device.variables(node, local_rank))
    return variables


def dry_run_document(config: LaunchConfig, node: NodeAssignment, device: DevicePlan,
                     environ: Mapping[str, str], error_file_for: Callable[[int], str]) -> dict:
    """The ``--dry-run`` JSON: the whole plan for this node, nothing started.

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
