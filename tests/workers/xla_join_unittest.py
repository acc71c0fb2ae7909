"""A unittest module in the shape of torch_xla's own torchrun test: each test joins with
``init_process_group("xla", init_method="xla://")`` in ``setUp`` and checks the world.

Usage: ``xla_join_unittest.py``

Under several PJRT CPU processes every process is rank 0 of a world of one: the one that binds
the store at MASTER_PORT fails the tests' checks of the world size, the others fail to join
(``EADDRINUSE``) in ``setUp``. The test runner reports each failure and exits 1.
"""

import os
import unittest

import torch.distributed as dist
import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" and "xla://"


class JoinedWorld(unittest.TestCase):
    def setUp(self) -> None:
        dist.init_process_group("xla", init_method="xla://")

    def tearDown(self) -> None:
        dist.destroy_process_group()

    def test_world_size_is_the_launchers(self) -> None:
        self.assertEqual(dist.get_world_size(), int(os.environ["WORLD_SIZE"]))

    def test_rank_is_the_launchers(self) -> None:
        self.assertEqual(dist.get_rank(), int(os.environ["RANK"]))

    def test_joined(self) -> None:
        self.assertTrue(dist.is_initialized())


if __name__ == "__main__":
    unittest.main()
