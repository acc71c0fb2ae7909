"""xlarun: torchrun's contract for XLA devices.

On the launcher side this package never imports torch. Worker-side helpers
(``init_process_group``) import torch and torch_xla only when called.
"""

__version__ = "0.1.0"
