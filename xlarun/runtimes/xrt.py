"""Per-process variables of the legacy XRT runtime (torch_xla 2.0 and older).

XRT makes every worker a task of one TensorFlow cluster described by two lists with
one entry per worker, ``XRT_WORKERS`` and ``XRT_DEVICE_MAP``. In the environment they
grow with the world until Linux refuses to start the worker (one variable may not
exceed 128 KiB), so the launcher gives each worker only its own values, and the
worker builds the lists itself through the store at ``MASTER_ADDR:MASTER_PORT``
before its runtime starts (:mod:`xlarun.worker.xrt`). ``XRT_MULTI_PROCESSING_DEVICE``
is what marks a worker as needing that.

``XRT_MESH_SERVICE_ADDRESS`` is the one compact address: the mesh service that
global rank 0 serves (it also hands out the NCCL unique id on GPU), at the master
address and the job's coordinator port.
"""

from __future__ import annotations

from xlarun.contract import XRT_DEVICE_KINDS, XRT_TASK_JOB
from xlarun.exceptions import PlanError

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """XRT variables for one worker; no ``PJRT_*`` (in torch_xla 2.0 ``PJRT_DEVICE`` selects PJRT)."""
    kind = XRT_DEVICE_KINDS.get(options.device)
    if kind is None:
        raise PlanError(
            f"the XRT runtime runs on device {' or '.join(XRT_DEVICE_KINDS)}, "
            f"not {options.device}: use the PJRT runtime"
        )
    rank = node.global_rank(local_rank)
    return {
        "XRT_LOCAL_WORKER": f"{XRT_TASK_JOB}:{rank}",
        "XRT_MULTI_PROCESSING_DEVICE": f"{kind}:{rank}",
        "XRT_SHARD_WORLD_SIZE": str(node.world_size),
        "XRT_SHARD_ORDINAL": str(rank),
        "XRT_SHARD_LOCAL_ORDINAL": str(local_rank),
        "XRT_HOST_WORLD_SIZE": str(node.nnodes),
        "XRT_MESH_SERVICE_ADDRESS": options.coordinator_address(node),
    }
