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
however slowly it sends; an answer larger than :data:`MAX_ANSWER_BYTES` is refused as it comes; a
redirect is an answer like any other that is not 200 (never followed), and no proxy is used (the
server is link-local). The caller checks every value it is given. The text of an answer that is
not UTF-8 keeps its odd bytes as ``\\xff`` escapes, so that it can be shown.
"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Mapping, Sequence

METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
DEADLINE_S = 5.0
"""For the whole exchange: the server answers within milliseconds on a VM; off GCE its name does not resolve."""
MAX_ANSWER_BYTES = 1 << 20
"""One answer, headers included: the largest attribute, a big slice's endpoints, is tens of kilobytes."""


class MetadataError(Exception):
    """An attribute the metadata server did not give, with the reason in one line."""


def metadata_host(environ: Mapping[str, str]) -> str:
    return environ.get(METADATA_HOST_VARIABLE) or DEFAULT_METADATA_HOST


def instance_attributes(keys: Sequence[str], environ: Mapping[str, str],
                        deadline_s: float = DEADLINE_S) -> dict[str, str]:
    """The text of each instance attribute of ``keys``, all within ``deadline_s``; raises
    :class:`MetadataError` where one cannot be had."""
    deadline = time.monotonic() + deadline_s
    host = metadata_host(environ)
    if not host.isprintable() or any(character.isspace() for character in host):
        raise MetadataError(f"{METADATA_HOST_VARIABLE}={host!r} is not host[:port]")
    return {key: _attribute(host, key, deadline, deadline_s) for key in keys}


def _attribute(host: str, key: str, deadline: float, deadline_s: float) -> str:
    import http.client
    from urllib.parse import urlsplit

    try:
        address = urlsplit(f"http://{host}")
        hostname, port = address.hostname, address.port or 80
    except ValueError:
        hostname = None
    if not hostname:
        raise MetadataError(f"{METADATA_HOST_VARIABLE}={host!r} is not host[:port]")
    request = (f"GET {ATTRIBUTES_PATH}{key} HTTP/1.1\r\nHost: {host}\r\nMetadata-Flavor: Google\r\n"
               "Connection: close\r\n\r\n").encode()
    try:
        answer = _exchange((hostname, port), request, deadline)
        response = http.client.HTTPResponse(_Received(answer))  # type: ignore[arg-type]
        response.begin()
        body = response.read()
    except TimeoutError:
        raise MetadataError(f"the metadata server at {host} did not answer {key} within {deadline_s:g} s") from None
    except _TooLarge:
        raise MetadataError(f"the metadata server at {host} sent more than {MAX_ANSWER_BYTES >> 20} MiB for {key}"
                            ) from None
    except http.client.HTTPException as error:
        raise MetadataError(f"the metadata server at {host} sent no HTTP answer for {key} "
                            f"({type(error).__name__})") from None
    except OSError as error:
        raise MetadataError(f"cannot reach the metadata server at {host} for {key}: "
                            f"{error.strerror or type(error).__name__}") from None
    if response.status != 200:
        raise MetadataError(f"the metadata server at {host} answered {response.status} for {key}")
    return body.decode(errors="backslashreplace")


class _TooLarge(Exception):
    pass


def _exchange(address: tuple[str, int], request: bytes, deadline: float) -> bytes:
    """Send ``request`` and read the answer to its end (the server closes), all before ``deadline``."""
    with socket.create_connection(address, timeout=_left(deadline)) as connection:
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
