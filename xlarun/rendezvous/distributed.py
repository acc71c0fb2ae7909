"""Several nodes meeting over torch.distributed's TCPStore (static) or its c10d rendezvous handler.

This module is imported only for multi-node launches: it is where torch is imported.

One TCPStore serves the whole job: node 0's agent hosts it for ``static``, the agent on
the endpoint's host for ``c10d``. The store listens only on the address it was given.
Workers see a store as torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``,
keys under ``/worker/attempt_<n>``), so ``env://``, ``tcp://`` and ``xla://`` all find
it: the job's own on the first static attempt, otherwise one that node rank 0's agent
serves for that attempt alone, at its own address.

Beside torch's keys, the agents keep a few of their own: two whatever the run id::

    xlarun/job                   run id and token digest: a stray agent is refused
    xlarun/refused               how many agents were refused; ``xlarun/refused/last`` says who

and under ``xlarun/<run_id>/``::

    agents                       a counter that gives each agent its id
    heartbeat/<agent>            a counter each agent bumps; ``left`` once it left on purpose
    gone/<agent>                 the agent left or was declared lost: its static node rank is free
    node/<rank>                  static: the agent holding each node rank
    host_agent                   the agent serving the store, to name it should it vanish
    arrived                      c10d: agents that came, for the status line and the timeout's line
    unseated                     c10d: agents in torch's round that never had a seat; the host, closing
                                 the round at the job's end, waits a moment for them to hear it
    attempts                     c10d: numbers the attempts for the whole job
    published                    one more than the latest attempt seated (the monitor follows it)
    attempt_<n>/roster           the attempt's nodes in rank order (agent, host, workers)
    attempt_<n>/end              what ended the attempt (first writer wins); every node waits on it
    attempt_<n>/failure          the first failure of the attempt (JSON), first writer wins
    attempt_<n>/done             how many nodes' workers all succeeded
    attempt_<n>/left, all_left   how many nodes read the outcome and left; the host closes after all

Seating an attempt (``attempt_<n>/`` for static, the c10d round's own prefix) is described
in :mod:`~xlarun.rendezvous.joining`; watching it in :mod:`~xlarun.rendezvous.watching`.

Elasticity (c10d) follows torchrun: every attempt is a new round of torch's
``DynamicRendezvousHandler``. Nodes that remain after one is lost restart with the nodes
there are (at least the minimum); a node arriving while fewer than the maximum run is let
in by a restart; a node started in place of a lost one joins the next round. Static node
ranks are fixed; a node restarted with its rank takes over from the lost agent.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional

from xlarun.config import LaunchConfig
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import FailureRecord
from xlarun.flags import flag
from xlarun.host.ports import address_facing, is_local_address
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import AttemptEnd, JobEnded
from xlarun.rendezvous.joining import (
    Member,
    Roster,
    Seat,
    announce_change,
    check_job,
    claim_node_rank,
    current_attempt,
    membership_change,
    read_roster,
    take_seat,
)
from xlarun.rendezvous.store import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_JOIN_TIMEOUT,
    STATUS_INTERVAL,
    Client,
    Connector,
    JobKeys,
    beat_interval,
    conf_flag,
    conf_seconds,
    connect_client,
    first_line,
    lost_store_is_one_line,
    serve_store,
    tcp_client,
)
from xlarun.rendezvous.watching import (
    DONE,
    LEFT,
    LEFT_BEAT,
    EndWatch,
    Heartbeat,
    Monitor,
    News,
    announce,
    wait_for_end,
    wait_until_left,
)

# How long a connection may take to open, and a store may leave a heartbeat unanswered before it
# is taken for gone (a host that vanished without closing its connections).
CALL_TIMEOUT = 30.0
# How long the host keeps the store up for waiting nodes to hear that the job ended: torch's
# handler reads its round's state once a second while a node waits.
CLOSING_GRACE = 3.0


class StoreRendezvous:
    """The multi-node :class:`~xlarun.rendezvous.Rendezvous` (see the module docstring).

    ``connector`` opens each connection to the store; the pod-scale benchmark passes one
    that counts requests.
    """

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], connector: Connector = tcp_client):
        # c10d logs every store hiccup at error level, with a C++ stack; the launcher reports such
        # events in one line. Only this process: workers get the environment the launcher started with.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        # Otherwise torch's handler serves a second store, on every interface, that nothing here uses.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        import torch.distributed  # noqa: F401  (the engine: imported on this path only)

        self._config = config
        conf = config.rdzv_conf
        # torchrun's static rendezvous reads "timeout" for the join; c10d never reads it.
        join_default = (conf_seconds(conf, "timeout", DEFAULT_JOIN_TIMEOUT) if config.rdzv_backend == "static"
                        else DEFAULT_JOIN_TIMEOUT)
        self._join_timeout = conf_seconds(conf, "join_timeout", join_default)
        self._heartbeat_timeout = conf_seconds(conf, "heartbeat_timeout", DEFAULT_HEARTBEAT_TIMEOUT)
        self._close_timeout = conf_seconds(conf, "close_timeout", DEFAULT_CLOSE_TIMEOUT)
        self._interval = beat_interval(self._heartbeat_timeout)
        self._token = conf.get("token") or environ.get("XLARUN_RDZV_TOKEN", "")
        self._keys = JobKeys(config.rdzv_id)
        self._connector = connector
        self._status = StatusLine()
        self._host = config.local_addr or socket.getfqdn()
        self._store_host = ""
        self._store_port = 0
        self._serving = False
        # One connection per thread that may block: a TCPStore client serialises its calls.
        self._store: Optional[Client] = None
        self._watch_client: Optional[Client] = None
        self._beats: Optional[Heartbeat] = None
        self._monitor: Optional[Monitor] = None
        self._handler: Any = None
        # Held while torch's handler runs a round, so the monitor does not read its state meanwhile.
        self._handler_lock = threading.Lock()
        self._agent = 0
        self._seat: Optional[Seat] = None
        self._roster: Optional[Roster] = None
        self._watch: Optional[EndWatch] = None
        self._stop: Optional[Callable[[str], None]] = None
        self._lock = threading.Lock()
        self._lost: Optional[str] = None
        self._worker_store_server: Any = None

    # -- joining ------------------------------------------------------------------------------

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        with lost_store_is_one_line(self._describe_lost_store):
            if self._store is None:
                self._join()
            me = Member(self._agent, self._host, nproc_per_node)
            seat = self._seat_static(me) if self._config.rdzv_backend == "static" else self._seat_c10d(me)
            self._begin(seat)
        return NodeAssignment(run_id=self._keys.run_id, node_rank=seat.node_rank, nnodes=seat.nnodes,
                              local_world_size=nproc_per_node, rank_offset=seat.rank_offset,
                              world_size=seat.world_size, master_addr=seat.master_addr, master_port=seat.master_port,
                              restart_count=seat.attempt, agent_store=True)

    def _join(self) -> None:
        """Reach (or serve) the job's store, pass the job check, and start beating."""
        config = self._config
        host, port = config.store_address()
        if config.rdzv_backend == "static":
            serve = explicit = config.node_rank == 0
            if serve and not is_local_address(host):
                raise UsageError(f"node 0 serves the store at {flag('master_addr')} {host}, which is not an address "
                                 "of this host: give this host's address")
        else:
            is_host = conf_flag(config.rdzv_conf, "is_host")
            serve = is_host if is_host is not None else is_local_address(host)
            explicit = bool(is_host)
        store = self._open_store(host, port, serve, explicit)
        where = f"{host}:{port}"
        refusals_seen = check_job(store, self._serving, self._keys.run_id, self._token, where,
                                  time.monotonic() + self._join_timeout, self._status)
        # Every connection is made before this agent counts as joined: a slow connect must delay
        # joining, never a heartbeat. Opened side by side: torch's client looks up a name for the
        # store's address on each connection, and a slow resolver then costs one wait, not several.
        static = config.rdzv_backend == "static"
        roles = ["watch", "beat", *(["monitor"] if self._serving else []), *([] if static else ["rounds"])]
        with concurrent.futures.ThreadPoolExecutor(len(roles)) as pool:
            clients = dict(zip(roles, pool.map(lambda _: self._connector(host, port, CALL_TIMEOUT), roles)))
        self._watch_client = clients["watch"]
        self._agent = int(store.add(self._keys("agents"), 1))
        store.add(self._keys.heartbeat(self._agent), 1)
        self._beats = Heartbeat(clients["beat"], self._keys.heartbeat(self._agent), self._interval, CALL_TIMEOUT,
                                self._on_store_lost)
        self._beats.start()
        if static:
            claim_node_rank(store, self._keys, config.node_rank, self._agent, self._heartbeat_timeout + 5,
                            self._interval, self._status)
        else:
            store.add(self._keys("arrived"), 1)
            self._handler = self._create_handler(store, clients["rounds"], host, port)
        if self._serving:
            store.set(self._keys("host_agent"), str(self._agent))
            waiting = self._nodes_waiting if self._handler is not None else None
            self._monitor = Monitor(clients["monitor"], self._keys, self._heartbeat_timeout, self._interval,
                                    self._status, refusals_seen, waiting, config.max_nodes)
            self._monitor.start()

    def _open_store(self, host: str, port: int, serve: bool, explicit_host: bool) -> Client:
        """Serve or reach the job's store.

        A port this host cannot bind means another agent here serves the store, so this one
        reaches it instead; not so when this host was named to serve it (``explicit_host``).
        """
        store: Optional[Client] = None
        if serve:
            try:
                store, _ = serve_store(host, port, self._join_timeout)
            except OSError as error:
                if explicit_host:
                    raise UsageError(f"cannot serve the rendezvous store on {host}:{port}: {error.strerror}; "
                                     f"pick a free port ({flag('master_port')} or {flag('rdzv_endpoint')} "
                                     "host:PORT)") from None
                serve = False
        if store is None:
            store = connect_client(self._connector, host, port, self._join_timeout, CALL_TIMEOUT, self._status)
        self._serving = serve
        self._store, self._store_host, self._store_port = store, host, port
        return store

    def _create_handler(self, store: Client, backend: Client, host: str, port: int) -> Any:
        """torch's ``DynamicRendezvousHandler`` for this job.

        Its state and keep-alives travel on the ``backend`` connection, its own (its keep-alive
        thread must never queue behind a wait of this agent's); each round's own keys go
        through ``store``.
        """
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        config = self._config
        params = RendezvousParameters(backend="c10d", endpoint=f"{host}:{port}", run_id=self._keys.run_id,
                                      min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                                      local_addr=config.local_addr,
                                      **{k: v for k, v in config.rdzv_conf.items() if k not in ("token", "is_host")})
        # TCPStores; torch's stubs know them by another name than the calls they have.
        rounds: Any = store
        state: Any = backend
        return create_handler(rounds, C10dRendezvousBackend(state, self._keys.run_id), params)

    def _nodes_waiting(self) -> int:
        """Nodes in torch's wait list (0 while a round is being formed: the handler is busy then)."""
        if not self._handler_lock.acquire(blocking=False):
            return 0
        try:
            return int(self._handler.num_nodes_waiting())
        finally:
            self._handler_lock.release()

    def _seat_static(self, me: Member) -> Seat:
        assert self._store is not None
        deadline = time.monotonic() + self._join_timeout
        attempt = (current_attempt(self._store, self._keys, deadline, self._status) if self._seat is None
                   else self._seat.attempt + 1)
        waiting, reached = (("waiting for nodes", "joined") if attempt == 0 else
                            (f"waiting for every node to start attempt {attempt}", f"were ready for attempt {attempt}"))
        return take_seat(self._store, self._keys.attempt(attempt) + "/", self._config.node_rank, self._config.max_nodes,
                         me, lambda members: self._lead(attempt, members), deadline, self._status, waiting, reached)

    def _seat_c10d(self, me: Member) -> Seat:
        from torch.distributed.elastic.rendezvous.api import (
            RendezvousClosedError,
            RendezvousConnectionError,
            RendezvousError,
            RendezvousGracefulExitError,
            RendezvousTimeoutError,
        )

        config = self._config
        where = f"{self._store_host}:{self._store_port}"
        unseated = self._keys("unseated")
        with self._handler_lock, self._ticking(), self._counted(unseated, self._seat is None):
            try:
                info = self._handler.next_rendezvous()
            except RendezvousTimeoutError:
                if self._seat is None:
                    arrived = int(self._store_client().add(self._keys("arrived"), 0))
                    raise LaunchError(f"{arrived} of {config.min_nodes} nodes joined in {self._join_timeout:.0f} s "
                                      f"at {where} (run id {self._keys.run_id!r}): start the missing nodes with the "
                                      f"same {flag('rdzv_endpoint')} and {flag('rdzv_id')}") from None
                raise LaunchError(f"fewer than {config.min_nodes} nodes (the minimum of {flag('nnodes')}) came back "
                                  f"within {self._join_timeout:.0f} s after attempt {self._seat.attempt}") from None
            except (RendezvousClosedError, RendezvousGracefulExitError):
                if self._seat is None:
                    raise JobEnded(f"the job of run id {self._keys.run_id!r} at {where} ended while this node "
                                   "waited for a place in it; nothing to run") from None
                raise LaunchError(f"the rendezvous of run id {self._keys.run_id!r} at {where} is closed: "
                                  "its job has ended") from None
            except RendezvousConnectionError as error:
                # torch's wrapper says only "see inner exception": the inner one says what happened.
                raise LaunchError(self._describe_lost_store(error.__cause__ or error)) from None
            except RendezvousError as error:
                detail = first_line(error) or type(error).__name__
                raise LaunchError(f"rendezvous at {where} failed: {detail}") from None
        self._status.clear()
        # The round's own keys (torch prefixes them with the round) seat its nodes.
        return take_seat(info.store, "xlarun/", info.rank, info.world_size, me,
                         lambda members: self._lead(None, members), time.monotonic() + self._join_timeout,
                         self._status, "seating the round's nodes", "took their seats")

    @contextlib.contextmanager
    def _counted(self, key: str, counting: bool) -> Iterator[None]:
        """While ``counting``, this agent counts in ``key`` for the duration of the block."""
        store = self._store_client()
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
        client = self._connector(self._store_host, self._store_port, CALL_TIMEOUT)

        def tick() -> None:
            while not stop.wait(STATUS_INTERVAL):
                arrived = int(client.add(self._keys("arrived"), 0))
                self._status.update(f"waiting for nodes: {arrived} joined, {expected} expected "
                                    f"({time.monotonic() - started:.0f} s)")

        threading.Thread(target=tick, daemon=True).start()
        try:
            yield
        finally:
            stop.set()

    def _lead(self, attempt: Optional[int], members: list[Member]) -> list[Seat]:
        """As the attempt's node rank 0: number the attempt (c10d), serve the workers' store, seat everyone."""
        store = self._store_client()
        if attempt is None:
            attempt = int(store.add(self._keys("attempts"), 1)) - 1
        master_addr, master_port = self._worker_store(attempt)
        host_agent = store.get(self._keys("host_agent")).decode()
        store_node = next((rank for rank, m in enumerate(members) if str(m.agent) == host_agent), None)
        roster = Roster(tuple(members))
        change = ""
        previous = self._keys.attempt(attempt - 1, "roster")
        if attempt > 0 and store.check([previous]):
            change = membership_change(Roster.decode(store.get(previous)), roster)
        store.set(self._keys.attempt(attempt, "roster"), roster.encode())
        # The monitor follows the latest attempt seated.
        store.set(self._keys("published"), str(attempt + 1))
        # As torchrun: the workers of the nodes ranked before come first.
        offsets = [0, *itertools.accumulate(m.nproc for m in members)]
        world_size = offsets[-1]
        return [Seat(attempt=attempt, node_rank=rank, nnodes=len(members), rank_offset=offsets[rank],
                     world_size=world_size, master_addr=master_addr, master_port=master_port, store_node=store_node,
                     change=change) for rank in range(len(members))]

    def _worker_store(self, attempt: int) -> tuple[str, int]:
        """Where the workers' store is (MASTER_ADDR, MASTER_PORT) for ``attempt``.

        Static: the job's store at the master address and port on the first attempt, as
        torchrun. Otherwise a store served by this agent (node rank 0 of the attempt): at the
        master address (static), or at this node's own address (c10d), as torchrun, so
        MASTER_ADDR (and the XLA coordinator derived from it) is where global rank 0 runs.
        Every restart gets a fresh store: torch's ``env://`` reuses an agent store without a
        per-attempt prefix, so keys a failed attempt left would mislead the next one.
        """
        static = self._config.rdzv_backend == "static"
        if static and attempt == 0:
            return self._store_host, self._store_port
        host = (self._store_host if static else
                self._config.local_addr or address_facing(self._store_host, self._store_port))
        # Replacing the previous attempt's store stops its server.
        self._worker_store_server, port = serve_store(host, 0, self._join_timeout)
        return host, port

    def _begin(self, seat: Seat) -> None:
        """The attempt is seated: announce a change of nodes and start waiting for its end."""
        assert self._watch_client is not None
        if seat.change:
            announce_change(seat.change, seat.nnodes, self._config.min_nodes, self._config.max_nodes, self._status)
        if self._config.summary_file:
            self._roster = read_roster(self._store_client(), self._keys, seat.attempt)
        self._seat = seat
        self._watch = EndWatch(self._watch_client, self._keys.attempt(seat.attempt, "end"), self._on_news,
                               self._on_store_lost)

    # -- during an attempt --------------------------------------------------------------------

    def watch(self, stop: Callable[[str], None]) -> None:
        with self._lock:
            self._stop = stop
            # News that came before the workers' supervisor was listening still stops them.
            reason = self._lost or self._stop_reason()
        if reason:
            stop(reason)

    def _stop_reason(self) -> Optional[str]:
        news = self._watch.news if self._watch is not None else None
        return news.reason if news is not None and news.kind != DONE else None

    def _on_news(self, news: News) -> None:
        if news.kind != DONE:
            self._request_stop(news.reason)

    def _on_store_lost(self, error: BaseException) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = self._describe_lost_store(error)
            watch = self._watch
        if watch is not None:
            watch.give_up()
        self._request_stop(self._lost)

    def _describe_lost_store(self, error: BaseException) -> str:
        """One line for a store that stopped answering: the node hosting it is gone, and c10d with it."""
        node = self._seat.store_node if self._seat is not None else (0 if self._config.rdzv_backend == "static"
                                                                     else None)
        host = "the node hosting it" if node is None else f"node {node}, which hosted it,"
        return (f"lost the rendezvous store at {self._store_host}:{self._store_port} ({first_line(error)}): "
                f"{host} stopped")

    def _request_stop(self, reason: str) -> None:
        with self._lock:
            stop = self._stop
        if stop is not None:
            stop(reason)

    def publish_failure(self, failure: FailureRecord) -> None:
        from torch.distributed import DistNetworkError

        seat = self._seat
        assert seat is not None
        if self._lost:
            return  # a hung store would never answer; the watchers report the loss
        store = self._store_client()
        with contextlib.suppress(DistNetworkError):  # the store's host is gone: the watchers report that
            store.compare_set(self._keys.attempt(seat.attempt, "failure"), "", json.dumps(dataclasses.asdict(failure)))
            announce(store, self._keys, seat.attempt,
                     News("failure", f"rank {failure.rank} on node {failure.node_rank} failed "
                                     f"(exit code {failure.exit_status})"))

    def first_failure(self) -> Optional[FailureRecord]:
        from torch.distributed import DistNetworkError

        seat = self._seat
        if seat is None or self._lost:
            return None
        key = self._keys.attempt(seat.attempt, "failure")
        store = self._store_client()
        with contextlib.suppress(DistNetworkError):  # the store's host is gone: the watchers report that
            if store.check([key]):
                return FailureRecord(**json.loads(store.get(key)))
        return None

    def finish_attempt(self, succeeded: bool) -> AttemptEnd:
        """Report this node done and wait for the attempt's end: the last node done, or whatever came first."""
        with self._lock:
            self._stop = None
        seat, watch = self._seat, self._watch
        assert seat is not None and watch is not None
        if self._lost:
            # Found by the heartbeat: a store that hangs (its host frozen or cut off without a
            # reset) would never answer the calls below.
            raise LaunchError(self._lost)
        store = self._store_client()
        with lost_store_is_one_line(self._describe_lost_store):
            if succeeded:
                if int(store.add(self._keys.attempt(seat.attempt, "done"), 1)) >= seat.nnodes:
                    announce(store, self._keys, seat.attempt, News(DONE))
            else:
                announce(store, self._keys, seat.attempt,
                         News("stopped", f"the workers of node {seat.node_rank} stopped"))
            wait_for_end(watch, store, self._keys, seat.attempt, seat.nnodes, self._status)
        if self._lost:
            raise LaunchError(self._lost)
        assert watch.news is not None
        return watch.news.end()

    def attempt_record(self) -> dict[str, Any]:
        seat = self._seat
        if seat is None:
            return {}
        record: dict[str, Any] = {"world_size": seat.world_size}
        if self._roster is not None:
            record["nodes"] = self._roster.describe()
        return record

    def _store_client(self) -> Client:
        assert self._store is not None
        return self._store

    # -- leaving ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the job: tell the others if workers were still running, and (as the host) keep the
        store up until every node has read the outcome."""
        with self._lock:
            # The workers' supervisor is gone: news of this node's own leaving must not reach it.
            self._stop = None
        if self._store is None or self._beats is None:
            self._store = None
            return
        self._beats.stop()
        # The heartbeat's connection is free now; the others may be blocked in a wait.
        client = self._beats.client
        # A store that is gone has no one left to tell or wait for (and one that hangs would never answer).
        if self._lost is None:
            with contextlib.suppress(Exception):
                self._leave(client)
        # The host's store stops with the last reference to it.
        self._store = self._watch_client = self._worker_store_server = None

    def _leave(self, client: Client) -> None:
        """Say this agent is gone (and, mid-attempt, that the attempt is over); the host waits for the rest."""
        seat = self._seat
        if seat is not None and self._watch is not None and self._watch.news is None:  # the attempt goes on
            announce(client, self._keys, seat.attempt,
                     News(LEFT, f"node {seat.node_rank} left the job before its workers finished"))
        client.set(self._keys.heartbeat(self._agent), LEFT_BEAT.decode())
        client.set(self._keys("gone", self._agent), "left")
        if seat is not None and int(client.add(self._keys.attempt(seat.attempt, "left"), 1)) >= seat.nnodes:
            client.set(self._keys.attempt(seat.attempt, "all_left"), "1")
        if self._monitor is not None:
            self._monitor.stop()
            if seat is not None:
                monitor = self._monitor
                wait_until_left(client, self._keys, seat.attempt, seat.nnodes, lambda: monitor.gone_from(seat.attempt),
                                time.monotonic() + self._close_timeout)
            if self._handler is not None:
                self._close_round(client)

    def _close_round(self, client: Client) -> None:
        """As the host leaving: close torch's round, as torchrun's agents do, and give the nodes
        still waiting for a place the moment they need to hear it (rather than lose the store)."""
        self._handler.set_closed()
        deadline = time.monotonic() + CLOSING_GRACE
        while int(client.add(self._keys("unseated"), 0)) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)


def connect(config: LaunchConfig, environ: Mapping[str, str]) -> StoreRendezvous:
    """The rendezvous for a multi-node launch; nothing is contacted until the first attempt."""
    return StoreRendezvous(config, environ)
