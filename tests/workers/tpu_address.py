"""Binds this worker's own entry of TORCH_TPU_SLICEBUILDER_ADDRESSES, as a TorchTPU worker does, and records
its environment in ``$DUMP_DIR/<RANK>_<TORCHELASTIC_RESTART_COUNT>.json``.

Usage: ``tpu_address.py [FAILING_ATTEMPTS]``: in attempts below FAILING_ATTEMPTS (default 0) rank 0 exits 3
once every rank of the attempt has recorded itself.

The entry is ``addresses[RANK % len(addresses)]``, which must split on ``:`` into exactly two parts
(torch_tpu's ``discovery.cc``). A bind that fails (a port taken, an address not on this host) fails the worker.
"""

import json
import os
import socket
import sys
import time

addresses = os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
host, port = addresses[rank % len(addresses)].split(":")
with socket.socket() as listener:
    listener.bind((host, int(port)))
    listener.listen()
    bound = f"{host}:{listener.getsockname()[1]}"
with open(os.path.join(os.environ["DUMP_DIR"], f"{rank}_{attempt}.json"), "w") as handle:
    json.dump({"env": dict(os.environ), "bound": bound}, handle)
if attempt < int(sys.argv[1] if len(sys.argv) > 1 else 0) and rank == 0:
    while not all(
        os.path.exists(os.path.join(os.environ["DUMP_DIR"], f"{other}_{attempt}.json"))
        for other in range(int(os.environ["WORLD_SIZE"]))
    ):
        time.sleep(0.02)
    raise SystemExit(3)
