"""xlarun: torchrun's contract for XLA devices.

The package imports no torch: the launcher starts without it, and the worker-side
helpers (``init_process_group``) import torch and torch_xla only when called.
"""

from xlarun.errorfile import record
from xlarun.worker import SplitWorldError, init_process_group, is_launched

__version__ = "0.1.0"

__all__ = ["SplitWorldError", "init_process_group", "is_launched", "record", "__version__"]
