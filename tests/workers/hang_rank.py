"""One rank stops in a named function while the others wait for it in an all-reduce.

Usage: ``hang_rank.py OUT_DIR STUCK_RANK [first-attempt]``

Every rank joins a gloo group, writes ``OUT_DIR/<RANK>.json`` (its pid, for the test's cleanup
and its checks), and then all-reduces; rank STUCK_RANK first waits in ``stuck_in_data_loader``
until ``OUT_DIR/release`` appears (forever unless the test writes it); with ``first-attempt``, only
in the first attempt. Written for the hang tests and ``xlarun --stacks``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out, stuck_rank = sys.argv[1], int(sys.argv[2])
first_attempt_only = sys.argv[3:] == ["first-attempt"]


def stuck_in_data_loader() -> None:
    while not os.path.exists(os.path.join(out, "release")):
        time.sleep(0.2)


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    # Written whole under its name: the test reads the records while the workers start.
    record = os.path.join(out, f"{rank}.json")
    with open(record + ".part", "w") as handle:
        json.dump({"rank": rank, "pid": os.getpid()}, handle)
    os.replace(record + ".part", record)
    if rank == stuck_rank and not (first_attempt_only and os.environ["TORCHELASTIC_RESTART_COUNT"] != "0"):
        stuck_in_data_loader()
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


main()
