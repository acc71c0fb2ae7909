"""A GCE VM's metadata server: how a TPU VM learns its own slice (``--cluster tpu-vm``), and how any VM
hears that it is about to stop (a preemption, host maintenance).

Usage::

    texts = instance_attributes(["agent-worker-number", "tpu-env"], environ)   # {"agent-worker-number": "1", ...}
    notices = Notices(environ)          # a daemon thread long-polls each of NOTICE_KEYS
    selector.register(notices.fd, selectors.EVENT_READ)
    notices.read()                      # [Notice("preempted", "TRUE", ...)], as they came
    notices.close()

Every TPU VM of a slice serves its worker number (``agent-worker-number``), the slice's hosts in
worker order (``worker-network-endpoints``, ``<name>:<uid>:<ip>`` each) and its shape
(``tpu-env``), the attributes torch_xla itself reads (``torch_xla/_internal/tpu.py``) and the
README's old pod recipe fetched with curl. Requests carry ``Metadata-Flavor: Google`` and go to
``metadata.google.internal``, or to ``GCE_METADATA_HOST`` (``host[:port]``) where set, as Google's
own clients (google-auth) let it point elsewhere: the tests serve a stub on 127.0.0.1.

The server is trusted for nothing: one deadline (:data:`DEADLINE_S`) covers the whole exchange,
the lookup of its name included (once, for every attribute), however slowly the resolver or the
server answers; an answer larger than :data:`MAX_ANSWER_BYTES` is refused as it comes; a
redirect is an answer like any other that is not 200 (never followed), and no proxy is used (the
server is link-local). The caller checks every value it is given. The text of an answer that is
not UTF-8 keeps its odd bytes as ``\\xff`` escapes, so that it can be shown.

:class:`Notices` watches ``instance/preempted`` and ``instance/maintenance-event`` without polling in a
loop: a first request reads each value and its ``ETag``, then a long poll (``?wait_for_change=true``,
with ``last_etag`` so that no change between two polls is missed, and ``timeout_sec``) waits for the
next change, under the same rules, its deadline :data:`LONG_POLL_S` longer. A server that fails, or
answers a long poll at once with nothing new, is asked again after a pause that doubles up to
:data:`MAX_PAUSE_S`. The threads are daemons that only write to a pipe: whatever the server does, the
run never waits for them.
"""

from __future__ import annotations

import io
import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence

from xlarun.host.devices import METADATA_HOST_VARIABLE
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any, TypeAlias

DEFAULT_METADATA_HOST = "metadata.google.internal"
INSTANCE_PATH = "/computeMetadata/v1/instance/"
ATTRIBUTES_PATH = INSTANCE_PATH + "attributes/"
DEADLINE_S = 5.0
"""For the whole exchange, the name's lookup included: the server answers within milliseconds on a VM; off
GCE its name does not resolve, or the lookup waits for a name server that does not answer."""
MAX_ANSWER_BYTES = 1 << 20
"""One answer, headers included: the largest attribute, a big slice's endpoints, is tens of kilobytes."""


class MetadataError(Exception):
    """An attribute the metadata server did not give, with the reason in one line."""


def metadata_host(environ: Mapping[str, str]) -> str:
    return environ.get(METADATA_HOST_VARIABLE) or DEFAULT_METADATA_HOST


def instance_attributes(
    keys: Sequence[str], environ: Mapping[str, str], deadline_s: float = DEADLINE_S
) -> dict[str, str]:
    """The text of each instance attribute of ``keys``, all within ``deadline_s``; raises
    :class:`MetadataError` where one cannot be had."""
    deadline = time.monotonic() + deadline_s
    host = metadata_host(environ)
    hostname, port = _hostname_and_port(host)
    try:
        addresses = _look_up(hostname, port, deadline)
    except TimeoutError:
        raise MetadataError(f"the metadata server's name {hostname} did not resolve within {deadline_s:g} s") from None
    except OSError as error:
        raise MetadataError(
            f"the metadata server's name {hostname} does not resolve ({error.strerror or type(error).__name__})"
        ) from None
    return {key: _attribute(host, addresses, key, deadline, deadline_s) for key in keys}


def _hostname_and_port(host: str) -> tuple[str, int]:
    """``host``'s name and port (80 where it names none), or :class:`MetadataError` where it is not
    ``host[:port]`` (a name that cannot be looked up, such as one with an empty label, included)."""
    from urllib.parse import urlsplit

    try:
        if not host.isprintable() or any(character.isspace() for character in host):
            raise ValueError
        address = urlsplit(f"http://{host}")
        hostname, port = address.hostname, address.port or 80
        if not hostname:
            raise ValueError
        hostname.encode("idna")  # as getaddrinfo encodes it
    except (ValueError, UnicodeError):
        raise MetadataError(f"{METADATA_HOST_VARIABLE}={host!r} is not host[:port]") from None
    return hostname, port


_Addresses: TypeAlias = "Sequence[tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]]"


def _look_up(hostname: str, port: int, deadline: float) -> _Addresses:
    """``hostname``'s addresses, or :class:`TimeoutError` at ``deadline``. getaddrinfo takes no timeout,
    and a resolver whose name server does not answer waits its own timeout (5 s by default) for every
    attempt at every server, so the lookup runs in a daemon thread that is left behind at the deadline."""
    outcome: list[_Addresses | OSError] = []
    looked_up = threading.Event()

    def look_up() -> None:
        try:
            outcome.append(socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM))
        except OSError as error:
            outcome.append(error)
        looked_up.set()

    threading.Thread(target=look_up, name="metadata-lookup", daemon=True).start()
    if not looked_up.wait(_left(deadline)):
        raise TimeoutError
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return outcome[0]


def _attribute(host: str, addresses: _Addresses, key: str, deadline: float, deadline_s: float) -> str:
    return _get(host, addresses, ATTRIBUTES_PATH + key, key, deadline, deadline_s)[0]


def _get(host: str, addresses: _Addresses, path: str, key: str, deadline: float, deadline_s: float) -> tuple[str, str]:
    """The text of the answer to a GET of ``path`` (``key`` names it in errors), and its ``ETag`` ("" where none)."""
    import http.client

    request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nMetadata-Flavor: Google\r\nConnection: close\r\n\r\n").encode()
    try:
        answer = _exchange(addresses, request, deadline)
        response = http.client.HTTPResponse(_Received(answer))  # type: ignore[arg-type]
        response.begin()
        body = response.read()
    except TimeoutError:
        raise MetadataError(f"the metadata server at {host} did not answer {key} within {deadline_s:g} s") from None
    except _TooLarge:
        raise MetadataError(
            f"the metadata server at {host} sent more than {MAX_ANSWER_BYTES >> 20} MiB for {key}"
        ) from None
    except http.client.HTTPException as error:
        raise MetadataError(
            f"the metadata server at {host} sent no HTTP answer for {key} ({type(error).__name__})"
        ) from None
    except OSError as error:
        raise MetadataError(
            f"cannot reach the metadata server at {host} for {key}: {error.strerror or type(error).__name__}"
        ) from None
    if response.status != 200:
        raise MetadataError(f"the metadata server at {host} answered {response.status} for {key}")
    return body.decode(errors="backslashreplace"), response.getheader("ETag", "")


class _TooLarge(Exception):
    pass


def _exchange(addresses: _Addresses, request: bytes, deadline: float) -> bytes:
    """Send ``request`` and read the answer to its end (the server closes), all before ``deadline``."""
    with _connect(addresses, deadline) as connection:
        connection.sendall(request)
        answer = bytearray()
        while True:
            connection.settimeout(_left(deadline))
            chunk = connection.recv(65536)
            if not chunk:
                return bytes(answer)
            answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                raise _TooLarge


def _connect(addresses: _Addresses, deadline: float) -> socket.socket:
    """A connection to the first of ``addresses`` that takes one before ``deadline``, else the last one's
    error, as :func:`socket.create_connection` tries a name's addresses (getaddrinfo gives at least one)."""
    for family, kind, protocol, _, address in addresses:
        connection = socket.socket(family, kind, protocol)
        try:
            connection.settimeout(_left(deadline))
            connection.connect(address)
            return connection
        except OSError as error:
            connection.close()
            failed = error
    raise failed


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


class _Received:
    """A whole answer as :class:`http.client.HTTPResponse` reads one, from a socket's file."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self._answer)


class Notice(Struct, frozen=True):
    """A value of an instance key that announces what happens to the VM."""

    key: str
    value: str
    stops: bool
    """The VM stops (its processes get SIGTERM): not so for a live migration."""
    meaning: str


NOTICES = (
    Notice("preempted", "TRUE", True, "this VM is preempted and stops in about 30 s"),
    Notice(
        "maintenance-event",
        "TERMINATE_ON_HOST_MAINTENANCE",
        True,
        "this VM stops for host maintenance in about 60 s",
    ),
    Notice(
        "maintenance-event",
        "MIGRATE_ON_HOST_MAINTENANCE",
        False,
        "this VM is live-migrated for host maintenance in about 60 s; the run goes on",
    ),
)
"""Google's values: ``instance/preempted`` is ``TRUE`` or ``FALSE``; ``instance/maintenance-event`` ``NONE``
or one of these, set 60 s before the maintenance. Any other value announces nothing."""
NOTICE_KEYS = tuple(dict.fromkeys(notice.key for notice in NOTICES))
LONG_POLL_S = 300
"""How long the server may hold one long poll (``timeout_sec``): a quiet VM costs one request per key this often."""
MAX_PAUSE_S = 60.0
"""The longest pause before a server that failed, or did not wait, is asked again."""
_ETAG = r"[0-9A-Za-z]{1,128}"
"""An ``ETag`` sent back as ``last_etag``: the server's are hex digits; anything else is not sent back."""


class Notices:
    """The metadata server's notices (:data:`NOTICES`) as they come: see the module docstring. Each key is
    watched by a daemon thread of its own; each new notice is one byte on a pipe that an event loop reads
    (:attr:`fd`, :meth:`read`)."""

    def __init__(self, environ: Mapping[str, str], keys: Sequence[str] = NOTICE_KEYS):
        self._host = metadata_host(environ)
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # A thread may hand a notice as the pipe closes: its descriptor numbers may by then belong to
        # another file, so closing and writing exclude each other.
        self._lock = threading.Lock()
        self._closed = threading.Event()
        for key in keys:
            threading.Thread(target=self._watch, args=(key,), name=f"xlarun-metadata-{key}", daemon=True).start()

    def read(self) -> list[Notice]:
        """The notices that came since the last call, oldest first."""
        try:
            data = os.read(self.fd, 256)
        except BlockingIOError:
            return []
        return [NOTICES[index] for index in data if index < len(NOTICES)]

    def close(self) -> None:
        """No notice comes after this; a thread still waiting on the server ends once it answers or its
        deadline passes."""
        self._closed.set()
        with self._lock:
            if self._write_fd >= 0:
                os.close(self.fd)
                os.close(self._write_fd)
                self._write_fd = -1

    def _watch(self, key: str) -> None:
        try:
            hostname, port = _hostname_and_port(self._host)
        except MetadataError:
            return  # GCE_METADATA_HOST names no server: nothing to watch
        addresses: _Addresses | None = None
        seen: str | None = None
        etag = ""
        pause = 0.0
        while not self._closed.wait(pause):
            began = time.monotonic()
            query = ""
            if seen is not None:
                query = f"?wait_for_change=true&timeout_sec={LONG_POLL_S}" + (f"&last_etag={etag}" if etag else "")
            budget = DEADLINE_S + (LONG_POLL_S if query else 0)
            try:
                if addresses is None:
                    addresses = _look_up(hostname, port, began + DEADLINE_S)
                value, tag = _get(self._host, addresses, INSTANCE_PATH + key + query, key, began + budget, budget)
            except (MetadataError, OSError):  # OSError: the name's lookup (TimeoutError included)
                addresses = None
                pause = _longer(pause)
                continue
            value = value.strip()
            changed, seen = value != seen, value
            etag = tag if re.fullmatch(_ETAG, tag) else ""
            if changed:
                self._hand(key, value)
            # A long poll answered at once with nothing new: the server does not wait, so it is asked later.
            pause = 0.0 if changed or time.monotonic() - began >= 1.0 else _longer(pause)

    def _hand(self, key: str, value: str) -> None:
        for index, notice in enumerate(NOTICES):
            if (notice.key, notice.value) == (key, value):
                with self._lock:
                    if self._write_fd >= 0:
                        try:
                            os.write(self._write_fd, bytes([index]))
                        except BlockingIOError:
                            pass  # a pipe full of unread notices: one more says nothing new


def _longer(pause: float) -> float:
    return min(MAX_PAUSE_S, max(1.0, pause * 2))
