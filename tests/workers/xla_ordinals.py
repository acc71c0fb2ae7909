"""Records the ordinals torch_xla reports in this worker, then saves a tensor the way training scripts do.

Usage: ``xla_ordinals.py OUT_DIR``

Writes ``OUT_DIR/<RANK>.json`` with the global and local ordinals, world size, local device
count and whether this process is the (local) master ordinal, then ``xm.save``s a tensor to
``OUT_DIR/<RANK>.pt``; ``xm.save`` writes only in the master ordinal, so the file exists only
where this process takes itself for the master of its world.
"""

import json
import os
import sys

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

out, rank = sys.argv[1], os.environ["RANK"]
record = {
    "global_ordinal": xr.global_ordinal(),
    "world_size": xr.world_size(),
    "local_ordinal": xr.local_ordinal(),
    "local_device_count": xr.local_device_count(),
    "local_process_count": xr.local_process_count(),
    "is_master": xm.is_master_ordinal(local=False),
    "is_local_master": xm.is_master_ordinal(),
}
with open(os.path.join(out, f"{rank}.json"), "w") as handle:
    json.dump(record, handle)
xm.save(torch.arange(4.0, device=torch_xla.device()), os.path.join(out, f"{rank}.pt"))
