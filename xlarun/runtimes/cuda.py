"""XLA:GPU variables under PJRT (torch_xla 2.2 to 2.8; 2.9 removed CUDA).

torch_xla's GPU client meets at one coordinator, ``MASTER_ADDR:XLA_COORDINATOR_PORT``
(served by global rank 0), and reads its place from ``RANK``, ``WORLD_SIZE`` and
``PJRT_LOCAL_PROCESS_RANK``/``COUNT``. That is already one address for the whole
job; xlarun only replaces torch_xla's fixed default port (8547, which two jobs on a
host would share) with the job's coordinator port.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions


LOCAL_RANK_READER = "the XLA:GPU client takes the GPU at PJRT_LOCAL_PROCESS_RANK among those it sees"
"""Why ``--virtual-local-rank`` (one visible GPU per worker) does not fit XLA:GPU, which places a
process by its local rank among the host's GPUs."""


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """XLA:GPU variables for one worker."""
    return {"XLA_COORDINATOR_PORT": str(options.coordinator_port_for(node))}
