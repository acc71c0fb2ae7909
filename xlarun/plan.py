"""From a node assignment to the exact workers to start: argv, environment, logs.

``worker_variables`` is the single source of what xlarun sets for a worker; the launch
and the dry run both use it, so the plan printed is the plan run. ``contract_env``
is its torchrun part: the variables torchrun gives every worker, as a pure function
of the node assignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from xlarun.ranks import NodeAssignment

if TYPE_CHECKING:
    # Annotations only: the worker imports this module for LAUNCHED_MARKER.
    from xlarun.config import LaunchConfig
    from xlarun.deviceplan import DevicePlan

LAUNCHED_MARKER = "XLARUN_LAUNCHED"
"""Set to ``1`` in every worker xlarun starts; :func:`xlarun.is_launched` reads it."""

DECIDED_AT_RENDEZVOUS = "<decided at rendezvous>"
"""What a dry run shows in place of a value only a real rendezvous decides."""


@dataclass(frozen=True)
class NodePlan:
    """This node as a dry run knows it, without meeting any other node.

    ``node`` is the assignment the plan shows. Where the real run's rendezvous decides a
    value (a c10d node rank, a port the kernel picks), ``node`` holds a stand-in and
    ``alternative`` another stand-in: every value that differs between the two is decided
    at rendezvous, and the plan marks it so instead of showing a guess. ``endpoint`` is where
    the node meets the others (``""`` where it meets none); ``assumed`` says what the plan
    takes for granted about the other nodes.
    """

    node: NodeAssignment
    alternative: Optional[NodeAssignment] = None
    endpoint: str = ""
    assumed: tuple[str, ...] = ()


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


def dry_run_document(config: LaunchConfig, planned: NodePlan, device: DevicePlan, environ: Mapping[str, str],
                     error_file_for: Callable[[str, int], str], notices: Sequence[str] = ()) -> dict[str, Any]:
    """The dry run's JSON: the whole plan for this node, nothing started.

    Values decided at rendezvous read :data:`DECIDED_AT_RENDEZVOUS`, and
    ``decided_at_rendezvous`` names them (plan keys and worker variables). ``notices`` are
    the lines the real run prints before starting; ``assumed`` says what the plan took for
    granted about a machine it cannot see. ``env_bytes`` is the size of the largest worker's
    added environment (``KEY=value`` strings with their terminators, as ``exec`` counts
    them): it stays the same at any world size but for the digits of ranks and sizes.
    """
    node, other = planned.node, planned.alternative or planned.node

    def variables(assignment: NodeAssignment, local_rank: int) -> dict[str, str]:
        return worker_variables(config, assignment, local_rank, device, environ,
                                error_file_for(assignment.run_id, local_rank))

    envs = [variables(node, local_rank) for local_rank in range(node.local_world_size)]
    undecided_variables = sorted({name for local_rank, env in enumerate(envs)
                                  for name, value in variables(other, local_rank).items() if env[name] != value})

    def shown(value_of: Callable[[NodeAssignment], Any]) -> Any:
        """The value the plan shows: the stand-in's, unless the rendezvous decides it."""
        value = value_of(node)
        return value if value_of(other) == value else DECIDED_AT_RENDEZVOUS

    placement = {key: shown(attrgetter(key))
                 for key in ("run_id", "node_rank", "world_size", "master_addr", "master_port")}
    workers = [{"local_rank": local_rank,
                "rank": shown(lambda assignment: assignment.global_rank(local_rank)),
                "argv": config.command.argv(local_rank),
                "env": {name: DECIDED_AT_RENDEZVOUS if name in undecided_variables else value
                        for name, value in env.items()}}
               for local_rank, env in enumerate(envs)]
    return {
        "run_id": placement["run_id"],
        "device": device.device,
        "runtime": device.runtime,
        "node_rank": placement["node_rank"],
        "nnodes": [config.min_nodes, config.max_nodes],
        "nproc_per_node": node.local_world_size,
        "world_size": placement["world_size"],
        "master_addr": placement["master_addr"],
        "master_port": placement["master_port"],
        "rdzv_backend": config.rdzv_backend,
        "rdzv_endpoint": planned.endpoint,
        "decided_at_rendezvous": [key for key, value in placement.items() if value == DECIDED_AT_RENDEZVOUS]
                                 + undecided_variables,
        "notices": list(notices),
        "assumed": [*device.assumed, *planned.assumed],
        "env_bytes": max(environment_bytes(env) for env in envs),
        "workers": workers,
    }


def environment_bytes(variables: Mapping[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) + 2 for key, value in variables.items())
