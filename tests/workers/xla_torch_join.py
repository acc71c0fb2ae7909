"""Joins with torch_xla's documented ``init_process_group("xla", init_method="xla://")`` and holds on.

Usage: ``xla_torch_join.py [SECONDS]``

Prints the rank and world size the group reports, then waits ``SECONDS`` (default 60) before
exiting, so a store this worker serves stays bound while the other workers try to join.
"""

import sys
import time

import torch.distributed as dist
import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" and "xla://"

dist.init_process_group("xla", init_method="xla://")
print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
