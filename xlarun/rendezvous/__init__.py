"""Rendezvous: how the nodes of a job agree on ranks, and how they learn of each other's failures.

A single node needs no agreement (:class:`FixedRendezvous`, no torch import). Several
nodes meet through torch.distributed's TCPStore and rendezvous handlers; that code is
imported only on that path: ``distributed`` (the multi-node rendezvous) over ``store`` (the
store's plumbing), ``joining`` (who takes part, and each attempt's seats) and ``watching``
(heartbeats, the news of an attempt's end, the monitor).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from xlarun.failures import FailureRecord
from xlarun.ranks import NodeAssignment


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended for the whole job; every node learns the same."""

    succeeded: bool
    lost: Optional[str] = None
    """A node went silent or left before its workers finished: the line that says which."""
    admitting: bool = False
    """The workers stopped to let waiting nodes join: a restart that costs none of the allowed restarts."""


class JobEnded(Exception):
    """The job ended while this node waited for a place in it: one line, and exit code 0.

    As torchrun's graceful exit of a waiting node: a spare node of a finished job has
    nothing to do, and nothing failed.
    """


class Rendezvous(Protocol):
    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        """Meet the other nodes for the next attempt and return this node's place in the world.

        Raises :class:`JobEnded` when the job ends before this node got a place in it.

        ``attempt`` is this agent's count of attempts so far; a multi-node rendezvous numbers
        attempts for the whole job (a node that joins late takes the job's number), so the
        assignment's ``restart_count`` is the attempt's number.
        """

    def watch(self, stop: Callable[[str], None]) -> None:
        """Call ``stop(reason)`` when another node fails or disappears during this attempt, or nodes wait to join."""

    def publish_failure(self, failure: FailureRecord) -> None:
        """Tell the other nodes this node's workers failed."""

    def first_failure(self) -> Optional[FailureRecord]:
        """The attempt's first failure on any node, as published (``None`` on a single node)."""

    def finish_attempt(self, succeeded: bool) -> AttemptEnd:
        """This node's workers are gone: wait for the other nodes and say how the attempt ended."""

    def attempt_record(self) -> dict[str, Any]:
        """The attempt's world size and nodes, for the summary file."""

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
        self._nproc = 0

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        self._nproc = nproc_per_node
        return NodeAssignment.single_node(self._run_id, nproc_per_node, self._master_addr, self._master_port,
                                          node_rank=self._node_rank, nnodes=self._nnodes, restart_count=attempt)

    def watch(self, stop: Callable[[str], None]) -> None:
        return None

    def publish_failure(self, failure: FailureRecord) -> None:
        return None

    def first_failure(self) -> Optional[FailureRecord]:
        return None

    def finish_attempt(self, succeeded: bool) -> AttemptEnd:
        return AttemptEnd(succeeded)

    def attempt_record(self) -> dict[str, Any]:
        return {"world_size": self._nproc,
                "nodes": [{"node_rank": self._node_rank, "host": socket.gethostname(), "nproc": self._nproc}]}

    def close(self) -> None:
        return None

