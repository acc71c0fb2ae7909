"""Rendezvous: how the nodes of a job agree on ranks, and how they learn of each other's failures.

A single node needs no agreement: :class:`FixedRendezvous`, no torch import. Several nodes
meet through torch.distributed's TCPStore and, for c10d, its rendezvous handler::

    from xlarun.rendezvous import FixedRendezvous, multi_node_rendezvous

    rendezvous = FixedRendezvous(run_id, master_addr, master_port)   # one node
    rendezvous = multi_node_rendezvous(config, environ)               # several: imports torch

The multi-node code is imported only on that path: ``node`` (a node's life in the job,
either backend) with one seating per backend, ``static`` and ``c10d``, over ``store`` (the
store's plumbing and key names), ``joining`` (who takes part, and each attempt's seats) and
``watching`` (heartbeats, the news of an attempt's end, the monitor).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from xlarun import structs
from xlarun.console import StatusLine
from xlarun.failures import FailureRecord
from xlarun.host.ports import free_ports
from xlarun.ranks import NodeAssignment
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any, Protocol

    from xlarun.config import LaunchConfig
    from xlarun.rendezvous.store import Connector
else:
    Protocol = object  # the protocols below only type; at run time they are plain classes


LOST_NODE_EXIT_CODE = 1
"""What a job that lost a node exits with: torchrun's agents exit 1 when one of them is lost."""


def shown(raw: bytes | str, limit: int = 200) -> str:
    """Text another process wrote to the job's store, fit for one line: decoded whatever its bytes
    (``\\xff`` for one that is not UTF-8), every control character escaped (an escape sequence
    would reach the terminal), at most ``limit`` characters."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    escaped = "".join(character if character.isprintable() else ascii(character)[1:-1] for character in text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


class LostNode(Struct, frozen=True):
    """A node that fell silent before its attempt ended: the root cause of that end, even where a
    worker elsewhere failed first in time (its peer vanished from under a collective)."""

    node_rank: int
    host: str
    silent_for: float
    """The heartbeat timeout it went past."""

    @property
    def message(self) -> str:
        return (
            f"node {self.node_rank} ({self.host}) stopped responding: no heartbeat for {self.silent_for:g} s "
            "(its launcher is gone, or its host stopped or was cut off)"
        )

    @property
    def exit_status(self) -> int:
        return LOST_NODE_EXIT_CODE

    def to_json(self) -> str:
        import json  # only what reads or writes a record loads json

        return json.dumps(structs.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> LostNode:
        """Raises ``ValueError`` for a record xlarun did not write: the store is anyone's to write to."""
        import json

        try:
            fields = json.loads(raw)
            lost = cls(int(fields["node_rank"]), shown(fields["host"]), float(fields["silent_for"]))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(f"not a lost node's record: {shown(raw)}") from error
        if not isinstance(fields["host"], str) or lost.node_rank < 0 or not 0 < lost.silent_for < float("inf"):
            raise ValueError(f"not a lost node's record: {shown(raw)}")
        return lost


class AttemptEnd(Struct, frozen=True):
    """How an attempt ended for the whole job; every node learns the same."""

    succeeded: bool
    lost: str | None = None
    """A node went silent or left before its workers finished: the line that says which."""
    admitting: bool = False
    """The workers stopped to let waiting nodes join: a restart that costs none of the allowed restarts."""
    lost_node: LostNode | None = None
    """The node that fell silent before the attempt ended, where one did (the first the store's host found)."""


class JobEnded(Exception):
    """The job ended while this node waited for a place in it: one line, and exit code 0.

    As torchrun's graceful exit of a waiting node: a spare node of a finished job has
    nothing to do, and nothing failed.
    """


class StopRequest(Protocol):
    def __call__(self, reason: str, hung: bool = False) -> None:
        """Stop this node's workers; ``hung``: the job is hung, so their stacks are taken first."""


class NodeStacks(Struct, frozen=True):
    """Where one node's ranks stood when the job was found hung, as the nodes share it."""

    node_rank: int
    host: str
    positions: dict[int, str]
    """By global rank (:func:`~xlarun.supervision.stacks.where`)."""
    stacks_files: dict[int, str]
    """The dump file of each rank whose stacks were taken, on that node's host."""

    def to_json(self) -> str:
        import json

        return json.dumps(structs.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> NodeStacks:
        """Raises ``ValueError`` for a record xlarun did not write; its text comes back escaped (:func:`shown`)."""
        import json

        try:
            fields = json.loads(raw)
            # JSON's keys are text; the ranks are numbers again.
            stacks = cls(
                node_rank=int(fields["node_rank"]),
                host=shown(fields["host"]),
                positions={int(rank): shown(where) for rank, where in fields["positions"].items()},
                stacks_files={int(rank): shown(path, 4096) for rank, path in fields["stacks_files"].items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(f"not a node's stacks record: {shown(raw)}") from error
        return stacks


class Rendezvous(Protocol):
    waits: bool
    """Whether :meth:`assign` and :meth:`finish_attempt` may block on other nodes: the agent then waits for them
    where a stop signal still reaches it. One node's never do."""

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        """Meet the other nodes for the next attempt and return this node's place in the world.

        Raises :class:`JobEnded` when the job ends before this node got a place in it.

        ``attempt`` is this agent's count of attempts so far. :class:`FixedRendezvous` makes it
        the assignment's ``restart_count``; the multi-node rendezvous does not read it: the job
        numbers its attempts (a node that joins late, or replaces a lost one, takes the number
        the others run under, not its own count), and ``restart_count`` is the job's number.
        """

    def watch(self, stop: StopRequest) -> None:
        """Call ``stop(reason)`` when another node fails or disappears during this attempt, or nodes wait to
        join, and ``stop(reason, hung=True)`` when another node found the job hung."""

    def announce_hang(self, reason: str) -> None:
        """Tell the other nodes this node found the job hung: each takes its workers' stacks, then stops."""

    def publish_stacks(self, stacks: NodeStacks) -> None:
        """Share where this node's ranks stood, for node 0's report."""

    def job_stacks(self, own: NodeStacks, wait: float) -> list[NodeStacks]:
        """Every node's :class:`NodeStacks` of this attempt, waiting up to ``wait`` seconds for those
        not yet shared (``own`` is this node's); by node rank."""

    def publish_failure(self, failure: FailureRecord) -> None:
        """Tell the other nodes this node's workers failed."""

    def first_failure(self) -> FailureRecord | None:
        """The attempt's first failure on any node, as published (``None`` on a single node)."""

    def finish_attempt(self, succeeded: bool) -> AttemptEnd:
        """This node's workers are gone: wait for the other nodes and say how the attempt ended."""

    def attempt_record(self) -> dict[str, Any]:
        """The attempt's world size and nodes, for the summary file."""

    def close(self) -> None:
        """Leave the job (and stop serving the store if this node served it)."""


class FixedRendezvous:
    """No store, no other node to meet: ranks follow from the flags alone.

    Runs a single node: ``--standalone``, or one static node at the master address and port.
    (A dry run plans its nodes without a rendezvous: :mod:`xlarun.planning.dryrun`.) With
    ``worker_ports`` each attempt gets ports picked free on every address of this host, one per
    worker (:attr:`~xlarun.ranks.NodeAssignment.worker_ports`); the job starts at the first attempt.
    """

    waits = False

    def __init__(self, run_id: str, master_addr: str, master_port: int, worker_ports: bool = False):
        self._run_id = run_id
        self._master_addr = master_addr
        self._master_port = master_port
        self._worker_ports = worker_ports
        self._nproc = 0
        self._started_ns = 0

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        self._nproc = nproc_per_node
        self._started_ns = self._started_ns or time.time_ns()
        node = NodeAssignment.single_node(
            self._run_id, nproc_per_node, self._master_addr, self._master_port, restart_count=attempt
        )
        ports = free_ports(nproc_per_node, "0.0.0.0") if self._worker_ports else ()
        return structs.replace(node, worker_ports=ports, job_started_ns=self._started_ns)

    def watch(self, stop: StopRequest) -> None:
        return None

    def announce_hang(self, reason: str) -> None:
        return None

    def publish_stacks(self, stacks: NodeStacks) -> None:
        return None

    def job_stacks(self, own: NodeStacks, wait: float) -> list[NodeStacks]:
        return [own]

    def publish_failure(self, failure: FailureRecord) -> None:
        return None

    def first_failure(self) -> FailureRecord | None:
        return None

    def finish_attempt(self, succeeded: bool) -> AttemptEnd:
        return AttemptEnd(succeeded)

    def attempt_record(self) -> dict[str, Any]:
        return {
            "world_size": self._nproc,
            "nodes": [{"node_rank": 0, "host": socket.gethostname(), "nproc": self._nproc}],
        }

    def close(self) -> None:
        return None


def multi_node_rendezvous(
    config: LaunchConfig,
    environ: Mapping[str, str],
    connector: Connector | None = None,
    *,
    node_hosts: bool = False,
    place: int | None = None,
    slices: int = 1,
) -> Rendezvous:
    """The rendezvous of one node of a multi-node job, seated by ``config``'s backend.

    Nothing is contacted until the first :meth:`~Rendezvous.assign`. ``connector`` opens each
    connection to the store (a TCPStore client unless given; the pod-scale benchmark passes
    one that counts requests). With ``node_hosts`` each assignment lists every node's address in
    node-rank order (:attr:`~xlarun.ranks.NodeAssignment.hosts`); ``place`` is this node's worker
    number in its TPU slice, by which the nodes are ranked where every one has one; ``slices`` the
    TPU slices of a multislice job, which every node must plan alike (or it is refused on joining).
    """
    # c10d logs every store hiccup at error level, with a C++ stack; the launcher reports such
    # events in one line. Only this process: workers get the environment the launcher started with.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    # Otherwise torch's handler serves a second store, on every interface, that nothing here uses.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The agent needs torch's store, not a device: without this, import torch loads every installed
    # device backend (torch_tpu and libtpu: about 3.5 s of CPU and libtpu's log lines on stderr).
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch.distributed  # noqa: F401  (the engine: imported on this path only)

    # A single node's start-up imports this package: the multi-node modules load only here.
    from xlarun.rendezvous.c10d import C10dSeating
    from xlarun.rendezvous.joining import Seating
    from xlarun.rendezvous.node import NodeRendezvous
    from xlarun.rendezvous.static import StaticSeating
    from xlarun.rendezvous.store import JobKeys, tcp_client

    connector = connector or tcp_client
    keys, status = JobKeys(config.rdzv_id), StatusLine()
    seating: Seating = (
        StaticSeating(config, keys, status)
        if config.rdzv_backend == "static"
        else C10dSeating(config, keys, status, connector)
    )
    return NodeRendezvous(
        config, environ, seating, keys, status, connector, node_hosts=node_hosts, place=place, slices=slices
    )
