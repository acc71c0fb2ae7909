"""Joins the gloo group and all-reduces in a loop until a peer vanishes (or it is stopped).

Usage: ``mn_allreduce_loop.py OUT_DIR``

After the first all-reduce writes ``OUT_DIR/<RANK>.json`` (rank, node rank, pid); then
all-reduces every 10 ms, so a peer whose process dies makes this rank fail at once, as a
training step does: gloo's ``Connection closed by peer``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.tensor([1.0])
dist.all_reduce(value)
# Written whole under its name: the tests read the records while the workers run.
record = os.path.join(out, f"{rank}.json")
with open(record + ".part", "w") as handle:
    json.dump({"rank": rank, "node": int(os.environ["GROUP_RANK"]), "pid": os.getpid()}, handle)
os.replace(record + ".part", record)
while True:
    dist.all_reduce(value)
    time.sleep(0.01)
