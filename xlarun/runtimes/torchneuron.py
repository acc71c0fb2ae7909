"""TorchNeuron, AWS Neuron's native PyTorch backend (``neuron`` device and process group, no torch_xla).

Facts, from ``../shared/reference/torchtpu-torchneuron.md`` §8 (AWS's documentation; nothing here ran
on a Trainium):

- Neuron 2.30 dropped PyTorch/XLA for training; TorchNeuron replaces it from Neuron 2.31 and PyTorch
  2.12 (public beta in Neuron 2.33, trn2 and trn3 only). Its package is named ``torch-neuronx``, like
  the legacy XLA library, and the two must not be mixed: the legacy one needs torch_xla, so
  ``torch-neuronx`` without torch_xla is the native backend.
- A worker joins with ``dist.init_process_group(backend="neuron", init_method="env://")`` and reads
  ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``. The documented launch is plain torchrun with one process
  per logical NeuronCore (64 on a trn2.48xlarge at the default LNC=2, TorchTitan's ``NGPU``); several
  nodes need EFA and a c10d endpoint every node reaches.
- The Neuron runtime reads ``NEURON_RT_VISIBLE_CORES`` (each core exclusive to one process) and
  ``NEURON_RT_ROOT_COMM_ID`` (rank 0's address, "mandatory" for collectives), and says framework
  extensions set most of its variables themselves. No reachable page says whether TorchNeuron derives
  them from ``LOCAL_RANK`` and ``MASTER_ADDR``, and none of its guides asks the user to set them.

So a worker gets torchrun's contract and nothing else: that is all the documented launch, plain
torchrun, gives it, so TorchNeuron must derive its cores and root communicator from it. Setting
``NEURON_RT_VISIBLE_CORES`` to the local rank, as xlarun does for torch_xla before 2.5, could
contradict a program that takes device ``neuron:<LOCAL_RANK>`` among all the host's cores. None of
torch_xla's PJRT or ``NEURON_PJRT_*`` variables is set. EFA's ``FI_*`` variables pass from the
launcher's environment, as under torchrun.

The compile cache (``--compile-cache``, :func:`cache_env`): TorchNeuron keeps the NEFF of each graph it
compiles in its persistent NEFF cache, ``TORCH_NEURONX_NEFF_CACHE_DIR`` (AWS's "TorchNeuron environment
variables" and "What are Neuron Compiler artifacts?" pages), which lets later runs skip compiling. Every
rank gets the same directory.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from xlarun.ranks import NodeAssignment
    from xlarun.runtimes import XlaOptions

NEFF_CACHE_DIR = "TORCH_NEURONX_NEFF_CACHE_DIR"
CACHE_SUBDIRECTORY = "torchneuron"


def env(options: XlaOptions, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """Nothing beyond torchrun's contract (see the module docstring for why)."""
    return {}


def cache_env(root: str, writer: bool) -> dict[str, str]:
    """TorchNeuron's NEFF cache in ``root``'s :data:`CACHE_SUBDIRECTORY`, the same for every rank."""
    return {NEFF_CACHE_DIR: os.path.join(root, CACHE_SUBDIRECTORY)}
