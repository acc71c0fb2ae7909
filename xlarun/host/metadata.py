"""A GCE VM's metadata server: how a TPU VM learns its own slice (``--cluster tpu-vm``).

Usage::

    texts = instance_attributes(["agent-worker-number", "tpu-env"], environ)   # {"agent-worker-number": "1", ...}

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
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
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


_Addresses = Sequence[tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]]


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
    import http.client

    request = (
        f"GET {ATTRIBUTES_PATH}{key} HTTP/1.1\r\nHost: {host}\r\nMetadata-Flavor: Google\r\nConnection: close\r\n\r\n"
    ).encode()
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
    return body.decode(errors="backslashreplace")


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
