"""A unittest module in the shape of torch_xla's own torchrun test: each test joins with
``init_process_group("xla", init_method="xla://")`` in ``setUp`` and checks the world.

Usage: ``xla_join_unittest.py DIR``

Under several PJRT CPU processes every process is rank 0 of a world of one: the one that binds
the store at MASTER_PORT fails the tests' checks of the world size, the others fail to join
(``EADDRINUSE``) in ``setUp``. The test runner reports each failure and exits 1.

So that the process serving the store fails first whatever the machine's load, and the others'
``EADDRINUSE`` is written by then: each process marks its first try to join with
``DIR/<RANK>.tried``; one that could not join writes its traceback at once (the runner would only
at its end) and waits to be stopped; the one that joined runs its checks once every process has tried.
"""

import os
import sys
import time
import traceback
import unittest
from pathlib import Path

import torch.distributed as dist
import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" and "xla://"

TRIED = Path(sys.argv[1])


def join_once_told() -> None:
    """Join; the first time, say at once how it went and wait for every process to have tried."""
    marker = TRIED / f"{os.environ['RANK']}.tried"
    if marker.exists():
        dist.init_process_group("xla", init_method="xla://")
        return
    try:
        dist.init_process_group("xla", init_method="xla://")
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        marker.write_text("")
        time.sleep(60)  # the launcher stops this process once the one that joined has failed
        raise
    marker.write_text("")
    deadline = time.monotonic() + 60
    while len(list(TRIED.glob("*.tried"))) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.05)


class JoinedWorld(unittest.TestCase):
    def setUp(self) -> None:
        join_once_told()

    def tearDown(self) -> None:
        dist.destroy_process_group()

    def test_world_size_is_the_launchers(self) -> None:
        self.assertEqual(dist.get_world_size(), int(os.environ["WORLD_SIZE"]))

    def test_rank_is_the_launchers(self) -> None:
        self.assertEqual(dist.get_rank(), int(os.environ["RANK"]))

    def test_joined(self) -> None:
        self.assertTrue(dist.is_initialized())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
