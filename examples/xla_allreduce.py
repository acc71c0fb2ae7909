"""All-reduce over XLA devices and report the world every worker sees.

Each worker adds ``rank + 1`` into an all-reduce on its XLA device, so a world of
``n`` workers must sum to ``n * (n + 1) / 2``. Every worker prints one JSON line
(``rank``, ``world_size``, ``sum``) and exits 1 when the sum does not fit the
world it reports.

    xlarun --nproc-per-node 1 examples/xla_allreduce.py            # xlarun's checked join
    xlarun --nproc-per-node 1 examples/xla_allreduce.py --init torch

``--init xlarun`` (default) joins through ``xlarun.worker.init_process_group``,
which refuses a world that the XLA runtime splits; ``--init torch`` uses torch_xla's
documented ``init_process_group("xla", init_method="xla://")`` directly.
"""

import argparse
import json
import sys

import torch
import torch.distributed as dist
import torch_xla

from xlarun.worker import init_process_group


def join(how: str) -> None:
    if how == "torch":
        import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" and "xla://"

        dist.init_process_group("xla", init_method="xla://")
    else:
        init_process_group("xla", init_method="xla://")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--init", choices=("xlarun", "torch"), default="xlarun", help="which init_process_group joins the group"
    )
    args = parser.parse_args()

    join(args.init)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    contribution = torch.tensor([float(rank + 1)], device=torch_xla.device())
    dist.all_reduce(contribution)
    total = contribution.item()
    print(json.dumps({"rank": rank, "world_size": world_size, "sum": total}), flush=True)
    dist.destroy_process_group()
    return 0 if total == world_size * (world_size + 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
