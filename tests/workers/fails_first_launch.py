"""Joins the gloo group and all-reduces; the first launch of the job fails, the next one succeeds.

Usage: ``fails_first_launch.py OUT_DIR FAILING_RANK``

The same command twice, as a container restarted in place runs it: where ``OUT_DIR/failed`` is absent,
FAILING_RANK creates it and exits 3 once the all-reduce is done, and every other rank creates
``OUT_DIR/<RANK>.waiting`` and sleeps until stopped (a test that makes the next launch succeed waits for it:
a rank that had not read the marker yet would take the next launch's part); where it is there, every rank
writes ``OUT_DIR/<RANK>.json`` (rank, pid, world size, sum, run id, store port) and exits 0.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out, failing_rank = sys.argv[1], int(sys.argv[2])
marker = os.path.join(out, "failed")
failing_launch = not os.path.exists(marker)

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([float(rank)])
dist.all_reduce(value)
if failing_launch:
    if rank == failing_rank:
        open(marker, "w").close()
        # Its group's threads joined first: a gloo thread still running at interpreter exit can abort the
        # process (SIGABRT, "terminate called without an active exception", seen on torch 2.14) before
        # the exit code is in.
        dist.destroy_process_group()
        sys.exit(3)
    open(os.path.join(out, f"{rank}.waiting"), "w").close()
    while True:
        time.sleep(1)
record = {
    "rank": rank,
    "pid": os.getpid(),
    "world": dist.get_world_size(),
    "sum": int(value.item()),
    "run_id": os.environ["TORCHELASTIC_RUN_ID"],
    "master_port": os.environ["MASTER_PORT"],
}
with open(os.path.join(out, f"{rank}.json"), "w") as handle:
    json.dump(record, handle)
dist.destroy_process_group()
