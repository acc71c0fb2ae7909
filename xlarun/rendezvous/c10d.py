"""The c10d backend's seating: rounds of torch's ``DynamicRendezvousHandler`` assign the node ranks.

:func:`~xlarun.rendezvous.multi_node_rendezvous` picks it for ``--rdzv-backend c10d``::

    seating = C10dSeating(config, JobKeys(config.rdzv_id), StatusLine(), tcp_client)
    seating.store_role(host)   # is_host=1: SERVE; is_host=0: REACH; unset: SERVE_UNLESS_TAKEN if host is this one

The agent on the endpoint's host serves the job's store (or the one named by ``--rdzv-conf
is_host``). Elasticity follows torchrun: every attempt is a new round of torch's handler.
Nodes that remain after one is lost restart with the nodes there are (at least the
minimum); a node arriving while fewer than the maximum run is let in by a restart (the
monitor asks :attr:`C10dSeating.nodes_waiting`); a node started in place of a lost one
joins the next round. Each round is seated under torch's own prefix for it; the leader
numbers the attempt (``xlarun/<run_id>/attempts``) and serves the workers' store at its own
address, as torchrun, so MASTER_ADDR is where global rank 0 runs.

torch's errors from a round become one line each (:meth:`C10dSeating.seat`): a timeout
counts the nodes that came; a closed round ends a node still waiting for its first seat
with nothing to run (:class:`~xlarun.rendezvous.JobEnded`) and fails one that ran; a lost
connection names the store's node. A round closed on a node that came after the job's last
attempt had ended was a launch before this node's, still ending (a container restarted in
place reaches it before the store's host restarts): the node waits for the next launch's
store rather than end with it (:class:`~xlarun.rendezvous.joining.FinishedJob`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from xlarun.config import LaunchConfig
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError
from xlarun.flags import flag
from xlarun.host.ports import address_facing, is_local_address
from xlarun.rendezvous import JobEnded
from xlarun.rendezvous.joining import FinishedJob, LeadAttempt, Member, Seat, take_seat
from xlarun.rendezvous.store import (
    STATUS_INTERVAL,
    Client,
    Connector,
    JobKeys,
    StoreRole,
    Timeouts,
    conf_flag,
    first_line,
    lost_store_line,
)

# How long the host keeps the store up for waiting nodes to hear that the job ended: torch's
# handler reads its round's state once a second while a node waits.
CLOSING_GRACE = 3.0


class Round(Protocol):
    """A round torch's handler formed (its ``RendezvousInfo``): the round's own store, and this node's place."""

    @property
    def store(self) -> Client: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


class RoundHandler(Protocol):
    """The calls made of torch's ``DynamicRendezvousHandler``."""

    def next_rendezvous(self) -> Round: ...

    def num_nodes_waiting(self) -> int: ...

    def set_closed(self) -> None: ...


HandlerFactory = Callable[[LaunchConfig, str, Client, Client], RoundHandler]
"""Makes the handler from the config, the endpoint, the job's store and a connection of its own."""


def torch_handler(config: LaunchConfig, endpoint: str, store: Client, backend: Client) -> RoundHandler:
    """torch's ``DynamicRendezvousHandler`` for this job.

    Its state and keep-alives travel on the ``backend`` connection, its own (its keep-alive
    thread must never queue behind a wait of this agent's); each round's own keys go
    through ``store``.
    """
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    params = RendezvousParameters(
        backend="c10d",
        endpoint=endpoint,
        run_id=config.rdzv_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **{k: v for k, v in config.rdzv_conf.items() if k not in ("token", "is_host")},
    )
    # TCPStores, and a handler whose rounds hand one out: torch's stubs know them by another name than the
    # calls they have.
    rounds: Any = store
    state: Any = backend
    handler: Any = create_handler(rounds, C10dRendezvousBackend(state, config.rdzv_id), params)
    return handler


class C10dSeating:
    """The :class:`~xlarun.rendezvous.joining.Seating` of ``--rdzv-backend c10d`` (see the module docstring).

    ``create_handler`` makes torch's handler once this node joined the store; a test passes a fake.
    """

    def __init__(
        self,
        config: LaunchConfig,
        keys: JobKeys,
        status: StatusLine,
        connector: Connector,
        create_handler: HandlerFactory = torch_handler,
    ):
        # torchrun's c10d handler never reads "timeout" (its static rendezvous does).
        self.timeouts = Timeouts.read(config.rdzv_conf)
        self._config = config
        self._keys = keys
        self._status = status
        self._connector = connector
        self._create_handler = create_handler
        # Whichever agent runs on the endpoint's host serves the store: no node rank says which.
        self.store_host_node: int | None = None
        self.connections: tuple[str, ...] = ("rounds",)
        self.nodes_waiting: Callable[[], int] | None = self._count_waiting
        self._store_host = ""
        self._store_port = 0
        self._handler: RoundHandler | None = None
        # Held while torch's handler runs a round, so the monitor does not read its state meanwhile.
        self._handler_lock = threading.Lock()

    def store_role(self, host: str) -> StoreRole:
        is_host = conf_flag(self._config.rdzv_conf, "is_host")
        if is_host is None:
            return StoreRole.SERVE_UNLESS_TAKEN if is_local_address(host) else StoreRole.REACH
        return StoreRole.SERVE if is_host else StoreRole.REACH

    def joined(self, store: Client, host: str, port: int, agent: int, connections: Mapping[str, Client]) -> None:
        """Count this agent in (for the status line and the timeout's line) and make torch's handler."""
        self._store_host, self._store_port = host, port
        store.add(self._keys("arrived"), 1)
        self._handler = self._create_handler(self._config, self._where, store, connections["rounds"])

    @property
    def _where(self) -> str:
        return f"{self._store_host}:{self._store_port}"

    def _count_waiting(self) -> int:
        """Nodes in torch's wait list (0 while a round is being formed: the handler is busy then)."""
        if not self._handler_lock.acquire(blocking=False):
            return 0
        try:
            assert self._handler is not None
            return int(self._handler.num_nodes_waiting())
        finally:
            self._handler_lock.release()

    def seat(self, store: Client, me: Member, previous: Seat | None, lead: LeadAttempt) -> Seat:
        """Take part in torch's next round, then seat its nodes with the round's own keys (torch
        prefixes them with the round)."""
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        assert self._handler is not None
        with self._handler_lock, self._ticking(), self._counted(store, self._keys("unseated"), previous is None):
            came_after_end = previous is None and self._job_ended(store)
            try:
                info = self._handler.next_rendezvous()
            except RendezvousError as error:
                raise self._one_line(error, store, previous, came_after_end) from None
        self._status.clear()
        return take_seat(
            info.store,
            "xlarun/",
            info.rank,
            info.world_size,
            me,
            lambda members: lead(self._number_attempt(store), members),
            time.monotonic() + self.timeouts.join,
            self._status,
            "seating the round's nodes",
            "took their seats",
        )

    def _number_attempt(self, store: Client) -> int:
        """As the round's leader: the attempt's number, from the job's count (a round has none of its own)."""
        return int(store.add(self._keys("attempts"), 1)) - 1

    def _job_ended(self, store: Client) -> bool:
        """Whether the job's latest attempt has ended: until the next is seated, no attempt runs."""
        published = int(store.add(self._keys("published"), 0))
        return published > 0 and store.check([self._keys.attempt(published - 1, "end")])

    def _one_line(self, error: Exception, store: Client, previous: Seat | None, came_after_end: bool) -> Exception:
        """What a round's error means for this node: before its first seat (``previous`` is None) or after,
        having come while no attempt ran (``came_after_end``) or not."""
        from torch.distributed.elastic.rendezvous.api import (
            RendezvousClosedError,
            RendezvousConnectionError,
            RendezvousGracefulExitError,
            RendezvousTimeoutError,
        )

        config, run_id = self._config, self._keys.run_id
        if isinstance(error, RendezvousTimeoutError):
            if previous is None:
                arrived = int(store.add(self._keys("arrived"), 0))
                return LaunchError(
                    f"{arrived} of {config.min_nodes} nodes joined in {self.timeouts.join:.0f} s "
                    f"at {self._where} (run id {run_id!r}): start the missing nodes with the "
                    f"same {flag('rdzv_endpoint')} and {flag('rdzv_id')}"
                )
            return LaunchError(
                f"fewer than {config.min_nodes} nodes (the minimum of {flag('nnodes')}) came back "
                f"within {self.timeouts.join:.0f} s after attempt {previous.attempt}"
            )
        if isinstance(error, (RendezvousClosedError, RendezvousGracefulExitError)):
            if came_after_end:
                return FinishedJob(
                    f"found only a finished job of run id {run_id!r} at {self._where}: it ended "
                    "before this node came, and no next launch of it came within the join timeout "
                    f"({self.timeouts.join:.0f} s)"
                )
            if previous is None:
                return JobEnded(
                    f"the job of run id {run_id!r} at {self._where} ended while this node "
                    "waited for a place in it; nothing to run"
                )
            return LaunchError(f"the rendezvous of run id {run_id!r} at {self._where} is closed: its job has ended")
        if isinstance(error, RendezvousConnectionError):
            # torch's wrapper says only "see inner exception": the inner one says what happened.
            store_node = previous.store_node if previous is not None else self.store_host_node
            return LaunchError(lost_store_line(self._where, store_node, error.__cause__ or error))
        return LaunchError(f"rendezvous at {self._where} failed: {first_line(error) or type(error).__name__}")

    @contextlib.contextmanager
    def _counted(self, store: Client, key: str, counting: bool) -> Iterator[None]:
        """While ``counting``, this agent counts in ``key`` for the duration of the block."""
        if counting:
            store.add(key, 1)
        try:
            yield
        finally:
            if counting:
                with contextlib.suppress(Exception):  # a store that is gone counts nobody
                    store.add(key, -1)

    @contextlib.contextmanager
    def _ticking(self) -> Iterator[None]:
        """On a terminal, a status line while torch's handler forms a round; nothing is read otherwise."""
        if not self._status.tty:
            yield
            return
        stop = threading.Event()
        started = time.monotonic()
        config = self._config
        expected = f"{config.min_nodes}{'' if config.min_nodes == config.max_nodes else f'-{config.max_nodes}'}"
        client = self._connector(self._store_host, self._store_port, self.timeouts.call)

        def tick() -> None:
            while not stop.wait(STATUS_INTERVAL):
                arrived = int(client.add(self._keys("arrived"), 0))
                self._status.update(
                    f"waiting for nodes: {arrived} joined, {expected} expected ({time.monotonic() - started:.0f} s)"
                )

        threading.Thread(target=tick, daemon=True).start()
        try:
            yield
        finally:
            stop.set()

    def worker_store_host(self, attempt: int) -> str | None:
        """At this node's own address, as torchrun, so MASTER_ADDR (and the XLA coordinator derived
        from it) is where global rank 0 runs."""
        return self._config.local_addr or address_facing(self._store_host, self._store_port)

    def leave_as_host(self, client: Client) -> None:
        """Close torch's round, as torchrun's agents do, and give the nodes still waiting for a place
        the moment they need to hear it (rather than lose the store)."""
        assert self._handler is not None
        self._handler.set_closed()
        deadline = time.monotonic() + CLOSING_GRACE
        while int(client.add(self._keys("unseated"), 0)) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
