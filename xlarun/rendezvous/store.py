"""Store plumbing: serving and reaching the job's TCPStore, its key names, waits and settings.

Imported only for multi-node launches (it imports torch.distributed lazily, on first use).

Every store call is one request to the single thread that serves the store, so the rest of
the rendezvous is written in terms of what this module offers: named keys under the job's
prefix, a connection per thread that blocks (a TCPStore client serialises its calls, so
one blocked in ``wait`` would hold every other caller), and waits that block on the server
instead of polling it.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import hashlib
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, cast

from xlarun.config import TORCH_TRUE_WORDS
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import flag
from xlarun.rdzv_conf import default_seconds, read_seconds
from xlarun.structs import Struct

# How often a status line on a terminal is redrawn while the agent waits.
STATUS_INTERVAL = 0.5


class Client(Protocol):
    """What the rendezvous asks of a TCPStore connection (a real one, or the benchmark's counting proxy)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def add(self, key: str, amount: int) -> int: ...

    def check(self, keys: list[str]) -> bool: ...

    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...

    def multi_set(self, keys: list[str], values: list[str]) -> None: ...


Connector = Callable[[str, int, float], Client]
"""Opens one client connection to ``host, port`` whose calls time out after the given seconds."""


def tcp_client(host: str, port: int, timeout: float) -> Client:
    """A TCPStore client connection (the default :data:`Connector`)."""
    from torch.distributed import TCPStore

    # torch's type stubs leave out the multi-key calls its store has.
    return cast(Client, TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout), wait_for_workers=False))


def serve_store(host: str, port: int, timeout: float) -> tuple[Any, int]:
    """A TCPStore server listening on exactly ``host:port`` (never every interface).

    Returns the store and its port (``port`` 0 picks a free one). The store owns the
    listening socket; dropping the last reference to the store stops the server. The
    server object is also a client of itself.

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
        # Every agent of a pod may connect within the same second.
        server.listen(socket.SOMAXCONN)
    except OSError:
        server.close()
        raise
    bound_port = server.getsockname()[1]
    try:
        store = TCPStore(
            host,
            bound_port,
            None,
            True,
            datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=server.fileno(),
        )
    except DistNetworkError as error:
        raise LaunchError(f"cannot serve a store on {host}:{bound_port}: {first_line(error)}") from None
    server.detach()
    return store, bound_port


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def conf_seconds(conf: Mapping[str, str], key: str, default: float | None = None) -> float:
    """A ``--rdzv_conf`` number of seconds; where unset, ``default`` if given, else the key's own default
    (:data:`xlarun.rdzv_conf.SETTINGS`)."""
    text = conf.get(key)
    if text is None:
        return default_seconds(key) if default is None else default
    return read_seconds(key, text)


def conf_flag(conf: Mapping[str, str], key: str) -> bool | None:
    """A boolean ``--rdzv_conf`` key, already checked by :func:`xlarun.config.check_rdzv_conf`."""
    text = conf.get(key)
    return None if text is None else text.lower() in TORCH_TRUE_WORDS


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


class Timeouts(Struct, frozen=True):
    """The rendezvous's seconds, read from ``--rdzv_conf`` under torchrun's names."""

    join: float
    heartbeat: float
    close: float
    call: float
    """How long a connection may take to open, and a store may leave a call (a heartbeat among them)
    unanswered before it is taken for gone (a host that vanished without closing its connections):
    torchrun's ``read_timeout``."""

    @classmethod
    def read(cls, conf: Mapping[str, str], join_default: float | None = None) -> Timeouts:
        """``join_default``, where given, is the backend's: torchrun's static rendezvous reads ``timeout`` for it."""
        return cls(
            join=conf_seconds(conf, "join_timeout", join_default),
            heartbeat=conf_seconds(conf, "heartbeat_timeout"),
            close=conf_seconds(conf, "close_timeout"),
            call=conf_seconds(conf, "read_timeout"),
        )

    @property
    def beat_interval(self) -> float:
        """How often an agent beats and the monitor looks: a tenth of the heartbeat timeout, at most a second.

        A node is noticed at most two intervals after the timeout (its last beat may have just
        been read), so within ``heartbeat`` + 1 s at the default 5 s.
        """
        return min(1.0, self.heartbeat / 10)


class StoreRole(enum.Enum):
    """What this agent does about the job's store, as its backend decides."""

    SERVE = "serve"
    """This host was named to serve it: a port it cannot bind is the user's to fix."""
    SERVE_UNLESS_TAKEN = "serve unless taken"
    """Serve it, unless its port is taken here: another agent on this host serves it, so reach that one."""
    REACH = "reach"
    """Another host serves it."""


class JobKeys:
    """The names of the agents' keys beside torch's: two whatever the run id::

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
        started_ns                   when the first attempt was seated: the job's one id (TorchTPU's session)
        attempt_<n>/roster           the attempt's nodes in rank order (agent, host, workers)
        attempt_<n>/end              what ended the attempt (first writer wins); every node waits on it
        attempt_<n>/failure          the first failure of the attempt (JSON), first writer wins
        attempt_<n>/done             how many nodes' workers all succeeded
        attempt_<n>/settled/<rank>   ``finished`` (the node's workers are gone), ``lost``, or ``accounted``
                                     (a node was found lost before the end: no one need wait for the rest)
        attempt_<n>/lost             the first node found silent before the attempt ended (JSON): the root cause
        attempt_<n>/left, all_left   how many nodes read the outcome and left; the host closes after all
    """

    JOB = "xlarun/job"
    REFUSED = "xlarun/refused"
    REFUSED_LAST = "xlarun/refused/last"

    def __init__(self, run_id: str):
        self.run_id = run_id

    def __call__(self, *parts: object) -> str:
        return "/".join(["xlarun", self.run_id, *map(str, parts)])

    def attempt(self, number: int, *parts: object) -> str:
        return self(f"attempt_{number}", *parts)

    def heartbeat(self, agent: int) -> str:
        return self("heartbeat", agent)


def read_count(client: Client, key: str) -> int:
    """A counter that another process may have written to: 0 where it is absent or not a number.

    Read with ``get``: a TCPStore server answers ``add`` on a value that is not a number by
    closing the connection, which would read as a lost store.
    """
    if not client.check([key]):
        return 0
    try:
        return int(client.get(key))
    except ValueError:
        return 0


def is_timeout(error: BaseException) -> bool:
    """A ``wait`` that ran out of time (the connection is still good), as opposed to a lost store."""
    from torch.distributed import DistStoreError

    return isinstance(error, DistStoreError)


def wait_for_key(
    client: Client, key: str | list[str], deadline: float | None, status: Callable[[], None] | None = None
) -> bool:
    """Block until ``key`` exists (every one, for a list); False at ``deadline`` (monotonic seconds;
    ``None``: no deadline).

    The server answers the moment the key is set: nothing is polled. ``status`` (a terminal's
    status line) is called every :data:`STATUS_INTERVAL` while waiting.
    """
    while True:
        remaining = 3600.0 if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            return False
        if status is not None:
            status()
            remaining = min(remaining, STATUS_INTERVAL)
        try:
            client.wait([key] if isinstance(key, str) else key, datetime.timedelta(seconds=remaining))
            return True
        except Exception as error:
            if not is_timeout(error):
                raise


def connect_client(
    connector: Connector, host: str, port: int, timeout: float, call_timeout: float, status: StatusLine
) -> Client:
    """Reach the store at ``host:port``, retrying until ``timeout`` seconds have passed (its host may start later).

    Each try first asks whether the port takes connections at all, with a plain TCP connect
    bounded by the time left; only then does ``connector`` open the store's connection (its calls
    timing out after ``call_timeout``). torch's own connect retries a refused port with a backoff
    that overshoots its timeout several times over (3 s took 5.6 s, 6 s took 14 s, 30 s about a
    minute), so it is left only the case where the store answers. The line on giving up says how
    long this waited.
    """
    from torch.distributed import DistNetworkError

    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001)):
                pass
            return connector(host, port, call_timeout)
        except (OSError, DistNetworkError) as error:  # refused, timed out, unresolvable host, not a store
            waited = time.monotonic() - started
            if waited >= timeout:
                reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
                raise LaunchError(
                    f"cannot reach the rendezvous store at {host}:{port} after {waited:.0f} s "
                    f"({reason}): is node 0's agent running, and is the address "
                    "reachable from this node?"
                ) from None
            status.update(f"reaching the rendezvous store at {host}:{port} ({waited:.0f} s)")
            time.sleep(max(min(STATUS_INTERVAL, deadline - time.monotonic()), 0.0))


def lost_store_line(where: str, store_node: int | None, error: BaseException) -> str:
    """One line for a store that stopped answering: the node hosting it is gone, and c10d with it.

    ``store_node`` is that node's rank, where known.
    """
    host = "the node hosting it" if store_node is None else f"node {store_node}, which hosted it,"
    return f"lost the rendezvous store at {where} ({first_line(error)}): {host} stopped"


def open_job_store(
    connector: Connector, host: str, port: int, role: StoreRole, timeouts: Timeouts, status: StatusLine
) -> tuple[Client, bool]:
    """Serve or reach the job's store; returns the client and whether this agent serves it.

    A port this host cannot bind means another agent here serves the store, so this one
    reaches it instead; not so when this host was named to serve it (:attr:`StoreRole.SERVE`).
    """
    if role is not StoreRole.REACH:
        try:
            store, _ = serve_store(host, port, timeouts.join)
        except OSError as error:
            if role is StoreRole.SERVE:
                raise UsageError(
                    f"cannot serve the rendezvous store on {host}:{port}: {error.strerror}; "
                    f"pick a free port ({flag('master_port')} or {flag('rdzv_endpoint')} "
                    "host:PORT)"
                ) from None
        else:
            return store, True
    return connect_client(connector, host, port, timeouts.join, timeouts.call, status), False


@contextlib.contextmanager
def lost_store_is_one_line(describe: Callable[[BaseException], str]) -> Iterator[None]:
    """A store that drops the connection mid-call means its host is gone: one line, not a C++ trace.

    torch raises ``DistNetworkError`` for a lost connection (reset, closed, failed send or
    receive). Every other error keeps its own type and message: a bug is not a lost node.
    """
    from torch.distributed import DistNetworkError

    try:
        yield
    except DistNetworkError as error:
        raise LaunchError(describe(error)) from None
