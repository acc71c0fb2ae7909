"""Compiles one graph every rank shares and, on ranks past 0, one of its own, then prints torch_xla's
persistent-cache counters as one JSON line: ``{"rank": R, "read_only": "0"|"1", "PersistentCacheMiss": N, ...}``.

Usage: ``xla_cache.py`` (under ``--compile-cache``, on the CPU device)
"""

import json
import os

import torch
import torch_xla
import torch_xla.debug.metrics as met

rank = int(os.environ["RANK"])
device = torch_xla.device()
shared = (torch.arange(8.0, device=device) * 3 + 1).sum()
torch_xla.sync()
values = [shared.item()]
if rank > 0:
    # A graph only this rank compiles: a reader that wrote would leave an entry of its own.
    own = (torch.arange(8 + rank, dtype=torch.float32, device=device) * 5).max()
    torch_xla.sync()
    values.append(own.item())
counters = {name: met.counter_value(name) for name in met.counter_names() if name.startswith("PersistentCache")}
record = {"rank": rank, "read_only": os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY"), "values": values, **counters}
print(json.dumps(record), flush=True)
