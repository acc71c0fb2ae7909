"""Train a small model with FSDPv2 (SPMD): one process per node sees every local device.

On a CPU machine, four virtual devices stand in for accelerators:

    xlarun --spmd --device cpu --virtual-devices 4 examples/spmd_fsdp.py --steps 5

The mesh is ``(devices, 1)`` with axes ``("fsdp", "model")``; FSDPv2 shards each parameter
along its largest dimension over the ``fsdp`` axis, and the batch is sharded along the same axis.
Prints one JSON line: the device count, the loss of every step, and each parameter's XLA
sharding spec; with four devices:

    _orig_module.0.weight  (64, 16)  {devices=[4,1]0,1,2,3}
    _orig_module.0.bias    (64,)     {devices=[4]0,1,2,3}
    _orig_module.2.weight  (8, 64)   {devices=[1,4]0,1,2,3}
    _orig_module.2.bias    (8,)      {devices=[4]0,1,2,3}
"""

import argparse
import json

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch import nn
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

from xlarun.worker import init_process_group


def regression_batch(batch_size: int, features: int, outputs: int):
    """A fixed linear target with a little noise: a task a few steps visibly learn."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch_size, features, generator=generator)
    target_weights = torch.randn(features, outputs, generator=generator)
    targets = inputs @ target_weights + 0.01 * torch.randn(batch_size, outputs, generator=generator)
    return inputs, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    if not xr.is_spmd():
        xr.use_spmd()
    init_process_group()

    device_count = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(device_count), (device_count, 1), ("fsdp", "model"))
    device = torch_xla.device()

    torch.manual_seed(0)
    features, hidden, outputs = 16, 64, 8
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
    model = FSDPv2(model.to(device), mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    inputs, targets = regression_batch(8 * device_count, features, outputs)
    inputs, targets = inputs.to(device), targets.to(device)
    xs.mark_sharding(inputs, mesh, ("fsdp", None))
    xs.mark_sharding(targets, mesh, ("fsdp", None))

    losses = []
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())

    shardings = {name: torch_xla._XLAC._get_xla_sharding_spec(param) for name, param in model.named_parameters()}
    print(json.dumps({"devices": device_count, "losses": losses, "shardings": shardings}), flush=True)


if __name__ == "__main__":
    main()
