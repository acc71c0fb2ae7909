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
import hashlib
import socket
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, cast

from xlarun.config import TORCH_TRUE_WORDS
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import flag

DEFAULT_JOIN_TIMEOUT = 600.0
DEFAULT_HEARTBEAT_TIMEOUT = 5.0
DEFAULT_CLOSE_TIMEOUT = 30.0
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
    return cast(Client, TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout),
                                 wait_for_workers=False))


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
        store = TCPStore(host, bound_port, None, True, datetime.timedelta(seconds=timeout), wait_for_workers=False,
                         multi_tenant=True, master_listen_fd=server.fileno())
    except DistNetworkError as error:
        raise LaunchError(f"cannot serve a store on {host}:{bound_port}: {first_line(error)}") from None
    server.detach()
    return store, bound_port


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


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
    """A boolean ``--rdzv_conf`` key, already checked by :func:`xlarun.config.check_rdzv_conf`."""
    text = conf.get(key)
    return None if text is None else text.lower() in TORCH_TRUE_WORDS


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def beat_interval(heartbeat_timeout: float) -> float:
    """How often an agent beats and the monitor looks: a tenth of the timeout, at most a second.

    A node is noticed at most two intervals after the timeout (its last beat may have just
    been read), so within ``heartbeat_timeout`` + 1 s at the default 5 s.
    """
    return min(1.0, heartbeat_timeout / 10)


class JobKeys:
    """The names of the agents' keys for one run: ``xlarun/<run_id>/...``.

    Two keys are shared by every run on a store: ``xlarun/job`` (the run id and token
    digest of the agent serving it) and ``xlarun/refused`` (agents turned away).
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


def is_timeout(error: BaseException) -> bool:
    """A ``wait`` that ran out of time (the connection is still good), as opposed to a lost store."""
    from torch.distributed import DistStoreError

    return isinstance(error, DistStoreError)


def wait_for_key(client: Client, key: str, deadline: Optional[float],
                 status: Optional[Callable[[], None]] = None) -> bool:
    """Block until ``key`` exists; False at ``deadline`` (monotonic seconds; ``None``: no deadline).

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
            client.wait([key], datetime.timedelta(seconds=remaining))
            return True
        except Exception as error:
            if not is_timeout(error):
                raise


def connect_client(connector: Connector, host: str, port: int, timeout: float, call_timeout: float,
                   status: StatusLine) -> Client:
    """Reach the store at ``host:port``, retrying until ``timeout`` (its host may start later)."""
    from torch.distributed import DistNetworkError

    started = time.monotonic()
    while True:
        try:
            return connector(host, port, call_timeout)
        except DistNetworkError as error:  # refused, timed out, unresolvable host, not a store
            if time.monotonic() - started >= timeout:
                raise LaunchError(f"cannot reach the rendezvous store at {host}:{port} after {timeout:.0f} s "
                                  f"({first_line(error)}): is node 0's agent running, and is the address "
                                  "reachable from this node?") from None
            status.update(f"reaching the rendezvous store at {host}:{port} ({time.monotonic() - started:.0f} s)")
            time.sleep(STATUS_INTERVAL)


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
