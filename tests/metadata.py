"""A stand-in for a TPU VM's metadata server, on 127.0.0.1 in a thread of the test.

- ``serve_metadata(attributes)``: serves ``attributes`` (name to text) at
  ``/computeMetadata/v1/instance/attributes/<name>`` to requests that carry
  ``Metadata-Flavor: Google`` (others get 403, as the real server answers them; an unknown name
  404), and yields the value of ``GCE_METADATA_HOST`` that points a launcher at it. The requests
  it answered are in its ``requests`` list. ``behaviour`` makes it a broken server instead:
  ``"drip"`` sends its answer one byte every ``DRIP_INTERVAL_S``, ``"endless"`` an answer whose
  body never ends, as fast as it is read, ``"redirect"`` a 302 to ``REDIRECT_TARGET`` on itself.
  It also serves the instance's ``preempted`` (``FALSE``) and ``maintenance-event`` (``NONE``) at
  ``/computeMetadata/v1/instance/<name>``, each with an ``ETag``, long polls included
  (``?wait_for_change=true``, ``last_etag``, ``timeout_sec``) as Compute Engine's server answers them:
  ``served.instance.change(name, value)`` changes one and answers the polls waiting on it at once;
  ``"impatient"`` answers a long poll at once, changed or not.
- ``slice_attributes(worker, ips, tpu_env)``: the three attributes of one VM of a slice.
- ``V4_16_TPU_ENV``: the ``tpu-env`` of a v4-16 (two hosts of 2x2x1 chips), in the metadata's format.
- ``hanging_lookup(directory)``: a real name lookup that never ends, for a metadata server whose name
  does not resolve in time: it yields ``HOSTALIASES``, under which glibc's resolver, asked for the
  single-label ``HANGING_NAME``, waits on a FIFO that nobody writes before it asks any DNS server; on
  leaving, the FIFO ends and so does every lookup still waiting on it. It skips the test where the
  resolver does not read ``HOSTALIASES`` (not glibc, or a hosts source other than ``dns`` answers first).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal, NamedTuple
from urllib.parse import parse_qs, urlsplit

import pytest

INSTANCE_PREFIX = "/computeMetadata/v1/instance/"
PREFIX = INSTANCE_PREFIX + "attributes/"
DRIP_INTERVAL_S = 4.0
REDIRECT_TARGET = "/elsewhere"
HANGING_NAME = "xlarun-metadata"
PROBE_S = 5.0
"""How long the probe lookup may take to open the FIFO before the resolver is taken not to read it."""
Behaviour = Literal["answer", "drip", "endless", "redirect", "impatient"]

V4_16_TPU_ENV = """ACCELERATOR_TYPE: 'v4-16'
CHIPS_PER_HOST_BOUNDS: '2,2,1'
HOST_BOUNDS: '1,1,2'
TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'
TPU_PROCESS_BOUNDS: '1,1,2'
WORKER_ID: '{worker}'
ZONE: 'us-central2-b'
"""


class InstanceValues:
    """The instance's values the server long-polls, each with its ETag (its version's number)."""

    def __init__(self, closing: threading.Event, waits: bool = True) -> None:
        self._waits = waits
        self._values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self._versions = dict.fromkeys(self._values, 1)
        self._changed = threading.Condition()
        self._closing = closing

    def change(self, name: str, value: str) -> None:
        with self._changed:
            self._values[name] = value
            self._versions[name] += 1
            self._changed.notify_all()

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def answer(self, name: str, query: Mapping[str, list[str]]) -> tuple[str, str] | None:
        """The value and ETag to answer with, once the long poll may end; None for a name not served."""
        if name not in self._values:
            return None
        with self._changed:
            seen = self._versions[name]
            if self._waits and query.get("wait_for_change") == ["true"]:
                last = query.get("last_etag", [str(seen)])[0]
                deadline = time.monotonic() + float(query.get("timeout_sec", ["3600"])[0])
                while str(self._versions[name]) == last and not self._closing.is_set():
                    if not self._changed.wait(max(0.0, deadline - time.monotonic())):
                        break
            return self._values[name], str(self._versions[name])


class Served(NamedTuple):
    host: str
    """``GCE_METADATA_HOST``: ``127.0.0.1:<port>``."""
    requests: list[tuple[str, str | None]]
    """(path, Metadata-Flavor header) of every request answered."""
    instance: InstanceValues


def slice_attributes(worker: int, ips: list[str], tpu_env: str = V4_16_TPU_ENV) -> dict[str, str]:
    """What VM ``worker`` of a slice whose hosts have addresses ``ips`` serves."""
    endpoints = ",".join(f"unknown:unknown:{ip}" for ip in ips)
    return {
        "agent-worker-number": str(worker),
        "worker-network-endpoints": endpoints,
        "tpu-env": tpu_env.format(worker=worker),
    }


@contextmanager
def serve_metadata(attributes: Mapping[str, str], behaviour: Behaviour = "answer") -> Iterator[Served]:
    requests: list[tuple[str, str | None]] = []
    closing = threading.Event()
    instance = InstanceValues(closing, waits=behaviour != "impatient")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            flavor = self.headers.get("Metadata-Flavor")
            requests.append((self.path, flavor))
            name = self.path.removeprefix(PREFIX) if self.path.startswith(PREFIX) else None
            if behaviour in ("drip", "endless"):
                try:
                    self.misbehave()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should
            elif behaviour == "redirect" and self.path != REDIRECT_TARGET:
                self.send_response(302)
                self.send_header("Location", REDIRECT_TARGET)
                self.end_headers()
            elif flavor != "Google":
                self.send_error(403, "Missing Metadata-Flavor:Google header")
            elif name is None and self.path.startswith(INSTANCE_PREFIX):
                self.answer_instance()
            elif name is None or name not in attributes:
                self.send_error(404)
            else:
                body = attributes[name].encode(errors="surrogateescape")  # "\udcff": the byte 0xff
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def answer_instance(self) -> None:
            address = urlsplit(self.path)
            answer = instance.answer(address.path.removeprefix(INSTANCE_PREFIX), parse_qs(address.query))
            if answer is None:
                self.send_error(404)
                return
            body = answer[0].encode()
            self.send_response(200)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("ETag", answer[1])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a poll the launcher gave up on as it ended

        def misbehave(self) -> None:
            if behaviour == "drip":
                answer = b"HTTP/1.0 200 OK\r\nMetadata-Flavor: Google\r\nContent-Length: 1\r\n\r\n0"
                for byte in answer:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    if closing.wait(DRIP_INTERVAL_S):
                        return
            else:
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.end_headers()
                while not closing.is_set():
                    self.wfile.write(b"0" * 65536)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # A short poll: shutting the server down waits for one.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Served(f"127.0.0.1:{server.server_address[1]}", requests, instance)
    finally:
        closing.set()
        instance.wake()
        server.shutdown()
        server.server_close()


@contextmanager
def hanging_lookup(directory: Path) -> Iterator[str]:
    aliases = directory / "host.aliases"
    os.mkfifo(aliases)
    # Held for reading and writing, so that a resolver's open returns and its read waits for data.
    held = os.open(aliases, os.O_RDWR)
    try:
        _skip_unless_the_resolver_reads(aliases)
        yield str(aliases)
    finally:
        os.close(held)


def _skip_unless_the_resolver_reads(aliases: Path) -> None:
    """Look ``HANGING_NAME`` up in a thread of this process, and skip unless it opens ``aliases``
    (which this process holds open once already)."""
    looked_up = threading.Event()

    def look_up() -> None:
        try:
            socket.getaddrinfo(HANGING_NAME, 80)
        except OSError:
            pass
        looked_up.set()

    def opened() -> int:
        return sum(
            os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(aliases) for fd in os.listdir("/proc/self/fd")
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOSTALIASES", str(aliases))
        threading.Thread(target=look_up, daemon=True).start()
        probe_deadline = time.monotonic() + PROBE_S
        while not looked_up.wait(0.01) and time.monotonic() < probe_deadline:
            if opened() > 1:
                return
    pytest.skip("this resolver does not read HOSTALIASES, so no name lookup can be made to hang")
