"""What xlarun sets for each worker: torchrun's contract and the device's variables.

:func:`worker_variables` is the single source of a worker's variables; the agent and the
dry run (:mod:`xlarun.planning.dryrun`) both use it, so the plan printed is the plan run.
:func:`contract_env` is its torchrun part: the variables torchrun gives every worker, as a
pure function of the node assignment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xlarun.contract import ERROR_FILE_VARIABLE, LAUNCHED_MARKER, STEP_LOG_VARIABLE, hook_variables, stacks_file
from xlarun.exceptions import PlanError
from xlarun.flags import flag
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import local_rank_reader
from xlarun.runtimes.releases import Release

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.config import LaunchConfig
    from xlarun.planning.device import DevicePlan

TORCH_XLA_RUNTIMES = ("pjrt", "xrt")

PASSED_THROUGH = (
    "KUBEFLOW_TRAINER_STATUS_URL",
    "KUBEFLOW_TRAINER_STATUS_CA_CERT",
    "KUBEFLOW_TRAINER_STATUS_TOKEN",
    "TRACEPARENT",
    "TRACESTATE",
    "BAGGAGE",
)
"""Variables other systems give the training script, which reach every worker unchanged under every
cluster: xlarun sets none of them, and the workers inherit them as the launcher got them.

- Kubeflow Trainer's progress reporting (its ``Progress`` plugin, ``pkg/runtime/framework/plugins/progress``):
  the status server's URL, and the paths of the CA certificate and the projected service-account token
  it mounts at ``/var/run/secrets/kubeflow/trainer``.
- OpenTelemetry's context carried in the environment: ``TRACEPARENT`` and ``TRACESTATE`` (W3C Trace
  Context) and ``BAGGAGE`` (W3C Baggage), so that the workers' spans join the trace that started the job.

The dry run lists those present (:mod:`xlarun.planning.dryrun`)."""

SIGNALS_VARIABLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
SIGNALS_VARIABLE_SINCE: Release = (2, 10)
"""From this torchrun on, every worker gets ``--signals-to-handle`` as given in :data:`SIGNALS_VARIABLE`
(``launcher/api.py`` sets it in the launcher's environment before the workers start)."""


def omp_threads_default(nproc_per_node: int, environ: Mapping[str, str]) -> str | None:
    """torchrun's rule: ``OMP_NUM_THREADS=1`` for several local workers unless the user chose."""
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in environ:
        return "1"
    return None


def contract_env(
    node: NodeAssignment, local_rank: int, *, config: LaunchConfig, environ: Mapping[str, str], error_file: str
) -> dict[str, str]:
    """Every variable the launcher sets or changes for one worker under torchrun's contract.

    ``environ`` is the launcher's own environment; the worker inherits it, and this
    mapping is laid over it. With one role, role ranks and sizes equal the global ones.
    ``config`` gives the role, the restarts, the handled signals (in the worker's environment
    from torchrun 2.10, as :attr:`LaunchConfig.torchrun` follows) and the virtual local rank.
    """
    rank = node.global_rank(local_rank)
    env = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(node.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": config.role,
        "LOCAL_WORLD_SIZE": str(node.local_world_size),
        "WORLD_SIZE": str(node.world_size),
        "GROUP_WORLD_SIZE": str(node.nnodes),
        "ROLE_WORLD_SIZE": str(node.world_size),
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(node.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "TORCHELASTIC_RUN_ID": node.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(node.agent_store),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ERROR_FILE_VARIABLE: error_file,
        LAUNCHED_MARKER: "1",
    }
    omp = omp_threads_default(node.local_world_size, environ)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    if config.torchrun >= SIGNALS_VARIABLE_SINCE:
        env[SIGNALS_VARIABLE] = config.signals_to_handle.text
    if config.virtual_local_rank:
        env.update(virtual_local_rank_env(local_rank, environ))
    return env


def virtual_local_rank_env(local_rank: int, environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's ``--virtual-local-rank``: ``LOCAL_RANK=0``, and the worker's own GPU as the only one
    visible, so that it is device 0 there.

    The GPU is the local rank's entry of the launcher's ``CUDA_VISIBLE_DEVICES`` (stripped) when
    set, else the local rank; the command line refused a list too short for the workers.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    own = visible.split(",")[local_rank].strip() if visible is not None else str(local_rank)
    return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": own}


def check_virtual_local_rank(device: DevicePlan, node: NodeAssignment) -> None:
    """Refuse ``--virtual-local-rank`` where the device's runtime places each process by its local rank.

    A lone worker per node has local rank 0 either way; several would all take the first chip,
    NeuronCore or GPU.
    """
    reader = local_rank_reader(device.device) if node.local_world_size > 1 else None
    if reader is not None:
        raise PlanError(
            f"{flag('virtual_local_rank')} gives each of the {node.local_world_size} workers "
            f"LOCAL_RANK=0, but on {device.device} {reader}, so they would all take the same device: "
            f"drop {flag('virtual_local_rank')}"
        )


def worker_variables(
    config: LaunchConfig,
    node: NodeAssignment,
    local_rank: int,
    device: DevicePlan,
    environ: Mapping[str, str],
    error_file: str,
) -> dict[str, str]:
    """Every variable xlarun sets or changes for one worker (the rest is inherited).

    A ``--virtual-local-rank`` the device cannot run was refused while the launch was prepared
    (:func:`check_virtual_local_rank`).
    """
    variables = contract_env(node, local_rank, config=config, environ=environ, error_file=error_file)
    variables.update(device.variables(node, local_rank))
    variables.update(hook_variables(stacks_file(os.path.dirname(error_file)), environ))
    if (
        config.hang_timeout is not None
        and device.torch_xla_version is not None
        and device.runtime in TORCH_XLA_RUNTIMES
        and STEP_LOG_VARIABLE not in environ
    ):
        # torch_xla's step log is progress the hang watch sees without a change to the script.
        variables[STEP_LOG_VARIABLE] = "1"
    return variables
