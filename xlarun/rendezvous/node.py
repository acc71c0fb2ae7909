"""A node of a multi-node job: joining the job's store, heartbeats, each attempt's end, leaving.

Made for multi-node launches only, by :func:`~xlarun.rendezvous.multi_node_rendezvous`::

    rendezvous = multi_node_rendezvous(config, environ)   # a NodeRendezvous; nothing is contacted yet
    node = rendezvous.assign(attempt, nproc_per_node)     # the first call joins the job's store
    rendezvous.watch(stop); ...; end = rendezvous.finish_attempt(succeeded)
    rendezvous.close()

The backend decides who serves the store, who takes part and how each attempt is seated:
one :class:`~xlarun.rendezvous.joining.Seating`, chosen once (:mod:`~xlarun.rendezvous.static`,
:mod:`~xlarun.rendezvous.c10d`). The rest is the same for both and is here.

One TCPStore serves the whole job; it listens only on the address it was given. Workers
see a store as torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``, keys under
``/worker/attempt_<n>``), so ``env://``, ``tcp://`` and ``xla://`` all find it: the job's
own on the first static attempt, otherwise one that node rank 0's agent serves for that
attempt alone. The agents' own keys are listed at :class:`~xlarun.rendezvous.store.JobKeys`;
seating an attempt is described in :mod:`~xlarun.rendezvous.joining`, watching it in
:mod:`~xlarun.rendezvous.watching`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from xlarun import structs
from xlarun.config import LaunchConfig
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError
from xlarun.failures import FailureRecord
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import AttemptEnd, NodeStacks, StopRequest, shown
from xlarun.rendezvous.joining import (
    FinishedJob,
    Member,
    NodePlan,
    Roster,
    Seat,
    Seating,
    announce_change,
    check_job,
    read_roster,
    seat_attempt,
)
from xlarun.rendezvous.store import (
    Client,
    Connector,
    JobKeys,
    first_line,
    lost_store_is_one_line,
    lost_store_line,
    open_job_store,
    serve_store,
    wait_for_key,
)
from xlarun.rendezvous.watching import (
    DONE,
    HUNG,
    LEFT,
    LEFT_BEAT,
    STALL,
    EndWatch,
    Heartbeat,
    Monitor,
    News,
    announce,
    lost_node,
    settle,
    wait_for_end,
    wait_until_left,
)


class NodeRendezvous:
    """The multi-node :class:`~xlarun.rendezvous.Rendezvous` (see the module docstring).

    Made by :func:`~xlarun.rendezvous.multi_node_rendezvous`, with the seating of the config's
    backend (which shares ``keys`` and ``status``); ``connector`` opens each connection to the store.
    With ``node_hosts`` every assignment lists the nodes' addresses (the attempt's roster: one
    read per attempt); ``place`` is where this node belongs in the job's order, if its host says
    (:attr:`~xlarun.rendezvous.joining.Member.place`); ``slices`` the TPU slices MegaScale joins into
    the job, which every node must plan alike with its node count
    (:class:`~xlarun.rendezvous.joining.NodePlan`).
    """

    waits = True

    def __init__(
        self,
        config: LaunchConfig,
        environ: Mapping[str, str],
        seating: Seating,
        keys: JobKeys,
        status: StatusLine,
        connector: Connector,
        node_hosts: bool = False,
        place: int | None = None,
        slices: int = 1,
    ):
        self._config = config
        self._slices = slices
        self._node_hosts = node_hosts
        self._place = place
        self._seating = seating
        self._timeouts = seating.timeouts
        self._token = config.rdzv_conf.get("token") or environ.get("XLARUN_RDZV_TOKEN", "")
        self._keys = keys
        self._status = status
        self._connector = connector
        self._host = config.local_addr or socket.getfqdn()
        self._store_host = ""
        self._store_port = 0
        self._serving = False
        # One connection per thread that may block: a TCPStore client serialises its calls.
        self._store: Client | None = None
        self._watch_client: Client | None = None
        self._beats: Heartbeat | None = None
        self._monitor: Monitor | None = None
        self._agent = 0
        self._seat: Seat | None = None
        self._roster: Roster | None = None
        self._watch: EndWatch | None = None
        self._stop: StopRequest | None = None
        self._lock = threading.Lock()
        self._lost: str | None = None
        self._worker_store_server: Any = None

    # -- joining ------------------------------------------------------------------------------

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        """Seat this node in the job's next attempt, joining the job's store on the first call.

        ``attempt`` is not read: the job numbers its attempts, and a node that joins late takes
        the number the others run under (see :meth:`~xlarun.rendezvous.Rendezvous.assign`).
        """
        with lost_store_is_one_line(self._describe_lost_store):
            if self._seat is None:
                seat = self._first_seat(nproc_per_node)
            else:
                seat = self._seating.seat(self._store_client(), self._member(nproc_per_node), self._seat, self._lead)
            self._begin(seat)
        hosts = tuple(member.host for member in self._roster.members) if self._node_hosts and self._roster else ()
        return NodeAssignment(
            run_id=self._keys.run_id,
            node_rank=seat.node_rank,
            nnodes=seat.nnodes,
            local_world_size=nproc_per_node,
            rank_offset=seat.rank_offset,
            world_size=seat.world_size,
            master_addr=seat.master_addr,
            master_port=seat.master_port,
            restart_count=seat.attempt,
            agent_store=True,
            hosts=hosts,
            job_started_ns=seat.job_started_ns,
        )

    def _member(self, nproc_per_node: int) -> Member:
        return Member(self._agent, self._host, nproc_per_node, self._place)

    def _first_seat(self, nproc_per_node: int) -> Seat:
        """Join the job and take a seat in the first attempt this node runs.

        A store that another node serves and that stops before this node has a seat was an earlier
        launch's of the same run id, ending: a container restarted in place (a Kubernetes JobSet's
        ``RestartAllContainers``) may reach it before the store's host restarts too. So is a store
        whose job had ended before this node came (:class:`~xlarun.rendezvous.joining.FinishedJob`).
        This node then joins the store that host serves next, within the join timeout, instead of
        ending with the old; where none comes, the finished job is what it found.
        """
        from torch.distributed import DistNetworkError

        deadline = time.monotonic() + self._timeouts.join
        finished: FinishedJob | None = None
        while True:
            try:
                if self._store is None:
                    self._join()
                return self._seating.seat(self._store_client(), self._member(nproc_per_node), None, self._lead)
            except DistNetworkError:
                if self._serving or time.monotonic() >= deadline:
                    raise
            except FinishedJob as found:
                if time.monotonic() >= deadline:
                    raise
                finished = found
                # Its host may serve it a moment longer: torch's handler reads a round's state once a second.
                time.sleep(1)
            except LaunchError:
                if finished is None or self._store is not None:
                    raise
                raise finished from None  # no store came after it
            self._status.update(
                f"the store at {self._store_host}:{self._store_port} was an earlier launch's; "
                "waiting for its host's next one"
            )
            self._forget_store()

    def _forget_store(self) -> None:
        """Drop an earlier launch's store (stopped, or its job ended) found before this node had a seat, and
        the heartbeat it fed."""
        if self._beats is not None:
            self._beats.stop()
        with self._lock:
            self._store = self._watch_client = self._beats = None
            self._lost = None

    def _join(self) -> None:
        """Reach (or serve) the job's store, pass the job check, start beating and take part."""
        host, port = self._config.store_address()
        # One deadline for reaching the store and hearing its job: a store found late leaves less time to check.
        deadline = time.monotonic() + self._timeouts.join
        store, self._serving = open_job_store(
            self._connector, host, port, self._seating.store_role(host), self._timeouts, self._status
        )
        self._store, self._store_host, self._store_port = store, host, port
        plan = NodePlan(self._config.min_nodes, self._config.max_nodes, self._slices)
        me = f"node {self._config.node_rank}" if self._config.rdzv_backend == "static" else "this node"
        store_node = self._seating.store_host_node
        names = (me, "the store's host" if store_node is None else f"node {store_node}")
        refusals_seen = check_job(
            store, self._serving, self._keys.run_id, self._token, plan, names, f"{host}:{port}", deadline, self._status
        )
        # Every connection is made before this agent counts as joined: a slow connect must delay
        # joining, never a heartbeat. Opened side by side: torch's client looks up a name for the
        # store's address on each connection, and a slow resolver then costs one wait, not several.
        roles = ["watch", "beat", *(["monitor"] if self._serving else []), *self._seating.connections]
        with concurrent.futures.ThreadPoolExecutor(len(roles)) as pool:
            connections = pool.map(lambda _: self._connector(host, port, self._timeouts.call), roles)
            clients = dict(zip(roles, connections, strict=True))
        self._watch_client = clients["watch"]
        self._agent = int(store.add(self._keys("agents"), 1))
        store.add(self._keys.heartbeat(self._agent), 1)
        self._beats = Heartbeat(
            clients["beat"],
            self._keys.heartbeat(self._agent),
            self._timeouts.beat_interval,
            self._timeouts.call,
            self._on_store_lost,
        )
        self._beats.start()
        self._seating.joined(
            store, host, port, self._agent, {role: clients[role] for role in self._seating.connections}
        )
        if self._serving:
            store.set(self._keys("host_agent"), str(self._agent))
            self._monitor = Monitor(
                clients["monitor"],
                self._keys,
                self._timeouts.heartbeat,
                self._timeouts.beat_interval,
                self._status,
                refusals_seen,
                self._seating.nodes_waiting,
                self._config.max_nodes,
            )
            self._monitor.start()

    def _lead(self, attempt: int, members: list[Member]) -> list[Seat]:
        """As the attempt's node rank 0: seat everyone, with the workers' store (MASTER_ADDR, MASTER_PORT).

        That is the job's store, or one this agent serves, where the backend says. Every restart
        gets a fresh store: torch's ``env://`` reuses an agent store without a per-attempt prefix,
        so keys a failed attempt left would mislead the next one.
        """
        host = self._seating.worker_store_host(attempt)
        if host is None:
            host, port = self._store_host, self._store_port
        else:
            # Replacing the previous attempt's store stops its server.
            self._worker_store_server, port = serve_store(host, 0, self._timeouts.join)
        return seat_attempt(self._store_client(), self._keys, attempt, members, host, port)

    def _begin(self, seat: Seat) -> None:
        """The attempt is seated: announce a change of nodes and start waiting for its end."""
        assert self._watch_client is not None
        if seat.change:
            announce_change(seat.change, seat.nnodes, self._config.min_nodes, self._config.max_nodes, self._status)
        if self._config.summary_file or self._node_hosts:
            self._roster = read_roster(self._store_client(), self._keys, seat.attempt)
        self._seat = seat
        self._watch = EndWatch(
            self._watch_client, self._keys.attempt(seat.attempt, "end"), self._on_news, self._on_store_lost
        )

    # -- during an attempt --------------------------------------------------------------------

    def watch(self, stop: StopRequest) -> None:
        with self._lock:
            self._stop = stop
            # News that came before the workers' supervisor was listening still stops them.
            news = self._watch.news if self._watch is not None else None
            reason = self._lost or (news.reason if news is not None and news.kind != DONE else None)
        if reason:
            stop(reason, hung=self._lost is None and news is not None and news.kind == HUNG)

    def _on_news(self, news: News) -> None:
        if news.kind != DONE:
            self._request_stop(news.reason, hung=news.kind == HUNG)

    def _on_store_lost(self, error: BaseException) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = self._describe_lost_store(error)
            watch = self._watch
        if watch is not None:
            watch.give_up()
        self._request_stop(self._lost)

    def _describe_lost_store(self, error: BaseException) -> str:
        where = f"{self._store_host}:{self._store_port}"
        if self._serving:  # the store runs in this process: no other node is to blame
            return f"the rendezvous store this node serves at {where} stopped answering ({first_line(error)})"
        store_node = self._seat.store_node if self._seat is not None else self._seating.store_host_node
        return lost_store_line(where, store_node, error)

    def _request_stop(self, reason: str, hung: bool = False) -> None:
        with self._lock:
            stop = self._stop
        if stop is not None:
            stop(reason, hung=hung)

    def _tell_the_others(self, write: Callable[[Client, Seat], None]) -> None:
        """Write news of this attempt to the job's store, unless the store is known lost or goes meanwhile
        (the watchers report that)."""
        from torch.distributed import DistNetworkError

        seat = self._seat
        assert seat is not None
        if self._lost:
            return  # a hung store would never answer; the watchers report the loss
        with contextlib.suppress(DistNetworkError):
            write(self._store_client(), seat)

    def announce_hang(self, reason: str) -> None:
        self._tell_the_others(
            lambda store, seat: announce(
                store, self._keys, seat.attempt, News(HUNG, f"node {seat.node_rank}: {reason}")
            )
        )

    def publish_stacks(self, stacks: NodeStacks) -> None:
        self._tell_the_others(
            lambda store, seat: store.set(
                self._keys.attempt(seat.attempt, "stacks", stacks.node_rank), stacks.to_json()
            )
        )

    def job_stacks(self, own: NodeStacks, wait: float) -> list[NodeStacks]:
        from torch.distributed import DistNetworkError

        seat = self._seat
        assert seat is not None
        found = {own.node_rank: own}
        if self._lost:
            return [own]
        deadline = time.monotonic() + wait
        store = self._store_client()
        for node_rank in set(range(seat.nnodes)) - set(found):
            key = self._keys.attempt(seat.attempt, "stacks", node_rank)
            # A record xlarun did not write counts as none: that node's ranks are named as missing.
            with contextlib.suppress(DistNetworkError, ValueError):
                if store.check([key]) or wait_for_key(store, key, deadline):
                    found[node_rank] = NodeStacks.from_json(store.get(key))
        return [found[node_rank] for node_rank in sorted(found)]

    def publish_failure(self, failure: FailureRecord) -> None:
        def write(store: Client, seat: Seat) -> None:
            key, record = self._keys.attempt(seat.attempt, "failure"), json.dumps(structs.asdict(failure))
            first = store.compare_set(key, "", record)
            if first != record.encode() and failure_record(first) is None:
                store.set(key, record)  # a value xlarun did not write holds no failure's place
            announce(
                store,
                self._keys,
                seat.attempt,
                News(
                    "failure",
                    f"rank {failure.rank} on node {failure.node_rank} failed (exit code {failure.exit_status})",
                ),
            )

        self._tell_the_others(write)

    def first_failure(self) -> FailureRecord | None:
        from torch.distributed import DistNetworkError

        seat = self._seat
        if seat is None or self._lost:
            return None
        key = self._keys.attempt(seat.attempt, "failure")
        store = self._store_client()
        with contextlib.suppress(DistNetworkError):  # the store's host is gone: the watchers report that
            if store.check([key]):
                return failure_record(store.get(key))
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
            settle(store, self._keys, seat.attempt, seat.node_rank, "finished")
            if succeeded:
                if int(store.add(self._keys.attempt(seat.attempt, "done"), 1)) >= seat.nnodes:
                    announce(store, self._keys, seat.attempt, News(DONE))
            else:
                announce(
                    store, self._keys, seat.attempt, News("stopped", f"the workers of node {seat.node_rank} stopped")
                )
            wait_for_end(watch, store, self._keys, seat.attempt, seat.nnodes, self._status)
            news = watch.news
            lost = None
            if not self._lost and news is not None and news.kind not in (DONE, "admit"):
                # A node silent since before the end is found by then (Monitor), whatever ended the attempt.
                found_by = watch.heard + self._timeouts.heartbeat + 2 * self._timeouts.beat_interval + STALL
                lost = lost_node(store, self._keys, seat.attempt, seat.nnodes, found_by)
        if self._lost:
            raise LaunchError(self._lost)
        assert news is not None
        return news.end(lost)

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
            announce(
                client,
                self._keys,
                seat.attempt,
                News(LEFT, f"node {seat.node_rank} left the job before its workers finished"),
            )
        client.set(self._keys.heartbeat(self._agent), LEFT_BEAT.decode())
        client.set(self._keys("gone", self._agent), "left")
        if seat is not None:
            settle(client, self._keys, seat.attempt, seat.node_rank, "finished")
            if int(client.add(self._keys.attempt(seat.attempt, "left"), 1)) >= seat.nnodes:
                client.set(self._keys.attempt(seat.attempt, "all_left"), "1")
        if self._monitor is not None:
            if seat is not None:
                # The monitor keeps watching: a node that went silent never says it left, and is counted once found.
                monitor = self._monitor
                wait_until_left(
                    client,
                    self._keys,
                    seat.attempt,
                    seat.nnodes,
                    lambda: monitor.gone_from(seat.attempt),
                    time.monotonic() + self._timeouts.close,
                )
            self._monitor.stop()
            self._seating.leave_as_host(client)


INTEGER_FIELDS = ("rank", "local_rank", "returncode", "pid", "node_rank", "nnodes")


def failure_record(raw: bytes) -> FailureRecord | None:
    """A failure as another node published it; ``None`` for a record xlarun did not write (the
    store is anyone's to write to). Its short text fields come back escaped; the traceback is
    escaped where it is printed, and bounded here (a node publishes at most 64 KiB of it, under a
    line saying what was cut: that passes whole)."""
    try:
        record = FailureRecord(**json.loads(raw))
    except (ValueError, TypeError):
        return None
    integers = all(type(getattr(record, name)) is int for name in INTEGER_FIELDS)
    texts = all(isinstance(getattr(record, name), str) for name in ("host", "error_file", "reason", "traceback"))
    numbers = type(record.time) in (int, float) and type(record.peak_rss_mib) in (int, float, type(None))
    # A status a process can exit with: its own code, or a signal's.
    if not (integers and texts and numbers and -64 <= record.returncode <= 255):
        return None
    return structs.replace(
        record,
        host=shown(record.host),
        error_file=shown(record.error_file),
        reason=shown(record.reason),
        traceback=record.traceback[-128 * 1024 :],
    )
