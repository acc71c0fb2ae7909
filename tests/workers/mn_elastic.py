"""Joins the gloo group, all-reduces once, records the world it saw, then waits or ends.

Usage: ``mn_elastic.py OUT_DIR UNTIL_ATTEMPT``

Writes ``OUT_DIR/<TORCHELASTIC_RESTART_COUNT>.<RANK>.json``: rank, world size (the process
group's and ``WORLD_SIZE``), node rank, attempt, pid, the all-reduced sum and where the
store was. Before attempt UNTIL_ATTEMPT every rank then sleeps until stopped (so only a
change of nodes ends the attempt); from then on it exits 0.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out, until = sys.argv[1], int(sys.argv[2])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([float(rank)])
dist.all_reduce(value)
record = {
    "rank": rank,
    "world": dist.get_world_size(),
    "env_world": int(os.environ["WORLD_SIZE"]),
    "node": int(os.environ["GROUP_RANK"]),
    "nnodes": int(os.environ["GROUP_WORLD_SIZE"]),
    "attempt": attempt,
    "pid": os.getpid(),
    "sum": int(value.item()),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}
with open(os.path.join(out, f"{attempt}.{rank}.json"), "w") as handle:
    json.dump(record, handle)
if attempt < until:
    time.sleep(600)
dist.destroy_process_group()
