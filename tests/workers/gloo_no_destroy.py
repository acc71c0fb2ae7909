"""Joins a gloo group, checks its size with one all-reduce, and ends without destroying the group.

Usage: ``gloo_no_destroy.py --init-method env://|tcp://HOST:PORT``

Many training scripts end this way. The work is done inside a function, so its tensors are
freed before the interpreter finalises while gloo's threads still run: the ending that
``--run-path`` must survive.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", required=True)
    init_method = parser.parse_args().init_method
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    seen = torch.nn.functional.one_hot(torch.tensor(dist.get_rank()), num_classes=dist.get_world_size())
    dist.all_reduce(seen)
    if int(seen.sum().item()) != world_size:
        raise RuntimeError(f"the all-reduce saw {int(seen.sum().item())} ranks, expected {world_size}")
    sys.stdout.write(f"rank {rank} of {world_size} done\n")  # one write: the workers share the terminal
    sys.stdout.flush()


if __name__ == "__main__":
    main()
