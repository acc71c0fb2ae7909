"""Launch data: what one launch runs and how, as immutable values every layer reads.

:class:`LaunchConfig` is the whole launch, validated by the command line layer
(:mod:`xlarun.planning.rules`); :class:`WorkerCommand` the program each worker runs. The small
values the flags parse into (:class:`NprocRequest`, :class:`StreamSpec`) and the defaults
torchrun gives them live here too, so the layers below the command line use them without
loading the option table.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping

from xlarun.contract import RUN_PATH_BOOTSTRAP
from xlarun.exceptions import InvalidValue
from xlarun.structs import Struct, field

DEFAULT_MASTER_PORT = 29500
DEFAULT_C10D_PORT = 29400
"""The c10d endpoint's port when it names none, as torchrun's."""

STDOUT = 1
STDERR = 2


class NprocRequest(Struct, frozen=True):
    """``--nproc-per-node`` as given: a count, or a word (``auto``, ``cpu``, ``gpu``) resolved later."""

    count: int | None = None
    word: str | None = None

    def __str__(self) -> str:
        return str(self.count) if self.word is None else self.word


class StreamSpec(Struct, frozen=True):
    """Which of a worker's streams (``STDOUT | STDERR`` bits) a redirect or tee applies to."""

    default: int = 0
    per_rank: Mapping[int, int] | None = None

    def for_rank(self, local_rank: int) -> int:
        if self.per_rank is not None:
            return self.per_rank.get(local_rank, 0)
        return self.default


TORCHRUN_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""What torchrun handles (forwards to the workers, then stops them) unless ``--signals-to-handle`` says otherwise."""
_UNHANDLEABLE = {
    signal.SIGKILL: "no process can catch it",
    signal.SIGSTOP: "no process can catch it",
    signal.SIGCHLD: "every worker's exit sends it to the launcher, which would stop the run at the first one",
    signal.SIGCONT: "it continues the launcher after Ctrl-Z, which would then stop the run",
}
"""Signals ``--signals-to-handle`` refuses, and why: the launcher cannot catch them, or gets them itself."""


class SignalList(Struct, frozen=True):
    """``--signals-to-handle``: the signals named, and the text as given.

    torchrun 2.10 and later put the text in every worker's environment as
    ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (after overwriting whatever the launcher's environment
    held there), so it is kept as given, spaces and all.
    """

    signals: tuple[signal.Signals, ...] = TORCHRUN_HANDLED_SIGNALS
    text: str = ",".join(number.name for number in TORCHRUN_HANDLED_SIGNALS)

    @classmethod
    def parse(cls, text: str) -> SignalList:
        """torchrun's format: names as the ``signal`` module spells them (``SIGUSR1``), comma-separated.

        An empty item is skipped, as torchrun skips it. A name torchrun would only warn about
        (``SIGFOO``, ``USR1``) or could not handle (:data:`_UNHANDLEABLE`: ``SIGKILL``, ``SIGCHLD``) is
        refused: a launch that silently handles less than it was told to, or ends at its first
        worker's exit, is worse than one that does not start.
        """
        signals: list[signal.Signals] = []
        for item in text.split(","):
            name = item.strip()
            if not name:
                continue
            number = _signal_named(name)
            if number in _UNHANDLEABLE:
                raise InvalidValue(f"{name} cannot be handled: {_UNHANDLEABLE[number]}")
            if number not in signals:
                signals.append(number)
        return cls(tuple(signals), text)


def _signal_named(name: str) -> signal.Signals:
    number = signal.Signals.__members__.get(name)
    if number is None:
        raise InvalidValue(f"{name!r} is no signal name")
    return number


def parse_signal(text: str) -> signal.Signals:
    """One signal, named as the ``signal`` module spells it (``SIGUSR1``), that a worker can catch."""
    number = _signal_named(text.strip())
    if number in (signal.SIGKILL, signal.SIGSTOP):
        raise InvalidValue(f"{number.name} cannot be caught: no worker could act on it")
    return number


def parse_port(text: str) -> int:
    """A port number 0..65535 (0: the kernel picks one)."""
    try:
        port = int(text)
    except ValueError:
        raise InvalidValue() from None
    if not 0 <= port <= 65535:
        raise InvalidValue("out of range")
    return port


def endpoint_parts(endpoint: str) -> tuple[str, int | None]:
    """``host[:port]`` with IPv6 hosts in brackets, as torchrun's rendezvous parses it; the port None
    where the endpoint names none."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise InvalidValue("empty endpoint")
    if endpoint.startswith("["):
        host, bracket, rest = endpoint[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidValue("an IPv6 host needs the form [addr]:port")
        port_text = rest[1:]
    else:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if not host:
        raise InvalidValue("no host")
    return host, parse_port(port_text) if port_text else None


def split_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """:func:`endpoint_parts`, with ``default_port`` where the endpoint names no port."""
    host, port = endpoint_parts(endpoint)
    return host, default_port if port is None else port


TORCH_TRUE_WORDS = ("1", "true", "t", "yes", "y")
TORCH_FALSE_WORDS = ("0", "false", "f", "no", "n")
"""How torch's rendezvous parameters read a boolean (``RendezvousParameters.get_as_bool``), any case."""


class WorkerCommand(Struct, frozen=True):
    """The program each worker runs; ``${local_rank}`` in its arguments is substituted per worker."""

    script: str
    args: tuple[str, ...]
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    python: str = ""

    def argv(self, local_rank: int) -> list[str]:
        args = [a.replace("${local_rank}", str(local_rank)) for a in self.args]
        if self.no_python:
            return [self.script, *args]
        if self.run_path:
            return [self.python, "-u", RUN_PATH_BOOTSTRAP, self.script, *args]
        return [self.python, "-u", *(["-m"] if self.module else []), self.script, *args]


class Topology(enum.Enum):
    """How the nodes of a launch meet; :attr:`LaunchConfig.topology` says which one a launch is."""

    STANDALONE = "standalone"
    """One node whose workers' store takes a free port at start, no store of the launcher's: c10d at
    an endpoint whose port is 0, which is what ``--standalone`` is (on localhost, with a fresh run id)."""
    LONE_NODE = "lone node"
    """One static node: ranks from the flags alone, no store, MASTER_ADDR and MASTER_PORT the
    endpoint's if one is given, else the master address and port, as torchrun's."""
    STATIC = "static"
    """Several nodes, each with its ``--node-rank``; node 0's agent serves the job's store."""
    C10D = "c10d"
    """Nodes meet at a c10d endpoint, which assigns the node ranks."""


class LaunchConfig(Struct, frozen=True):
    """Everything one launch needs, validated. Field names follow torchrun's flags.

    ``nproc_per_node`` is the resolved worker count of this node (``auto`` and the other
    words already counted against the planned device).
    """

    command: WorkerCommand
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    standalone: bool = False
    """``--standalone``, or a lone node that torchrun 2.12 and newer runs so (see :attr:`torchrun`)."""
    torchrun: tuple[int, int] = (2, 15)
    """The torchrun release whose behaviour the launch follows where releases differ: the installed torch's."""
    max_restarts: int = 0
    role: str = "default"
    local_addr: str | None = None
    log_dir: str | None = None
    redirects: StreamSpec = StreamSpec()
    tee: StreamSpec = StreamSpec()
    local_ranks_filter: frozenset[int] | None = None
    log_line_prefix_template: str | None = None
    duplicate_stdout_filters: tuple[str, ...] = ()
    """Tee'd stdout lines holding any of these go to ``attempt_<n>/filtered_stdout.log`` too (none: no file)."""
    duplicate_stderr_filters: tuple[str, ...] = ()
    """As :attr:`duplicate_stdout_filters`, for stderr: ``attempt_<n>/filtered_stderr.log``."""
    shutdown_timeout: float = 30.0
    """Seconds between the stop signal and SIGKILL when the workers are stopped."""
    signals_to_handle: SignalList = SignalList()
    virtual_local_rank: bool = False
    """Every worker gets ``LOCAL_RANK=0`` and only its own device in ``CUDA_VISIBLE_DEVICES``."""
    summary_file: str | None = None
    event_log: str | None = None
    """``--event-log``: the file the run's events are appended to as JSON lines, ``-`` for stderr."""
    hang_timeout: float | None = None
    """Seconds without progress and CPU after which a node's workers count as hung (None: not watched)."""
    preemption_signal: int | None = None
    """Sent to every worker when the metadata server says the VM stops (None: none is sent)."""
    dry_run: bool = False
    allow_busy_device: bool = False
    console_whole_lines: bool = False
    """Every worker stream the console shows goes through the relay, line by line, prefixed or not: a
    detached run's console is a file that several workers write, which a line must reach whole."""

    @property
    def topology(self) -> Topology:
        """The one classification of the launch that the real run and the dry run both read."""
        # Several nodes could never reach a store at port 0: the command line refuses them.
        if self.standalone or (self.rdzv_backend != "static" and self.store_address()[1] == 0):
            return Topology.STANDALONE
        if self.rdzv_backend != "static":
            return Topology.C10D
        return Topology.LONE_NODE if self.max_nodes == 1 else Topology.STATIC

    def store_address(self) -> tuple[str, int]:
        """Where the job's store is served (for one static node, the workers' store: MASTER_ADDR and
        MASTER_PORT). Static: the endpoint if one is given (the command line refuses one without a
        port, as torchrun), else the master address and port; c10d: the endpoint, its port 29400
        unless named, port 0 for one picked free at start."""
        if self.rdzv_backend == "static":
            return (
                split_endpoint(self.rdzv_endpoint, self.master_port)
                if self.rdzv_endpoint
                else (self.master_addr, self.master_port)
            )
        return split_endpoint(self.rdzv_endpoint or f"{self.master_addr}:{DEFAULT_C10D_PORT}", DEFAULT_C10D_PORT)
