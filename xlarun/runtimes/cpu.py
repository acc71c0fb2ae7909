"""XLA:CPU variables under PJRT.

PJRT's CPU client has no collectives between processes: several CPU workers each
see a world of one. What works is one process with several virtual devices
(``CPU_NUM_DEVICES``), typically under SPMD.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """``CPU_NUM_DEVICES`` when virtual devices were asked for; nothing otherwise."""
    if options.virtual_devices is None:
        return {}
    return {"CPU_NUM_DEVICES": str(options.virtual_devices)}
