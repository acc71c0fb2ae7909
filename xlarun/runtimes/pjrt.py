"""Variables every PJRT worker gets, whatever its device.

``PJRT_DEVICE`` selects torch_xla's device (unset, torch_xla guesses and may pick
CPU on an accelerator host). ``PJRT_LOCAL_PROCESS_RANK`` and
``PJRT_LOCAL_PROCESS_COUNT`` place the process on its host: torch_xla defaults them
only inside its ``xla://`` rendezvous, while programs that initialise with
``env://`` (transformers, Ray) or not at all would otherwise run without them.
They are left out on CPU: PJRT's CPU client makes every process a world of its own
(global ordinal 0 of 1), and a local ordinal of 1 of 2 beside that would contradict it
(``xm.is_master_ordinal()`` false in a world of one, so ``xm.save`` writes nothing).

:data:`~xlarun.contract.SPMD_MARKER` tells the worker-side helpers that the launch asked for
SPMD. torch_xla 2.1 and later deprecate ``XLA_USE_SPMD`` in favour of ``torch_xla.runtime.use_spmd()`` in
the program, so xlarun sets that variable only where a release's own set-up reads it before
the program can run (Neuron, see :mod:`~xlarun.runtimes.neuron`).

The persistent compile cache (``--compile-cache``, :func:`cache_env`): torch_xla's
``torch_xla.runtime.initialize_cache(path, readonly)`` only sets ``XLA_PERSISTENT_CACHE_PATH`` and
``XLA_PERSISTENT_CACHE_READ_ONLY`` (``1``/``0``), read before the first computation, so the launcher
sets them instead, on every PJRT device (CPU included: one file per compiled graph appears in the
directory). Writers sharing a directory race (pytorch/xla#7196); the documented pattern for several
processes is one writer and every other process read-only (pytorch/xla#5804). torch_xla 2.9's CPU client
finds an entry but cannot load it: its ``PersistentCacheDeserializeFailure`` counter rises and it compiles
again; a TPU loads it.
"""

from __future__ import annotations

import os

from xlarun.contract import SPMD_MARKER
from xlarun.host.devices import pjrt_device_name

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions

CACHE_PATH = "XLA_PERSISTENT_CACHE_PATH"
CACHE_READ_ONLY = "XLA_PERSISTENT_CACHE_READ_ONLY"
CACHE_SUBDIRECTORY = "torch_xla"
"""The folder of ``--compile-cache DIR`` that torch_xla's entries go to."""

PLUGIN_LOCAL_RANK_READER = "the PJRT plugin takes the device at PJRT_LOCAL_PROCESS_RANK among those it sees"
"""Why ``--virtual-local-rank`` does not fit a device of a PJRT plugin with no set-up of its own (XPU):
xlarun cannot narrow what the plugin sees to one device per worker."""


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """The device-independent PJRT variables for one worker."""
    variables = {"PJRT_DEVICE": pjrt_device_name(options.device)}
    if options.device != "cpu":
        variables["PJRT_LOCAL_PROCESS_RANK"] = str(local_rank)
        variables["PJRT_LOCAL_PROCESS_COUNT"] = str(node.local_world_size)
    if options.spmd:
        variables[SPMD_MARKER] = "1"
    return variables


def cache_env(root: str, writer: bool) -> dict[str, str]:
    """torch_xla's persistent cache in ``root``'s :data:`CACHE_SUBDIRECTORY`: read and written by the one
    ``writer`` of that directory, only read by every other process."""
    return {CACHE_PATH: os.path.join(root, CACHE_SUBDIRECTORY), CACHE_READ_ONLY: "0" if writer else "1"}
