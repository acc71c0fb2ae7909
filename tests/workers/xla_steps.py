"""Runs three torch_xla steps on the CPU, printing a line of its own before each.

Usage: ``xla_steps.py``
"""

import sys

import torch
import torch_xla
import torch_xla.core.xla_model as xm

device = torch_xla.device()
value = torch.zeros(2, device=device)
for step in range(3):
    print(f"step {step}", file=sys.stderr, flush=True)
    value = value + 1
    xm.mark_step()
print(f"value {value.cpu().tolist()}", flush=True)
