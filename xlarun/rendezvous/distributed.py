"""Several nodes meeting over torch.distributed's TCPStore (static) or its c10d rendezvous handler.

This module is imported only for multi-node launches: it is where torch is imported.

One TCPStore serves the whole job: node 0's agent hosts it for ``static``, the agent on
the endpoint's host for ``c10d``. The store listens only on the address it was given.
Workers see a store as torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``,
keys under ``/worker/attempt_<n>``), so ``env://``, ``tcp://`` and ``xla://`` all find
it: the job's own on the first static attempt, otherwise one that node rank 0's agent
serves for that attempt alone.

Beside torch's keys, the agents keep a few of their own: two whatever the run id::

    xlarun/job                   run id and token digest: a stray agent is refused
    xlarun/refused               how many agents were refused; ``xlarun/refused/last`` says who

and under ``xlarun/<run_id>/``::

    joined/<node>                static join (one key per node rank)
    arrived                      c10d: agents that came, for the status line and the timeout's line
    store_node                   c10d: the node rank of the agent hosting the store
    attempt_<n>/ready/<node>     every node is ready to start attempt n
    attempt_<n>/nproc/<node>     local world sizes, from which global ranks follow
    attempt_<n>/worker_store     "<port> <host>" of the workers' store for attempt n
    attempt_<n>/failure          the first failure of the attempt (JSON), first writer wins
    attempt_<n>/done/<node>      this node's workers are gone
    heartbeat/<node>             a counter each agent bumps; one that stops moving is a lost node
    left/<node>                  this node has read all it needs; the host may close the store

The watcher thread checks those keys every ``WATCH_INTERVAL`` seconds and stops the local
workers when another node fails, leaves or goes silent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional

from xlarun.config import DEFAULT_C10D_PORT, LaunchConfig
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import FailureRecord
from xlarun.options import flag, split_endpoint
from xlarun.ports import is_local_address
from xlarun.ranks import NodeAssignment

DEFAULT_JOIN_TIMEOUT = 600.0
DEFAULT_HEARTBEAT_TIMEOUT = 5.0
DEFAULT_CLOSE_TIMEOUT = 30.0
WATCH_INTERVAL = 0.25


def conf_seconds(conf: Mapping[str, str], key: str, default: float) -> float:
    text = conf.get(key)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UsageError(f"{flag('rdzv_conf')} {key}={text!r} is invalid: expected a positive number of seconds")
    return value


def conf_flag(conf: Mapping[str, str], key: str) -> Optional[bool]:
    text = conf.get(key)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{flag('rdzv_conf')} {key}={text!r} is invalid: expected true or false")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def serve_store(host: str, port: int, timeout: float) -> tuple[Any, int]:
    """A TCPStore server listening on exactly ``host:port`` (never every interface).

    Returns the store and its port (``port`` 0 picks a free one). The store owns the
    listening socket; dropping the last reference to the store stops the server.

    A socket that cannot be bound raises ``OSError``. A store that fails to start on the
    socket raises :class:`LaunchError`: torch reports that failure with the type it uses for
    a lost connection, and this node failing to serve must not read as another node lost.
    """
    from torch.distributed import DistNetworkError, TCPStore

    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(address)
        server.listen(512)
    except OSError:
        server.close()
        raise
    bound_port = server.getsockname()[1]
    try:
        store = TCPStore(host, bound_port, None, True, datetime.timedelta(seconds=timeout), wait_for_workers=False,
                         multi_tenant=True, master_listen_fd=server.fileno())
    except DistNetworkError as error:
        raise LaunchError(f"cannot serve a store on {host}:{bound_port}: {first_line(error)}") from None
    server.detach()
    return store, bound_port


class StatusLine:
    """One line on a terminal that rewrites itself while the agent waits; silent otherwise."""

    def __init__(self) -> None:
        self._shown = False
        self._tty = sys.stderr.isatty()

    def update(self, text: str) -> None:
        if self._tty:
            sys.stderr.write(f"\rxlarun: {text}\033[K")
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


class StoreRendezvous:
    """The multi-node :class:`~xlarun.rendezvous.Rendezvous` (see the module docstring)."""

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str]):
        # c10d logs every store hiccup at error level, with a C++ stack; the launcher reports such
        # events in one line. Only this process: workers get the environment the launcher started with.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        import torch.distributed as dist  # noqa: F401  (the engine: imported on this path only)

        self._config = config
        conf = config.rdzv_conf
        self._join_timeout = conf_seconds(conf, "join_timeout", conf_seconds(conf, "timeout", DEFAULT_JOIN_TIMEOUT))
        self._heartbeat_timeout = conf_seconds(conf, "heartbeat_timeout", DEFAULT_HEARTBEAT_TIMEOUT)
        self._close_timeout = conf_seconds(conf, "close_timeout", DEFAULT_CLOSE_TIMEOUT)
        self._token = conf.get("token") or environ.get("XLARUN_RDZV_TOKEN", "")
        self._run_id = config.rdzv_id
        self._serving = False
        self._store: Any = None
        self._node_rank = -1
        self._nnodes = 0
        self._store_host = ""
        self._store_port = 0
        self._store_node: Optional[int] = None
        self._attempt = 0
        self._stop: Optional[Callable[[str], None]] = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._heartbeats: dict[int, tuple[int, float]] = {}
        self._lost: Optional[str] = None
        self._status = StatusLine()
        self._watcher: Optional[threading.Thread] = None
        self._worker_store_server: Any = None
        self._refusals_seen = 0
        self._joined = False
        self._assigned = False

    # -- keys ---------------------------------------------------------------------------------

    def _key(self, *parts: object) -> str:
        return "/".join(["xlarun", self._run_id, *map(str, parts)])

    # -- joining ------------------------------------------------------------------------------

    def assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        with self._store_errors():
            return self._assign(attempt, nproc_per_node)

    @contextlib.contextmanager
    def _store_errors(self) -> Iterator[None]:
        """A store that drops the connection mid-call means its host is gone: one line, not a C++ trace.

        torch raises ``DistNetworkError`` for a lost connection (reset, closed, failed send or
        receive). Every other error keeps its own type and message: a bug is not a lost node.
        """
        from torch.distributed import DistNetworkError

        try:
            yield
        except DistNetworkError as error:
            raise LaunchError(self._lost or self._store_lost(error)) from None

    def _store_lost(self, error: BaseException) -> str:
        """One line for a store that stopped answering: the node hosting it is gone."""
        host = "the node hosting it" if self._store_node is None else f"node {self._store_node}, which hosted it,"
        return (f"lost the rendezvous store at {self._store_host}:{self._store_port} ({first_line(error)}): "
                f"{host} stopped")

    def _assign(self, attempt: int, nproc_per_node: int) -> NodeAssignment:
        if self._store is None:
            self._join()
            self._watcher = threading.Thread(target=self._watch_loop, name="xlarun-rendezvous", daemon=True)
            self._watcher.start()
        self._attempt = attempt
        self._store.set(self._key(f"attempt_{attempt}", "ready", self._node_rank), "1")
        self._wait_for_nodes(f"attempt_{attempt}/ready", f"waiting for every node to start attempt {attempt}",
                             reached=f"were ready for attempt {attempt}")
        self._store.set(self._key(f"attempt_{attempt}", "nproc", self._node_rank), str(nproc_per_node))
        sizes = self._read_all(f"attempt_{attempt}/nproc")
        offset = sum(sizes[rank] for rank in range(self._node_rank))
        master_addr, master_port = self._worker_store(attempt)
        self._assigned = True
        return NodeAssignment(run_id=self._run_id, node_rank=self._node_rank, nnodes=self._nnodes,
                              local_world_size=nproc_per_node, rank_offset=offset, world_size=sum(sizes.values()),
                              master_addr=master_addr, master_port=master_port,
                              restart_count=attempt, agent_store=True)

    def _worker_store(self, attempt: int) -> tuple[str, int]:
        """Where the workers' store is (MASTER_ADDR, MASTER_PORT) for ``attempt``.

        Static: the job's store at the master address and port on the first attempt, as
        torchrun. c10d: a store served by the agent of node rank 0, at its own address, as
        torchrun, so MASTER_ADDR (and the XLA coordinator derived from it) is where global
        rank 0 runs. Every restart gets a fresh store: torch's ``env://`` reuses an agent
        store without a per-attempt prefix, so keys a failed attempt left would mislead the
        next one.
        """
        static = self._config.rdzv_backend == "static"
        if static and attempt == 0:
            return self._store_host, self._store_port
        key = self._key(f"attempt_{attempt}", "worker_store")
        if self._node_rank == 0:
            host = self._store_host if static else self._own_address()
            # Replacing the previous attempt's store stops its server.
            self._worker_store_server, port = serve_store(host, 0, self._join_timeout)
            self._store.set(key, f"{port} {host}")
        self._wait_for_keys([key], "waiting for the worker store")
        port, host = self._store.get(key).decode().split(" ", 1)
        return host, int(port)

    def _own_address(self) -> str:
        """This node's address as the other nodes reach it: the local address given, else the one routing
        to the store."""
        if self._config.local_addr:
            return self._config.local_addr
        family = socket.getaddrinfo(self._store_host, self._store_port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((self._store_host, self._store_port))
            return probe.getsockname()[0]

    def _join(self) -> None:
        if self._config.rdzv_backend == "static":
            self._join_static()
        else:
            self._join_c10d()
        self._status.clear()

    def _open_store(self, host: str, port: int, serve: bool, explicit_host: bool) -> None:
        """Serve or reach the job's store.

        A port this host cannot bind means another agent here serves the store, so this one
        reaches it instead; not so when this host was named to serve it (``explicit_host``).
        """
        if serve:
            try:
                self._store, _ = serve_store(host, port, self._join_timeout)
            except OSError as error:
                if explicit_host:
                    raise UsageError(f"cannot serve the rendezvous store on {host}:{port}: {error.strerror}; "
                                     f"pick a free port ({flag('master_port')} or {flag('rdzv_endpoint')} "
                                     "host:PORT)") from None
                serve = False
        if not serve:
            self._store = self._connect_client(host, port)
        self._serving = serve
        self._store_host, self._store_port = host, port
        self._check_job()

    def _connect_client(self, host: str, port: int) -> Any:
        from torch.distributed import DistNetworkError, TCPStore

        deadline = time.monotonic() + self._join_timeout
        started = time.monotonic()
        while True:
            try:
                return TCPStore(host, port, None, False, datetime.timedelta(seconds=min(10.0, self._join_timeout)),
                                wait_for_workers=False)
            except DistNetworkError as error:  # refused, timed out, unresolvable host, not a store
                if time.monotonic() >= deadline:
                    raise LaunchError(f"cannot reach the rendezvous store at {host}:{port} after "
                                      f"{self._join_timeout:.0f} s ({first_line(error)}): is node 0's agent "
                                      "running, and is the address reachable from this node?") from None
                self._status.update(f"reaching the rendezvous store at {host}:{port} "
                                    f"({time.monotonic() - started:.0f} s)")
                time.sleep(0.5)

    def _check_job(self) -> None:
        """Refuse to mix with an agent of another job (run id) or one without the job's token."""
        mine = json.dumps({"run_id": self._run_id, "token": token_digest(self._token)}, sort_keys=True)
        if self._serving:
            # Only the agent serving the store names its job, so a stray agent that reaches the
            # store first cannot claim it.
            self._store.set("xlarun/job", mine)
            found = mine
        else:
            self._wait_for_keys(["xlarun/job"], "waiting for the store's host to name its job")
            found = self._store.get("xlarun/job").decode()
        if found == mine:
            # Agents turned away before this one came are not news to it.
            self._refusals_seen = int(self._store.add("xlarun/refused", 0))
            return
        try:
            theirs = json.loads(found)
        except ValueError:
            theirs = {}
        if theirs.get("run_id") != self._run_id:
            reason = (f"the store at {self._store_host}:{self._store_port} serves run id "
                      f"{theirs.get('run_id')!r}, not {self._run_id!r}")
        else:
            reason = f"this node's rendezvous token does not match the job's at {self._store_host}:{self._store_port}"
        self._store.set("xlarun/refused/last", f"{socket.gethostname()} (pid {os.getpid()}): {reason}")
        self._store.add("xlarun/refused", 1)
        raise LaunchError(f"refused: {reason} (check {flag('rdzv_id')} and {flag('rdzv_conf')} token "
                          "/ XLARUN_RDZV_TOKEN)")

    def _join_static(self) -> None:
        config = self._config
        self._node_rank, self._nnodes = config.node_rank, config.max_nodes
        host, port = config.master_addr, config.master_port
        serves = self._node_rank == 0
        if serves and not is_local_address(host):
            raise UsageError(f"node 0 serves the store at {flag('master_addr')} {host}, which is not an address of "
                             "this host: give this host's address")
        self._open_store(host, port, serve=serves, explicit_host=True)
        self._store_node = 0
        claimed = self._store.compare_set(self._key("joined", self._node_rank), "", str(os.getpid())).decode()
        if claimed != str(os.getpid()):
            raise LaunchError(f"node rank {self._node_rank} already joined run {self._run_id!r}: "
                              f"give each node its own {flag('node_rank')}")
        self._joined = True
        self._wait_for_nodes("joined", "waiting for nodes", reached="joined")

    def _join_c10d(self) -> None:
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        config = self._config
        host, port = split_endpoint(config.rdzv_endpoint or f"{config.master_addr}:{DEFAULT_C10D_PORT}",
                                    DEFAULT_C10D_PORT)
        explicit = conf_flag(config.rdzv_conf, "is_host")
        serve = explicit if explicit is not None else is_local_address(host)
        self._open_store(host, port, serve=serve, explicit_host=bool(explicit))
        params = RendezvousParameters(backend="c10d", endpoint=f"{host}:{port}", run_id=self._run_id,
                                      min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                                      local_addr=config.local_addr,
                                      **{k: v for k, v in config.rdzv_conf.items() if k not in ("token", "is_host")})
        handler = create_handler(self._store, C10dRendezvousBackend(self._store, self._run_id), params)
        self._store.add(self._key("arrived"), 1)
        started = time.monotonic()
        ticker = threading.Event()

        def tick() -> None:
            while not ticker.wait(0.5):
                arrived = int(self._store.add(self._key("arrived"), 0))
                self._status.update(f"waiting for nodes: {arrived} joined, {config.min_nodes}"
                                    f"{'' if config.min_nodes == config.max_nodes else f'-{config.max_nodes}'}"
                                    f" expected ({time.monotonic() - started:.0f} s)")

        threading.Thread(target=tick, daemon=True).start()
        try:
            info = handler.next_rendezvous()
        except RendezvousTimeoutError:
            arrived = int(self._store.add(self._key("arrived"), 0))
            raise LaunchError(f"{arrived} of {config.min_nodes} nodes joined in {self._join_timeout:.0f} s at "
                              f"{host}:{port} (run id {self._run_id!r}): start the missing nodes with the "
                              f"same {flag('rdzv_endpoint')} and {flag('rdzv_id')}") from None
        except RendezvousError as error:
            detail = first_line(error) or type(error).__name__
            raise LaunchError(f"rendezvous at {host}:{port} failed: {detail}") from None
        finally:
            ticker.set()
        self._node_rank, self._nnodes = info.rank, info.world_size
        self._joined = True
        if self._serving:
            # The other nodes learn which of them hosts the store, to name it should it vanish.
            self._store.set(self._key("store_node"), str(self._node_rank))
            self._store_node = self._node_rank

    def _wait_for_nodes(self, group: str, what: str, reached: str) -> None:
        """Wait until every node has set ``<group>/<node>``; a timeout names the missing node ranks."""
        self._wait_for_keys([self._key(*group.split("/"), rank) for rank in range(self._nnodes)], what, reached)

    def _wait_for_keys(self, keys: list[str], what: str, reached: Optional[str] = None) -> None:
        """Wait for ``keys``; ``reached`` words the timeout when each key stands for a node."""
        started = time.monotonic()
        while True:
            present = [index for index, key in enumerate(keys) if self._store.check([key])]
            if len(present) == len(keys):
                self._status.clear()
                return
            elapsed = time.monotonic() - started
            if elapsed >= self._join_timeout:
                self._status.clear()
                missing = ", ".join(str(index) for index in range(len(keys)) if index not in present)
                raise LaunchError(f"{len(present)} of {len(keys)} nodes {reached} in {self._join_timeout:.0f} s; "
                                  f"missing node ranks: {missing}" if reached else
                                  f"timed out after {self._join_timeout:.0f} s {what}")
            if self._lost:
                raise LaunchError(self._lost)
            if self._watcher is None:
                self._report_refusals(self._store)
            self._status.update(f"{what}: {len(present)}/{len(keys)} ({elapsed:.0f} s)")
            time.sleep(0.05)

    def _read_all(self, group: str) -> dict[int, int]:
        self._wait_for_nodes(group, "exchanging worker counts", reached="sent their worker counts")
        values = self._store.multi_get([self._key(*group.split("/"), rank) for rank in range(self._nnodes)])
        return {rank: int(value) for rank, value in enumerate(values)}

    # -- during an attempt --------------------------------------------------------------------

    def watch(self, stop: Callable[[str], None]) -> None:
        with self._lock:
            self._stop = stop

    def publish_failure(self, failure: FailureRecord) -> None:
        from torch.distributed import DistNetworkError

        with contextlib.suppress(DistNetworkError):  # the store's host is gone: the watcher reports that
            self._store.compare_set(self._key(f"attempt_{self._attempt}", "failure"), "",
                                    json.dumps(dataclasses.asdict(failure)))

    def first_failure(self) -> Optional[FailureRecord]:
        from torch.distributed import DistNetworkError

        key = self._key(f"attempt_{self._attempt}", "failure")
        with contextlib.suppress(DistNetworkError):  # the store's host is gone: the watcher reports that
            if self._store.check([key]):
                return FailureRecord(**json.loads(self._store.get(key)))
        return None

    def finish_attempt(self, succeeded: bool) -> bool:
        """Report this node done and wait for the others; the attempt succeeded only if all did."""
        with self._lock:
            self._stop = None
        attempt = f"attempt_{self._attempt}"
        with self._store_errors():
            self._store.set(self._key(attempt, "done", self._node_rank), "1" if succeeded else "0")
            self._wait_for_others_to_finish(attempt)
        return succeeded and self.first_failure() is None and self._lost is None

    def _wait_for_others_to_finish(self, attempt: str) -> None:
        """Wait for every node's ``done``, for as long as its workers run.

        No deadline: nodes may finish hours apart. A node that leaves without ``done``, or
        goes silent (the watcher notices), ends the wait.
        """
        started = time.monotonic()
        running = set(range(self._nnodes))
        while True:
            for rank in sorted(running):
                # ``left`` is read first: a node sets ``done`` before ``left``, never after.
                left = self._store.check([self._key("left", rank)])
                if self._store.check([self._key(attempt, "done", rank)]):
                    running.discard(rank)
                elif left:
                    self._status.clear()
                    raise LaunchError(f"node {rank} left the job before its workers finished")
            if not running:
                self._status.clear()
                return
            if self._lost:
                self._status.clear()
                raise LaunchError(self._lost)
            self._status.update(f"waiting for the other nodes to finish: {self._nnodes - len(running)}/"
                                f"{self._nnodes} ({time.monotonic() - started:.0f} s)")
            time.sleep(0.05)

    def close(self) -> None:
        from torch.distributed import DistNetworkError

        if self._store is None:
            return
        try:
            # An agent that never took a node rank (refused, or its rank taken) must not speak for that rank.
            if self._joined:
                self._store.set(self._key("left", self._node_rank), "1")
            if self._serving and self._assigned:
                # The host keeps the store up until every node has read the outcome.
                deadline = time.monotonic() + self._close_timeout
                keys = [self._key("left", rank) for rank in range(self._nnodes)]
                while time.monotonic() < deadline and not self._lost:
                    if all(self._store.check([key]) for key in keys):
                        break
                    time.sleep(0.05)
        except DistNetworkError:
            pass  # the store's host is gone: there is no one left to tell or wait for
        self._closed.set()
        self._store = self._worker_store_server = None

    # -- watching the other nodes -------------------------------------------------------------

    def _watch_loop(self) -> None:
        from torch.distributed import DistNetworkError, TCPStore

        # A connection of its own: TCPStore clients are not meant to be shared across threads.
        store = TCPStore(self._store_host, self._store_port, None, False,
                         datetime.timedelta(seconds=self._heartbeat_timeout), wait_for_workers=False)
        while not self._closed.wait(WATCH_INTERVAL):
            try:
                problem = self._check_nodes(store)
            except DistNetworkError as error:
                problem = self._store_lost(error)
            if problem:
                self._lost = problem
                self._request_stop(problem)
                return

    def _report_refusals(self, store: Any) -> None:
        """The job's side of a refusal: one line per stray agent turned away."""
        count = int(store.add("xlarun/refused", 0))
        if count > self._refusals_seen:
            self._refusals_seen = count
            self._status.clear()
            sys.stderr.write(f"xlarun: refused an agent of another job: {store.get('xlarun/refused/last').decode()}\n")
            sys.stderr.flush()

    def _check_nodes(self, store: Any) -> Optional[str]:
        self._report_refusals(store)
        store.add(self._key("heartbeat", self._node_rank), 1)
        if self._store_node is None and store.check([self._key("store_node")]):
            self._store_node = int(store.get(self._key("store_node")))
        now = time.monotonic()
        attempt = f"attempt_{self._attempt}"
        for rank in range(self._nnodes):
            if rank == self._node_rank:
                continue
            if store.check([self._key("left", rank)]):
                if self._stop is not None and not store.check([self._key(attempt, "done", rank)]):
                    return f"node {rank} left the job before its workers finished"
                continue
            beat = int(store.add(self._key("heartbeat", rank), 0))
            last_beat, seen_at = self._heartbeats.get(rank, (-1, now))
            if beat != last_beat:
                self._heartbeats[rank] = (beat, now)
            elif now - seen_at > self._heartbeat_timeout:
                return f"node {rank} stopped responding (no heartbeat for {self._heartbeat_timeout:.0f} s)"
        failure_key = self._key(f"attempt_{self._attempt}", "failure")
        if self._stop is not None and store.check([failure_key]):
            failure = FailureRecord(**json.loads(store.get(failure_key)))
            self._request_stop(f"rank {failure.rank} on node {failure.node_rank} failed "
                               f"(exit code {failure.exit_status})")
        return None

    def _request_stop(self, reason: str) -> None:
        with self._lock:
            stop = self._stop
        if stop is not None:
            stop(reason)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def connect(config: LaunchConfig, environ: Mapping[str, str]) -> StoreRendezvous:
    """The rendezvous for a multi-node launch; nothing is contacted until the first attempt."""
    if config.rdzv_backend == "static" and config.rdzv_endpoint:
        host, port = split_endpoint(config.rdzv_endpoint, config.master_port)
        config = dataclasses.replace(config, master_addr=host, master_port=port)
    return StoreRendezvous(config, environ)
