"""Moves MASTER_PORT to a port of its own, then joins gloo with ``env://`` and all-reduces its rank.

Usage: ``own_store.py PORT``

torch_xla's ``test_ddp`` does this: with an agent store, torchrun's workers would wait for a
store nobody serves on the new port; without one, rank 0 serves it there. Prints
``sum <total>``.
"""

import os
import sys

import torch
import torch.distributed as dist

os.environ["MASTER_PORT"] = sys.argv[1]
dist.init_process_group("gloo", init_method="env://")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
# One write per line: under python -u print() writes the text and the newline apart, and two
# workers sharing the console could interleave them.
sys.stdout.write(f"sum {int(total.item())}\n")
dist.destroy_process_group()
