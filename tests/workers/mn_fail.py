"""Joins the gloo group, all-reduces once, then fails on one rank or waits to be stopped.

Usage: ``mn_fail.py OUT_DIR FAILING_RANK [FAILING_ATTEMPTS]``

Once the all-reduce is done, writes ``OUT_DIR/<RANK>.<TORCHELASTIC_RESTART_COUNT>.json``
(rank, node rank, restart count, pid, sum). While the restart count is below FAILING_ATTEMPTS
(default: every attempt), FAILING_RANK exits 3 and every other rank sleeps until stopped;
from then on every rank exits 0. A FAILING_RANK of -1 fails nobody: everyone sleeps.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out, failing_rank = sys.argv[1], int(sys.argv[2])
failing_attempts = int(sys.argv[3]) if len(sys.argv) > 3 else sys.maxsize
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([float(rank)])
dist.all_reduce(value)
record = {
    "rank": rank,
    "node": int(os.environ["GROUP_RANK"]),
    "attempt": attempt,
    "pid": os.getpid(),
    "sum": int(value.item()),
}
with open(os.path.join(out, f"{rank}.{attempt}.json"), "w") as handle:
    json.dump(record, handle)
if attempt < failing_attempts and rank != failing_rank:
    time.sleep(600)
# Its own group's threads joined before it exits, with 3 or 0: a gloo thread still running at interpreter
# exit can abort the process (SIGABRT, "terminate called without an active exception", seen on torch 2.14)
# before the exit code is in.
dist.destroy_process_group()
if attempt < failing_attempts:
    sys.exit(3)
