"""Every worker all-reduces its rank over gloo and prints the sum.

    xlarun --nproc_per_node 2 examples/allreduce.py

Each worker prints one line, ``rank=R world=W sum=S host=H local_rank=L``: S is 0+1+...+(W-1)
on every worker, H the host's name.
"""

import os
import sys

import torch
import torch.distributed as dist

import xlarun


@xlarun.record
def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    # One write per line: workers share the console, and print() writes text and newline apart.
    sys.stdout.write(
        f"rank={rank} world={world} sum={int(value.item())} host={os.uname().nodename} "
        f"local_rank={os.environ['LOCAL_RANK']}\n"
    )
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
