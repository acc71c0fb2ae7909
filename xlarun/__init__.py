"""xlarun: torchrun's contract for XLA devices.

The package imports no torch: the launcher starts without it, and the worker-side
helpers (:mod:`xlarun.worker`: ``init_process_group``, ...) import torch and torch_xla
only when called.
"""

from typing import Any

from xlarun.contract import record

__version__ = "0.1.0"

_WORKER_NAMES = ("SplitWorldError", "init_process_group", "is_launched")


def __getattr__(name: str) -> Any:
    # Worker-side helpers load on first use, so the launcher does not pay for them.
    if name in _WORKER_NAMES:
        from xlarun import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'xlarun' has no attribute {name!r}")

__all__ = ["SplitWorldError", "init_process_group", "is_launched", "record", "__version__"]
