"""The static backend's seating: each node gives its ``--node-rank``; node 0's agent serves the store.

:func:`~xlarun.rendezvous.multi_node_rendezvous` picks it for ``--rdzv-backend static``::

    seating = StaticSeating(config, JobKeys(config.rdzv_id), StatusLine())
    seating.store_role(host)   # node 0: StoreRole.SERVE (refused unless host is this host's); others: REACH

As torchrun's static rendezvous: the join waits ``--rdzv-conf timeout`` seconds unless
``join_timeout`` is given, node ranks are fixed, and the workers of the first attempt use
the job's store itself (at the master address and port, or ``--rdzv-endpoint``). A node
restarted with its rank takes over from the agent that held it once that agent left or was
declared lost (:func:`~xlarun.rendezvous.joining.claim_node_rank`); a node that joins while
an attempt runs waits for its end and takes part in the next. Each attempt is seated under
``xlarun/<run_id>/attempt_<n>/`` (:func:`~xlarun.rendezvous.joining.take_seat`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from xlarun.config import LaunchConfig
from xlarun.console import StatusLine
from xlarun.exceptions import UsageError
from xlarun.flags import flag
from xlarun.host.ports import is_local_address
from xlarun.rendezvous.joining import LeadAttempt, Member, Seat, claim_node_rank, current_attempt, take_seat
from xlarun.rendezvous.store import Client, JobKeys, StoreRole, Timeouts, conf_seconds


class StaticSeating:
    """The :class:`~xlarun.rendezvous.joining.Seating` of ``--rdzv-backend static`` (see the module docstring)."""

    def __init__(self, config: LaunchConfig, keys: JobKeys, status: StatusLine):
        self._config = config
        self._keys = keys
        self._status = status
        conf = config.rdzv_conf
        self.timeouts = Timeouts.read(conf, conf_seconds(conf, "timeout"))
        # Node 0 serves the store: a store lost before the first seat is node 0's.
        self.store_host_node: int | None = 0
        self.connections: tuple[str, ...] = ()
        # The nodes are fixed: none ever waits to be let in.
        self.nodes_waiting: Callable[[], int] | None = None
        self._store_host = ""

    def store_role(self, host: str) -> StoreRole:
        if self._config.node_rank != 0:
            return StoreRole.REACH
        if not is_local_address(host):
            raise UsageError(
                f"node 0 serves the store at {flag('master_addr')} {host}, which is not an address "
                "of this host: give this host's address"
            )
        return StoreRole.SERVE

    def joined(self, store: Client, host: str, port: int, agent: int, connections: Mapping[str, Client]) -> None:
        """Take this node's rank (or be refused: another live agent holds it)."""
        self._store_host = host
        claim_node_rank(
            store,
            self._keys,
            self._config.node_rank,
            agent,
            self.timeouts.heartbeat + 5,
            self.timeouts.beat_interval,
            self._status,
        )

    def seat(self, store: Client, me: Member, previous: Seat | None, lead: LeadAttempt) -> Seat:
        """Wait for every node of the attempt after ``previous`` (the job's current one on joining)."""
        deadline = time.monotonic() + self.timeouts.join
        attempt = (
            current_attempt(store, self._keys, deadline, self._status) if previous is None else previous.attempt + 1
        )
        waiting, reached = (
            ("waiting for nodes", "joined")
            if attempt == 0
            else (f"waiting for every node to start attempt {attempt}", f"were ready for attempt {attempt}")
        )
        return take_seat(
            store,
            self._keys.attempt(attempt) + "/",
            self._config.node_rank,
            self._config.max_nodes,
            me,
            lambda members: lead(attempt, members),
            deadline,
            self._status,
            waiting,
            reached,
        )

    def worker_store_host(self, attempt: int) -> str | None:
        """The first attempt's workers use the job's store (``None``), as torchrun's; later ones a fresh
        store on the job's store's host."""
        return None if attempt == 0 else self._store_host

    def leave_as_host(self, client: Client) -> None:
        """Nothing to close: the static backend has no round of its own."""
