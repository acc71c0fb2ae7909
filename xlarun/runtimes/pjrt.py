"""Variables every PJRT worker gets, whatever its device.

``PJRT_DEVICE`` selects torch_xla's device (unset, torch_xla guesses and may pick
CPU on an accelerator host). ``PJRT_LOCAL_PROCESS_RANK`` and
``PJRT_LOCAL_PROCESS_COUNT`` place the process on its host: torch_xla defaults them
only inside its ``xla://`` rendezvous, while programs that initialise with
``env://`` (transformers, Ray) or not at all would otherwise run without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xlarun.devices import pjrt_device_name

if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """The device-independent PJRT variables for one worker."""
    variables = {
        "PJRT_DEVICE": pjrt_device_name(options.device),
        "PJRT_LOCAL_PROCESS_RANK": str(local_rank),
        "PJRT_LOCAL_PROCESS_COUNT": str(node.local_world_size),
    }
    if options.spmd:
        variables["XLA_USE_SPMD"] = "1"
    return variables
