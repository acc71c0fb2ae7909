"""All-reduces its rank over gloo and records what it saw.

Usage: ``mn_allreduce.py OUT_DIR [env|tcp]``

``env`` joins with ``init_method="env://"``; ``tcp`` with ``tcp://MASTER_ADDR:MASTER_PORT``
and explicit rank and world size. Writes ``OUT_DIR/<RANK>.json``: the launcher's variables,
the process group's rank and world size, and the all-reduced sum.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

out, method = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "env"
if method == "tcp":
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
else:
    dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([float(dist.get_rank())])
dist.all_reduce(value)
names = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCH_CPP_LOG_LEVEL",
)
record = {
    "env": {name: os.environ.get(name) for name in names},
    "rank": dist.get_rank(),
    "world": dist.get_world_size(),
    "sum": int(value.item()),
}
with open(os.path.join(out, f"{dist.get_rank()}.json"), "w") as handle:
    json.dump(record, handle)
dist.destroy_process_group()
