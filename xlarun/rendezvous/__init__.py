"""Rendezvous: how the nodes of a job agree on ranks, and how they learn of each other's failures.

A single node needs no agreement (:class:`FixedRendezvous`, no torch import). Several
nodes meet through torch.distributed's TCPStore and rendezvous handlers; that code is
imported only on that path.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from xlarun.failures import FailureRecord
from xlarun.ranks import NodeAssignment


class Rendezvous(Protocol):
    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        """Meet the other nodes for ``attempt`` and return this node's place in the world."""

    def watch(self, stop: Callable[[str], None]) -> None:
        """Call ``stop(reason)`` when another node fails or disappears during this attempt."""

    def publish_failure(self, failure: FailureRecord) -> None:
        """Tell the other nodes this node's workers failed."""

    def first_failure(self) -> Optional[FailureRecord]:
        """The attempt's first failure on any node, as published (``None`` on a single node)."""

    def finish_attempt(self, succeeded: bool) -> bool:
        """This node's workers are gone: wait for the other nodes; True when the attempt succeeded everywhere."""

    def close(self) -> None:
        """Leave the job (and stop serving the store if this node served it)."""


class FixedRendezvous:
    """No store, no other node to meet: ranks follow from the flags alone.

    Runs a single node, and plans any node for a dry run.
    """

    def __init__(self, run_id: str, master_addr: str, master_port: int, node_rank: int = 0, nnodes: int = 1):
        self._run_id = run_id
        self._master_addr = master_addr
        self._master_port = master_port
        self._node_rank = node_rank
        self._nnodes = nnodes

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        return NodeAssignment.single_node(self._run_id, nproc_per_node, self._master_addr, self._master_port,
                                          node_rank=self._node_rank, nnodes=self._nnodes, restart_count=attempt)

    def watch(self, stop: Callable[[str], None]) -> None:
        return None

    def publish_failure(self, failure: FailureRecord) -> None:
        return None

    def first_failure(self) -> Optional[FailureRecord]:
        return None

    def finish_attempt(self, succeeded: bool) -> bool:
        return succeeded

    def close(self) -> None:
        return None

