"""``pod-scale``: xlarun's multi-node rendezvous for N simulated nodes, as its own table.

xlarun's multi-node rendezvous, the real code, for N simulated nodes (threads, a hundred or so
per process, each node with its own store connections) against one real TCPStore that node 0
serves, at N = 8, 64, 512 and 2048 (``--nodes``, whose default the command line keeps). Per N:
the time to join, the store requests per second while the workers run (counted on every
connection, over ``--window`` seconds), a restart round, the time until a silent node is noticed
and until every node is stopped, and the time from a worker failure until every node is stopped.

Every name taken from ``xlarun.rendezvous`` is imported in one place, the two lines under the
comment that says so.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import resource
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from xlarun import structs
from xlarun.config import LaunchConfig, WorkerCommand
from xlarun.failures import FailureRecord
from xlarun.host.ports import free_port, host_port
from xlarun.rdzv_conf import default_seconds
from xlarun.rendezvous import multi_node_rendezvous
from xlarun.rendezvous.store import Client, tcp_client

from .common import BenchError, cpu_model, progress

POD_SHARD_NODES = 128
POD_JOIN_GOAL_S = 10.0
# One interval of slack for the monitor's read and one for the silent agent's last beat.
POD_NOTICE_SLACK_S = 1.0


class CountingClient:
    """A store connection that counts the requests made through it; once muted, every call fails.

    Muting a node's connections makes it silent, as an agent whose host hung: its
    heartbeat thread stops at its next beat.
    """

    def __init__(self, inner: object):
        self._inner = inner
        self.calls = 0
        self.muted = False

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self._inner, name)

        def call(*args: object, **kwargs: object) -> object:
            if self.muted:
                raise ConnectionError("this simulated node went silent")
            self.calls += 1
            return method(*args, **kwargs)

        return call


class SimNode:
    """One simulated node: the real rendezvous of an agent, with connections this benchmark can count."""

    def __init__(self, config: LaunchConfig, environ: dict[str, str]):
        self.clients: list[CountingClient] = []

        def connect(host: str, port: int, timeout: float) -> Client:
            client = CountingClient(tcp_client(host, port, timeout))
            self.clients.append(client)
            # A Client by __getattr__, which mypy's protocol check does not look through.
            return cast(Client, client)

        self.rendezvous = multi_node_rendezvous(config, environ, connect)
        self.stopped_at: float | None = None

    def stop(self, reason: str, hung: bool = False) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()

    def calls(self) -> int:
        return sum(client.calls for client in self.clients)


@dataclass
class PodSample:
    nodes: int
    join_s: float
    restart_s: float
    requests_per_s: float
    notice_s: float
    silent_stop_s: float
    failure_stop_s: float


def in_threads(nodes: list[SimNode], call: Callable[[SimNode], object]) -> float:
    """Run ``call`` for every node at once, one thread each; the monotonic time the last one returned."""
    errors: list[BaseException] = []

    def run(node: SimNode) -> None:
        try:
            call(node)
        except BaseException as error:  # re-raised below, in the calling thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(node,), daemon=True) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"a simulated node failed: {type(errors[0]).__name__}: {errors[0]}")
    return time.monotonic()


class PodShard:
    """Some of the simulated nodes, all in one process, driven by the simulation's commands.

    Thousands of threads in one interpreter queue for its lock; about a hundred nodes per
    process keep every heartbeat on time. Times are ``time.monotonic()``, one clock for
    every process of the machine.
    """

    def __init__(self, config: LaunchConfig, ranks: list[int]):
        # The rendezvous draws status lines only on a terminal: none for hundreds of simulated nodes.
        with contextlib.redirect_stderr(io.StringIO()):
            self.nodes = {rank: SimNode(structs.replace(config, node_rank=rank), {}) for rank in ranks}

    def _live(self, silent: tuple[int, ...]) -> list[SimNode]:
        return [node for rank, node in self.nodes.items() if rank not in silent]

    def assign(self, attempt: int) -> float:
        return in_threads(list(self.nodes.values()), lambda node: node.rendezvous.assign(attempt, 1))

    def watch(self) -> None:
        for node in self.nodes.values():
            node.stopped_at = None
            node.rendezvous.watch(node.stop)

    def calls(self) -> int:
        return sum(node.calls() for node in self.nodes.values())

    def fail(self, rank: int, count: int) -> float:
        failed_at = time.monotonic()
        self.nodes[rank].rendezvous.publish_failure(
            FailureRecord(
                rank=rank,
                local_rank=0,
                returncode=1,
                pid=0,
                time=time.time(),
                host="simulated",
                node_rank=rank,
                nnodes=count,
            )
        )
        return failed_at

    def mute(self, rank: int) -> float:
        muted_at = time.monotonic()
        for client in self.nodes[rank].clients:
            client.muted = True
        return muted_at

    def stops(self, silent: tuple[int, ...], limit_s: float = 120.0) -> list[float]:
        """When each live node was told to stop its workers, once all were."""
        live = self._live(silent)
        deadline = time.monotonic() + limit_s
        while any(node.stopped_at is None for node in live):
            if time.monotonic() > deadline:
                raise BenchError(f"{sum(node.stopped_at is None for node in live)} simulated nodes never stopped")
            time.sleep(0.002)
        return [node.stopped_at for node in live if node.stopped_at is not None]

    def finish(self, silent: tuple[int, ...]) -> float:
        return in_threads(self._live(silent), lambda node: node.rendezvous.finish_attempt(False))

    def close(self, silent: tuple[int, ...]) -> float:
        return in_threads(self._live(silent), lambda node: node.rendezvous.close())


def shard_main(connection: Connection, config: LaunchConfig, ranks: list[int]) -> None:
    """A child process of the simulation: runs a shard's commands until told to exit."""
    raise_open_file_limit()
    threading.stack_size(512 * 1024)
    shard = PodShard(config, ranks)
    connection.send(("ok", None))
    while True:
        name, args = connection.recv()
        if name == "exit":
            return
        try:
            connection.send(("ok", getattr(shard, name)(*args)))
        except BaseException as error:  # reported to the simulation, which stops with it
            connection.send(("error", f"{type(error).__name__}: {error}"))


class ShardProcess:
    """A :class:`PodShard` in a child process."""

    def __init__(self, config: LaunchConfig, ranks: list[int]):
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=shard_main, args=(child, config, ranks), daemon=True)
        self._process.start()

    def send(self, name: str, *args: object) -> None:
        self._connection.send((name, args))

    def result(self) -> Any:
        status, value = self._connection.recv()
        if status != "ok":
            raise BenchError(f"a simulated node failed: {value}")
        return value

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._connection.send(("exit", ()))
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def everywhere(shards: list[ShardProcess], name: str, *args: object) -> list[Any]:
    """Run one command in every shard at once; their results."""
    for shard in shards:
        shard.send(name, *args)
    return [shard.result() for shard in shards]


def simulate_pod(count: int, window_s: float) -> PodSample:
    """One static job of ``count`` simulated nodes, one worker each.

    Every node runs xlarun's rendezvous with its own connections, against the one store that
    node 0 serves (in this process, with the monitor), as agents on ``count`` hosts would;
    the other nodes run in child processes of at most :data:`POD_SHARD_NODES` nodes. Measures,
    in order: joining; store requests per second while the workers run (every call on every
    node's connections, heartbeats and the monitor included; node 0 calls its own server
    without a connection while joining); one node's worker failure until every node is told
    to stop; a restart round (every node seated for attempt 1); one node falling silent
    until the first other node is told (the monitor noticed) and until every node is.
    """
    port = free_port()
    config = LaunchConfig(
        command=WorkerCommand("simulated", ()),
        min_nodes=count,
        max_nodes=count,
        master_addr="127.0.0.1",
        master_port=port,
        rdzv_id=f"pod-{count}",
        rdzv_conf={"join_timeout": "600"},
    )
    host = PodShard(config, [0])
    others = list(range(1, count))
    shards = [
        ShardProcess(config, others[start : start + POD_SHARD_NODES])
        for start in range(0, len(others), POD_SHARD_NODES)
    ]
    try:
        for shard in shards:
            shard.result()
        hosting = threading.Thread(target=host.assign, args=(0,), daemon=True)
        hosting.start()
        wait_for_port("127.0.0.1", port)
        started = time.monotonic()
        join_s = max(everywhere(shards, "assign", 0)) - started
        hosting.join()

        host.watch()
        everywhere(shards, "watch")
        before = host.calls() + sum(everywhere(shards, "calls"))
        time.sleep(window_s)
        requests_per_s = (host.calls() + sum(everywhere(shards, "calls")) - before) / window_s

        shards[-1].send("fail", count - 1, count)
        failed_at = shards[-1].result()
        stops = [*host.stops(()), *(stop for batch in everywhere(shards, "stops", ()) for stop in batch)]
        failure_stop_s = max(stops) - failed_at
        everywhere(shards, "finish", ())
        host.finish(())

        for shard in shards:
            shard.send("assign", 1)
        restart_started = time.monotonic()
        restart_s = max([host.assign(1), *(shard.result() for shard in shards)]) - restart_started
        host.watch()
        everywhere(shards, "watch")
        silent = (count - 1,)
        shards[-1].send("mute", count - 1)
        muted_at = shards[-1].result()
        stops = [*host.stops(silent), *(stop for batch in everywhere(shards, "stops", silent) for stop in batch)]
        notice_s, silent_stop_s = min(stops) - muted_at, max(stops) - muted_at
        everywhere(shards, "finish", silent)
        host.finish(silent)
        for shard in shards:
            shard.send("close", silent)
        host.close(silent)
        for shard in shards:
            shard.result()
    finally:
        for shard in shards:
            shard.stop()
    return PodSample(count, join_s, restart_s, requests_per_s, notice_s, silent_stop_s, failure_stop_s)


def wait_for_port(host: str, port: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BenchError(f"nothing listens on {host_port(host, port)} after {limit_s:.0f} s") from None
            time.sleep(0.01)


def raise_open_file_limit() -> None:
    """Every simulated node holds a few connections, and the server in this process their other ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pod_table(samples: list[PodSample]) -> list[str]:
    notice_goal = default_seconds("heartbeat_timeout") + POD_NOTICE_SLACK_S
    rows = [
        "| nodes | join (s) | restart round (s) | store requests/s while running | per node per s "
        f"| silent node noticed (s, goal ≤ {notice_goal:.0f}) | silence → every node stopped (s) "
        "| failure → every node stopped (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sample in samples:
        rows.append(
            f"| {sample.nodes} | {sample.join_s:.2f} | {sample.restart_s:.2f} | {sample.requests_per_s:.0f} "
            f"| {sample.requests_per_s / sample.nodes:.2f} | {sample.notice_s:.2f} "
            f"| {sample.silent_stop_s:.2f} | {sample.failure_stop_s * 1000:.0f} |"
        )
    largest = max(samples, key=lambda sample: sample.nodes)
    rates = [sample.requests_per_s / sample.nodes for sample in samples]
    rows += [
        "",
        f"Goals: {largest.nodes} nodes join in under {POD_JOIN_GOAL_S:.0f} s: "
        f"{'met' if largest.join_s < POD_JOIN_GOAL_S else 'not met'}; requests per node per second "
        f"from {min(rates):.2f} to {max(rates):.2f} across node counts; a silent node noticed within "
        f"heartbeat_timeout + {POD_NOTICE_SLACK_S:.0f} s: "
        f"{'met' if all(sample.notice_s <= notice_goal for sample in samples) else 'not met'}.",
    ]
    return rows


def run_pod_scale(counts: tuple[int, ...], window_s: float) -> list[str]:
    # torch's store client looks up a name for its server's address on every connection (as an
    # IPv6-mapped address, which no hosts file lists, so the query goes to DNS). Where the
    # resolver drops queries, each such connection stalls for the resolver's whole timeout (5 s
    # by default), whatever xlarun does; a second bounds those stalls. Read before the first lookup.
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    raise_open_file_limit()
    # Thousands of threads: small stacks keep their memory modest.
    threading.stack_size(512 * 1024)
    samples = []
    for count in counts:
        progress(f"bench: pod scale, {count} simulated nodes")
        samples.append(simulate_pod(count, window_s))
    return [
        "## Pod-scale simulation (static rendezvous, one store, heartbeat_timeout 5 s)",
        "",
        f"- {cpu_model()}, {os.cpu_count()} cores; {window_s:.0f} s of running counted per node count; "
        f"RES_OPTIONS={os.environ['RES_OPTIONS']!r}",
        "",
        *pod_table(samples),
    ]
