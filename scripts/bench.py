#!/usr/bin/env python3
"""Benchmark xlarun against torchrun on this machine and print a markdown table.

Usage::

    .venv/bin/python scripts/bench.py [--repeat 5] [--quick] [--markdown-out FILE] [--bin-dir DIR]
    .venv/bin/python scripts/bench.py --pod-scale [--nodes 8,64,512,2048] [--window 10]
    .venv/bin/python scripts/bench.py --agent-cpu [--cpu-run 20]

Both launchers run in one session, interleaved (xlarun, torchrun, xlarun, torchrun, ...),
``--repeat`` times per measure, each on a fresh free port (``--standalone``) with its own
log directory. Measures:

* launch and exit of 2, 8 and 32 no-op workers (``pass``), wall time from spawning the
  launcher to reaping it; the same workers started directly by this script, without any
  launcher, are shown alongside as the floor;
* peak memory of the launcher: the launcher process and its helper processes (xlarun's
  orphan guard), workers excluded. Helpers are the launcher's descendants that stay in
  its session (workers start sessions of their own), and the guard, which leaves it but is
  known by its name (``orphan-guard``). Each process's peak (``VmHWM``) is
  sampled until it exits, and the peaks are summed, an upper bound on the tree's
  simultaneous peak. ``ru_maxrss`` from ``wait4`` (the largest single process, workers
  included) is a cross-check;
* crash to exit: one worker writes ``time.time()`` just before ``os._exit(1)`` while four
  peers sleep; the latency runs to the moment ``wait4`` returns the launcher here;
* tee throughput: two workers write 100-byte lines to stdout under ``--tee 3``; this script
  drains the launcher's stdout from a pipe and divides the payload by the time from the
  first worker starting to write to the end of the launcher's output. It also counts the
  lines that did not arrive whole, alone on their line, behind their ``[default<rank>]:``
  prefix.

Medians (and the min-max range) are reported with the ratio torchrun / xlarun.

``--pod-scale`` prints its own table instead: xlarun's multi-node rendezvous, the real
code, for N simulated nodes (threads, a hundred or so per process, each node with its own
store connections) against one real TCPStore that node 0 serves, at N = 8, 64, 512 and 2048. Per N: the time
to join, the store requests per second while the workers run (counted on every connection),
a restart round, the time until a silent node is noticed and until every node is stopped,
and the time from a worker failure until every node is stopped.

``--agent-cpu`` runs real agents on loopback (static, one sleeping worker per node) with
2 and then 24 nodes and compares the CPU time of node 0's agent, which serves the store.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import multiprocessing
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
LAUNCHERS = ("xlarun", "torchrun")
CRASH_PEERS = 4
TEE_LINE_BYTES = 100
TEE_LINE_TEMPLATE = "rank {rank} line ".ljust(TEE_LINE_BYTES - 1, "x")
MEMORY_WORKERS = 8
# Long enough for the sampler to see every helper process several times.
MEMORY_WORKER_SLEEP_S = 1.0
SAMPLE_INTERVAL_S = 0.005
# Variables that would change what the launchers or the workers do if inherited.
CLEARED_PREFIXES = ("PET_", "XLARUN_", "TORCHELASTIC_", "PJRT_", "XRT_")
CLEARED_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                 # Without bytecode caches every launch compiles the launcher's modules again, and an
                 # unbuffered launcher stdout costs torchrun's tee a write per line: neither is how an
                 # installed launcher usually runs.
                 "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")

NOOP_WORKER = "pass\n"

SLEEP_WORKER = """\
import sys, time
time.sleep(float(sys.argv[1]))
"""

CRASH_WORKER = """\
import os, sys, time
directory = sys.argv[1]
rank = int(os.environ["LOCAL_RANK"])
peers = int(os.environ["LOCAL_WORLD_SIZE"]) - 1
if rank:
    open(os.path.join(directory, "ready.%d" % rank), "w").close()
    time.sleep(60)
    sys.exit(0)
while sum(name.startswith("ready.") for name in os.listdir(directory)) < peers:
    time.sleep(0.005)
with open(os.path.join(directory, "crash_time"), "w") as handle:
    handle.write(repr(time.time()))
os._exit(1)
"""

TEE_WORKER = """\
import os, sys, time
directory, lines, template = sys.argv[1], int(sys.argv[2]), sys.argv[3]
block = 1000
line = (template.replace("{rank}", os.environ["LOCAL_RANK"]) + "\\n").encode()
chunk = line * block
out = sys.stdout.buffer
with open(os.path.join(directory, "start.%s" % os.environ["LOCAL_RANK"]), "w") as handle:
    handle.write(repr(time.time()))
for _ in range(lines // block):
    out.write(chunk)
out.write(line * (lines % block))
out.flush()
"""


class BenchError(RuntimeError):
    """A launcher or worker exited with a code the measure did not expect."""


@dataclass
class Sizes:
    launch_workers: tuple[int, ...]
    tee_lines_per_worker: int


FULL = Sizes(launch_workers=(2, 8, 32), tee_lines_per_worker=200_000)
QUICK = Sizes(launch_workers=(2,), tee_lines_per_worker=20_000)


@dataclass
class Measure:
    """One row of the table: samples per launcher, how to show them, and the goal."""

    title: str
    unit: str
    scale: float
    digits: int
    goal: str = ""
    goal_met: Optional[Callable[[float, float], bool]] = None
    samples: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in LAUNCHERS})
    floor: list[float] = field(default_factory=list)

    def median(self, launcher: str) -> float:
        return statistics.median(self.samples[launcher])

    def show(self, values: list[float]) -> str:
        if not values:
            return "—"
        middle = f"{statistics.median(values) * self.scale:.{self.digits}f}"
        if len(values) == 1:
            return middle
        low, high = min(values) * self.scale, max(values) * self.scale
        return f"{middle} ({low:.{self.digits}f}–{high:.{self.digits}f})"


class Runner:
    """Starts launchers and workers with a clean environment inside one scratch directory."""

    def __init__(self, bin_dir: Path, scratch: Path):
        self.bin_dir = bin_dir
        self.scratch = scratch
        self.env = clean_environment()
        self._serial = 0
        self.scripts = {}
        for name, text in (("noop", NOOP_WORKER), ("sleep", SLEEP_WORKER), ("crash", CRASH_WORKER),
                           ("tee", TEE_WORKER)):
            path = scratch / f"{name}_worker.py"
            path.write_text(text)
            self.scripts[name] = str(path)

    def fresh_dir(self, label: str) -> Path:
        self._serial += 1
        directory = self.scratch / f"{self._serial:04d}-{label}"
        directory.mkdir()
        return directory

    def launcher_argv(self, launcher: str, nproc: int, log_dir: Path, script: str, *script_args: str,
                      extra: tuple[str, ...] = ()) -> list[str]:
        return [str(self.bin_dir / launcher), "--standalone", "--nproc-per-node", str(nproc),
                "--log-dir", str(log_dir), *extra, script, *script_args]

    def spawn(self, argv: list[str], stderr_path: Path, stdout_fd: Optional[int] = None) -> int:
        """Start ``argv`` as the leader of a new session; stdin and (by default) stdout are /dev/null."""
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, str(stderr_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        ]
        if stdout_fd is None:
            actions.append((os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, stdout_fd, 1))
        return os.posix_spawn(argv[0], argv, self.env, file_actions=actions, setsid=True)

    def python(self) -> str:
        return str(self.bin_dir / "python")


def clean_environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(CLEARED_PREFIXES) and name not in CLEARED_NAMES}
    # Both launchers print a notice otherwise; the measure is the launch, not the notice.
    env["OMP_NUM_THREADS"] = "1"
    return env


def check_exit(launcher: str, status: int, expected_ok: bool, stderr_path: Path) -> None:
    code = os.waitstatus_to_exitcode(status)
    if (code == 0) == expected_ok:
        return
    tail = stderr_path.read_text(errors="replace").splitlines()[-15:]
    wanted = "0" if expected_ok else "non-zero"
    raise BenchError(f"{launcher} exited {code}, expected {wanted}; its stderr ends with:\n" + "\n".join(tail))


# --- launch and exit ---------------------------------------------------------------------------

def time_launch(runner: Runner, launcher: str, nproc: int) -> float:
    run_dir = runner.fresh_dir(f"launch-{launcher}-{nproc}")
    argv = runner.launcher_argv(launcher, nproc, run_dir / "logs", runner.scripts["noop"])
    start = time.perf_counter()
    pid = runner.spawn(argv, run_dir / "stderr")
    _, status, _ = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    check_exit(launcher, status, True, run_dir / "stderr")
    return elapsed


def time_direct_spawn(runner: Runner, nproc: int) -> float:
    """The floor: the same no-op workers started and reaped by this script, no launcher."""
    run_dir = runner.fresh_dir(f"direct-{nproc}")
    argv = [runner.python(), "-u", runner.scripts["noop"]]
    start = time.perf_counter()
    pids = [runner.spawn(argv, run_dir / f"stderr.{rank}") for rank in range(nproc)]
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    elapsed = time.perf_counter() - start
    for rank, status in enumerate(statuses):
        check_exit("a directly started worker", status, True, run_dir / f"stderr.{rank}")
    return elapsed


# --- peak memory -------------------------------------------------------------------------------

def children_of(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def session_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state, ppid, pgrp, session.
    return int(fields[3])


def name_of(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None


def peak_rss_kib(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def descendants(root: int) -> list[int]:
    found = []
    pending = [root]
    while pending:
        children = children_of(pending.pop())
        found.extend(children)
        pending.extend(children)
    return found


@dataclass
class MemorySample:
    tree_kib: int
    launcher_kib: int
    ru_maxrss_kib: int
    processes: int


def sample_memory(runner: Runner, launcher: str) -> MemorySample:
    from xlarun.supervision.guard import GUARD_TITLE

    run_dir = runner.fresh_dir(f"memory-{launcher}")
    argv = runner.launcher_argv(launcher, MEMORY_WORKERS, run_dir / "logs", runner.scripts["sleep"],
                                str(MEMORY_WORKER_SLEEP_S))
    pid = runner.spawn(argv, run_dir / "stderr")
    peaks: dict[int, int] = {}
    workers: set[int] = set()
    guards: set[int] = set()
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        for member in [pid, *descendants(pid)]:
            peak, session = peak_rss_kib(member), session_of(member)
            if peak is None or session is None:
                continue
            peaks[member] = max(peak, peaks.get(member, 0))
            if name_of(member) == GUARD_TITLE.split()[0]:
                guards.add(member)
            elif session != pid:
                # A worker, a worker's child, or the guard before it took its name. A worker
                # sampled between the launcher's fork and its setsid still looked like a helper,
                # so its earlier peaks are dropped below.
                workers.add(member)
        time.sleep(SAMPLE_INTERVAL_S)
    helpers = {member: peak for member, peak in peaks.items() if member in guards or member not in workers}
    check_exit(launcher, status, True, run_dir / "stderr")
    return MemorySample(tree_kib=sum(helpers.values()), launcher_kib=helpers.get(pid, 0),
                        ru_maxrss_kib=usage.ru_maxrss, processes=len(helpers))


# --- crash to exit -----------------------------------------------------------------------------

def time_crash_to_exit(runner: Runner, launcher: str) -> float:
    run_dir = runner.fresh_dir(f"crash-{launcher}")
    marks = run_dir / "marks"
    marks.mkdir()
    argv = runner.launcher_argv(launcher, CRASH_PEERS + 1, run_dir / "logs", runner.scripts["crash"], str(marks))
    pid = runner.spawn(argv, run_dir / "stderr")
    _, status, _ = os.wait4(pid, 0)
    exited_at = time.time()
    check_exit(launcher, status, False, run_dir / "stderr")
    return exited_at - float((marks / "crash_time").read_text())


# --- tee throughput ----------------------------------------------------------------------------

def tee_line(rank: int) -> bytes:
    """What tee worker ``rank`` writes on each line, newline excluded."""
    return TEE_LINE_TEMPLATE.replace("{rank}", str(rank)).encode()


@dataclass
class TeeSample:
    bytes_per_s: float
    lines_per_s: float
    damaged_lines: int


def time_tee(runner: Runner, launcher: str, lines_per_worker: int) -> TeeSample:
    workers = 2
    run_dir = runner.fresh_dir(f"tee-{launcher}")
    marks = run_dir / "marks"
    marks.mkdir()
    argv = runner.launcher_argv(launcher, workers, run_dir / "logs", runner.scripts["tee"], str(marks),
                                str(lines_per_worker), TEE_LINE_TEMPLATE, extra=("--tee", "3"))
    read_fd, write_fd = os.pipe()
    try:
        pid = runner.spawn(argv, run_dir / "stderr", stdout_fd=write_fd)
    finally:
        os.close(write_fd)
    chunks = []
    try:
        while True:
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        output_ended_at = time.time()
    finally:
        os.close(read_fd)
    _, status, _ = os.wait4(pid, 0)
    check_exit(launcher, status, True, run_dir / "stderr")
    started_at = min(float(path.read_text()) for path in marks.glob("start.*"))
    elapsed = output_ended_at - started_at
    total_lines = workers * lines_per_worker
    return TeeSample(bytes_per_s=total_lines * TEE_LINE_BYTES / elapsed, lines_per_s=total_lines / elapsed,
                     damaged_lines=damaged_lines(b"".join(chunks), workers, lines_per_worker))


def damaged_lines(console: bytes, workers: int, lines_per_worker: int) -> int:
    """Worker lines that did not reach the console whole, each on its own line with its rank's prefix."""
    counts = Counter(console.split(b"\n"))
    intact = sum(min(counts[f"[default{rank}]:".encode() + tee_line(rank)], lines_per_worker)
                 for rank in range(workers))
    return workers * lines_per_worker - intact


# --- pod scale: the real rendezvous for N simulated nodes against one real store ----------------

POD_NODES = (8, 64, 512, 2048)
POD_WINDOW_S = 10.0
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

    def __init__(self, config: Any, environ: dict[str, str]):
        from xlarun.rendezvous.distributed import StoreRendezvous
        from xlarun.rendezvous.store import tcp_client

        self.clients: list[CountingClient] = []

        def connect(host: str, port: int, timeout: float) -> CountingClient:
            client = CountingClient(tcp_client(host, port, timeout))
            self.clients.append(client)
            return client

        self.rendezvous = StoreRendezvous(config, environ, connect)
        self.stopped_at: Optional[float] = None

    def stop(self, reason: str) -> None:
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

    def __init__(self, config: Any, ranks: list[int]):
        # The rendezvous draws status lines only on a terminal: none for hundreds of simulated nodes.
        with contextlib.redirect_stderr(io.StringIO()):
            self.nodes = {rank: SimNode(dataclasses.replace(config, node_rank=rank), {}) for rank in ranks}

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
        from xlarun.failures import FailureRecord

        failed_at = time.monotonic()
        self.nodes[rank].rendezvous.publish_failure(FailureRecord(
            rank=rank, local_rank=0, returncode=1, pid=0, time=time.time(), host="simulated", node_rank=rank,
            nnodes=count))
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


def shard_main(connection: Any, config: Any, ranks: list[int]) -> None:
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

    def __init__(self, config: Any, ranks: list[int]):
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
    from xlarun.config import LaunchConfig, WorkerCommand

    port = free_port()
    config = LaunchConfig(command=WorkerCommand("simulated", ()), min_nodes=count, max_nodes=count,
                          master_addr="127.0.0.1", master_port=port, rdzv_id=f"pod-{count}",
                          rdzv_conf={"join_timeout": "600"})
    host = PodShard(config, [0])
    others = list(range(1, count))
    shards = [ShardProcess(config, others[start:start + POD_SHARD_NODES])
              for start in range(0, len(others), POD_SHARD_NODES)]
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(host: str, port: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BenchError(f"nothing listens on {host}:{port} after {limit_s:.0f} s") from None
            time.sleep(0.01)


def raise_open_file_limit() -> None:
    """Every simulated node holds a few connections, and the server in this process their other ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pod_table(samples: list[PodSample]) -> list[str]:
    from xlarun.rendezvous.store import DEFAULT_HEARTBEAT_TIMEOUT

    notice_goal = DEFAULT_HEARTBEAT_TIMEOUT + POD_NOTICE_SLACK_S
    rows = [
        "| nodes | join (s) | restart round (s) | store requests/s while running | per node per s "
        f"| silent node noticed (s, goal ≤ {notice_goal:.0f}) | silence → every node stopped (s) "
        "| failure → every node stopped (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sample in samples:
        rows.append(f"| {sample.nodes} | {sample.join_s:.2f} | {sample.restart_s:.2f} | {sample.requests_per_s:.0f} "
                    f"| {sample.requests_per_s / sample.nodes:.2f} | {sample.notice_s:.2f} "
                    f"| {sample.silent_stop_s:.2f} | {sample.failure_stop_s * 1000:.0f} |")
    largest = max(samples, key=lambda sample: sample.nodes)
    rates = [sample.requests_per_s / sample.nodes for sample in samples]
    rows += ["", f"Goals: {largest.nodes} nodes join in under {POD_JOIN_GOAL_S:.0f} s: "
                 f"{'met' if largest.join_s < POD_JOIN_GOAL_S else 'not met'}; requests per node per second "
                 f"from {min(rates):.2f} to {max(rates):.2f} across node counts; a silent node noticed within "
                 f"heartbeat_timeout + {POD_NOTICE_SLACK_S:.0f} s: "
                 f"{'met' if all(sample.notice_s <= notice_goal for sample in samples) else 'not met'}."]
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
    return ["## Pod-scale simulation (static rendezvous, one store, heartbeat_timeout 5 s)", "",
            f"- {cpu_model()}, {os.cpu_count()} cores; {window_s:.0f} s of running counted per node count; "
            f"RES_OPTIONS={os.environ['RES_OPTIONS']!r}", "", *pod_table(samples)]


# --- node 0's agent CPU: real agents on loopback ---------------------------------------------

AGENT_CPU_NODES = (2, 24)
AGENT_CPU_RUN_S = 20


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU of one live process (its threads, not its children), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listening(port: int) -> bool:
    """Whether a TCP socket of this host listens on ``port`` (read from /proc: nothing connects)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        # local_address is HEXADDR:HEXPORT; state 0A is LISTEN.
        if any(int(row.split()[1].rsplit(":", 1)[1], 16) == port and row.split()[3] == "0A" for row in rows):
            return True
    return False


def worker_started(pid: int) -> bool:
    """Whether the agent ``pid`` has started its ``sleep`` worker."""
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/comm") as handle:
                if handle.read().strip() == "sleep":
                    return True
        except OSError:
            continue
    return False


@dataclass
class AgentCpu:
    total_s: float
    running_s: float


def agent_cpu(launcher: str, bin_dir: Path, scratch: Path, count: int, run_s: int) -> AgentCpu:
    """CPU seconds of node 0's agent in a static job of ``count`` loopback nodes, one sleeping worker each.

    Node 0 starts alone, as on a host of its own, and the others once it serves the store:
    torch's import costs a process far more system time while 23 other interpreters that
    imported torch share the machine (about +1 s, for torchrun's agent as for xlarun's, and
    for a bare ``import torch.distributed``), which a real node never pays. The total comes from
    ``wait4`` on node 0's agent (its time and that of the processes it reaped: the ``sleep``
    worker and xlarun's orphan guard, which cost next to nothing); ``running_s`` is the part
    after its worker started, the time the store and the watching cost.
    """
    port = free_port()
    env = clean_environment()

    def start(rank: int) -> int:
        argv = [str(bin_dir / launcher), "--nnodes", str(count), "--node_rank", str(rank), "--master_addr",
                "127.0.0.1", "--master_port", str(port), "--nproc_per_node", "1", "--no-python", "sleep", str(run_s)]
        with open(scratch / f"{launcher}-{count}-{rank}.stderr", "w") as stderr:
            return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=stderr).pid

    node0 = start(0)
    while not listening(port):
        time.sleep(0.05)
    others = [start(rank) for rank in range(1, count)]
    while not worker_started(node0):
        time.sleep(0.05)
    at_start = process_cpu_seconds(node0)
    _, status, usage = os.wait4(node0, 0)
    for pid in others:
        os.waitpid(pid, 0)
    check_exit(f"{launcher} (node 0)", status, True, scratch / f"{launcher}-{count}-0.stderr")
    total = usage.ru_utime + usage.ru_stime
    return AgentCpu(total, total - at_start)


def run_agent_cpu(bin_dir: Path, run_s: int) -> list[str]:
    samples: dict[tuple[str, int], AgentCpu] = {}
    with tempfile.TemporaryDirectory(prefix="xlarun-bench-") as scratch:
        for count in AGENT_CPU_NODES:
            for launcher in LAUNCHERS:
                progress(f"bench: node 0's agent CPU, {launcher}, {count} loopback nodes, {run_s} s")
                samples[launcher, count] = agent_cpu(launcher, bin_dir, Path(scratch), count, run_s)
    small, large = AGENT_CPU_NODES
    limit = 1.25 * samples["xlarun", small].total_s + 0.3
    rows = [f"## Node 0's agent CPU over a {run_s} s static run, one sleeping worker per node", "",
            "| nodes | xlarun total (s) | xlarun while running (s) | torchrun total (s) | torchrun while running (s) |",
            "|---|---|---|---|---|"]
    for count in AGENT_CPU_NODES:
        xlarun, torchrun = samples["xlarun", count], samples["torchrun", count]
        rows.append(f"| {count} | {xlarun.total_s:.2f} | {xlarun.running_s:.2f} | {torchrun.total_s:.2f} "
                    f"| {torchrun.running_s:.2f} |")
    met = samples["xlarun", large].total_s <= limit
    return rows + ["", f"Goal: xlarun with {large} nodes within 1.25 × (+0.3 s) of {small} nodes, at most "
                       f"{limit:.2f} s: {'met' if met else 'not met'}."]


# --- machine facts -----------------------------------------------------------------------------

def venv_versions(python: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, platform\n"
            "print('python', platform.python_version())\n"
            "for name in ('torch', 'torch_xla', 'xlarun', 'click', 'psutil'):\n"
            "    try:\n"
            "        print(name, m.version(name))\n"
            "    except m.PackageNotFoundError:\n"
            "        print(name, 'not installed')\n")
    output = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in output.splitlines())


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total_gib() -> str:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def machine_facts(python: str, repeat: int, quick: bool, load_before: tuple[float, ...]) -> list[str]:
    versions = venv_versions(python)
    usable = len(os.sched_getaffinity(0))
    load_after = os.getloadavg()
    return [
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores ({usable} usable), memory {memory_total_gib()}",
        f"- OS: {platform.system()} {platform.release()}",
        f"- Python {versions['python']}; torch {versions['torch']}, torch_xla {versions['torch_xla']}, "
        f"xlarun {versions['xlarun']}, click {versions['click']}, psutil {versions['psutil']}",
        f"- {repeat} interleaved runs per launcher and measure{' (quick sizes)' if quick else ''}; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after",
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
    ]


# --- the run -----------------------------------------------------------------------------------

def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def at_least_10x(xlarun: float, torchrun: float) -> bool:
    return torchrun / xlarun >= 10


def run_benchmark(runner: Runner, repeat: int, sizes: Sizes) -> list[Measure]:
    measures = []

    # Untimed: fills the page cache and the bytecode caches, as on a machine that launched before.
    for launcher in LAUNCHERS:
        time_launch(runner, launcher, 2)

    for nproc in sizes.launch_workers:
        measure = Measure(f"launch and exit, {nproc} no-op workers", "s", 1, 3, "≥ 10×", at_least_10x)
        progress(f"bench: {measure.title}")
        for _ in range(repeat):
            for launcher in LAUNCHERS:
                measure.samples[launcher].append(time_launch(runner, launcher, nproc))
            measure.floor.append(time_direct_spawn(runner, nproc))
        measures.append(measure)

    tree = Measure("", "MiB", 1 / 1024, 1, "≥ 10×", at_least_10x)
    own = Measure("peak RSS, launcher process alone", "MiB", 1 / 1024, 1)
    largest = Measure("ru_maxrss from wait4 (largest process, workers included)", "MiB", 1 / 1024, 1)
    progress(f"bench: peak memory, {MEMORY_WORKERS} workers")
    helper_counts: dict[str, set[int]] = {launcher: set() for launcher in LAUNCHERS}
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            sample = sample_memory(runner, launcher)
            tree.samples[launcher].append(sample.tree_kib)
            own.samples[launcher].append(sample.launcher_kib)
            largest.samples[launcher].append(sample.ru_maxrss_kib)
            helper_counts[launcher].add(sample.processes)
    counts = ", ".join(f"{launcher} {'/'.join(map(str, sorted(helper_counts[launcher])))}" for launcher in LAUNCHERS)
    tree.title = f"peak RSS, launcher tree without workers ({MEMORY_WORKERS} workers; processes: {counts})"
    measures += [tree, own, largest]

    crash = Measure(f"crash to exit, {CRASH_PEERS} sleeping peers", "ms", 1000, 1, "xlarun < 100 ms",
                    lambda xlarun, torchrun: xlarun < 0.1)
    progress(f"bench: {crash.title}")
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            crash.samples[launcher].append(time_crash_to_exit(runner, launcher))
    measures.append(crash)

    lines = sizes.tee_lines_per_worker
    tee_bytes = Measure(f"tee throughput, --tee 3, 2 workers × {lines} lines", "MB/s", 1e-6, 1,
                        "≤ 1 (as fast or faster)", lambda xlarun, torchrun: xlarun >= torchrun)
    tee_lines = Measure(f"tee throughput, {TEE_LINE_BYTES}-byte lines", "k lines/s", 1e-3, 1)
    tee_damage = Measure(f"tee lines lost, torn or unprefixed (of {2 * lines})", "lines", 1, 0, "xlarun 0",
                         lambda xlarun, torchrun: xlarun == 0)
    progress(f"bench: {tee_bytes.title}")
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            sample = time_tee(runner, launcher, lines)
            tee_bytes.samples[launcher].append(sample.bytes_per_s)
            tee_lines.samples[launcher].append(sample.lines_per_s)
            tee_damage.samples[launcher].append(sample.damaged_lines)
    measures += [tee_bytes, tee_lines, tee_damage]
    return measures


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}" if denominator else "—"


def markdown_table(measures: list[Measure]) -> list[str]:
    rows = [
        "| measure | unit | xlarun | torchrun | no launcher | torchrun / xlarun | goal | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for measure in measures:
        xlarun, torchrun = measure.median("xlarun"), measure.median("torchrun")
        met = "" if measure.goal_met is None else "yes" if measure.goal_met(xlarun, torchrun) else "**no**"
        rows.append(f"| {measure.title} | {measure.unit} | {measure.show(measure.samples['xlarun'])} "
                    f"| {measure.show(measure.samples['torchrun'])} | {measure.show(measure.floor)} "
                    f"| {ratio(torchrun, xlarun)} | {measure.goal} | {met} |")
    return rows


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per launcher and measure (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {QUICK.launch_workers} workers for the launch and "
                             f"{QUICK.tee_lines_per_worker} tee lines per worker")
    parser.add_argument("--markdown-out", metavar="FILE", help="also write the report to FILE")
    parser.add_argument("--bin-dir", default=str(REPO / ".venv" / "bin"),
                        help="directory holding xlarun, torchrun and python (default: the repository's .venv/bin)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--pod-scale", action="store_true",
                      help="only the simulation of many nodes against one store (its own table)")
    mode.add_argument("--agent-cpu", action="store_true",
                      help=f"only node 0's agent CPU with {' and '.join(map(str, AGENT_CPU_NODES))} loopback nodes")
    parser.add_argument("--nodes", default=",".join(map(str, POD_NODES)),
                        help=f"simulated node counts for --pod-scale (default {','.join(map(str, POD_NODES))})")
    parser.add_argument("--window", type=float, default=POD_WINDOW_S,
                        help=f"seconds of running counted per node count for --pod-scale (default {POD_WINDOW_S:.0f})")
    parser.add_argument("--cpu-run", type=int, default=AGENT_CPU_RUN_S,
                        help=f"seconds the workers run for --agent-cpu (default {AGENT_CPU_RUN_S})")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    try:
        args.nodes = tuple(int(count) for count in args.nodes.split(","))
    except ValueError:
        parser.error(f"--nodes takes node counts separated by commas, got {args.nodes!r}")
    if min(args.nodes) < 2 or args.window <= 0 or args.cpu_run < 1:
        parser.error("--nodes counts must be at least 2, --window and --cpu-run positive")
    for name in (*LAUNCHERS, "python"):
        if not os.access(Path(args.bin_dir) / name, os.X_OK):
            parser.error(f"no executable {name} in --bin-dir {args.bin_dir}")
    return args


def compare_launchers(args: argparse.Namespace) -> list[str]:
    """The default run: xlarun and torchrun side by side, as a report."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="xlarun-bench-") as scratch:
        runner = Runner(Path(args.bin_dir).absolute(), Path(scratch))
        measures = run_benchmark(runner, args.repeat, QUICK if args.quick else FULL)
        facts = machine_facts(runner.python(), args.repeat, args.quick, load_before)
    return ["## xlarun vs torchrun", "", *facts, "", "Medians, with the min–max range in parentheses.", "",
            *markdown_table(measures)]


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        if args.pod_scale:
            lines = run_pod_scale(args.nodes, args.window)
        elif args.agent_cpu:
            lines = run_agent_cpu(Path(args.bin_dir).absolute(), args.cpu_run)
        else:
            lines = compare_launchers(args)
    except BenchError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.markdown_out:
        Path(args.markdown_out).write_text(text)
    progress(f"bench: done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
