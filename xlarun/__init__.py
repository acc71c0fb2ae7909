"""xlarun: torchrun's contract for XLA devices.

The package imports no torch: the launcher starts without it, and the worker-side
helpers (:mod:`xlarun.worker`: ``init_process_group``, ...) import torch and torch_xla
only when called. :func:`launch` (the command's launch from Python, :mod:`xlarun.launching.library`)
loads the launcher on first use.
"""

from __future__ import annotations

from xlarun.contract import record

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_WORKER_NAMES = ("SplitWorldError", "init_process_group", "is_launched")
_LAUNCH_NAMES = ("launch", "LaunchResult", "WorkerFailed", "job")
"""The launcher from Python (:mod:`xlarun.launching.library`)."""


def __getattr__(name: str) -> Any:
    # Worker-side helpers and the launcher load on first use, so neither side pays for the other.
    if name in _WORKER_NAMES:
        from xlarun import worker

        return getattr(worker, name)
    if name in _LAUNCH_NAMES:
        from xlarun.launching import library

        return getattr(library, name)
    raise AttributeError(f"module 'xlarun' has no attribute {name!r}")


__all__ = [
    "LaunchResult",
    "SplitWorldError",
    "WorkerFailed",
    "init_process_group",
    "is_launched",
    "job",
    "launch",
    "record",
    "__version__",
]
