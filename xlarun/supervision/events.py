"""The launch's events, as they happen, handed to sinks that never hold the launcher up.

Usage::

    bus = EventBus([JsonLinesSink(...)], run_id=config.rdzv_id, trace_id=trace_id_of(environ))
    bus.emit("worker.started", attempt, rank=0, local_rank=0, **{"process.pid": 4711})
    bus.identify(run_id=node.run_id, node_rank=node.node_rank)   # once the rendezvous says who this node is
    bus.close(deadline_s=2.0)                                    # at exit: flush what can be flushed
    bus.dropped                                                  # events some sink never took

The names are fixed (:data:`EVENT_NAMES`); attribute names follow OpenTelemetry where it has
one (``process.pid``, ``process.exit.code``, ``error.type``). Every sink gets every event on a
thread of its own, through a bounded queue: :meth:`EventBus.emit` never blocks and never raises,
whatever a sink does (a full disk, a FIFO nobody reads, a closed pipe). An event a sink's queue
has no room for, or that its :meth:`Sink.handle` raised on, is dropped for that sink and counted.

Without a sink (:data:`NO_EVENTS`) the bus starts no thread and emitting is one attribute test.
Attributes carry launch facts only, never an environment value, so no secret reaches a sink.
"""

from __future__ import annotations

import queue
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping

from xlarun.console import say
from xlarun.structs import Struct, field

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # the protocols below only type; at run time they are plain classes

SCHEMA_VERSION = 1
"""The event record's version: raised when a field changes meaning or goes away (adding one does not)."""

EVENT_NAMES = (
    "launch.started",  # nnodes, nproc_per_node, device, runtime, compile_cache
    "preflight.refused",  # reason
    "rendezvous.started",  # round
    "rendezvous.completed",  # round, members, duration_s
    "worker.started",  # rank, local_rank, process.pid
    "worker.exited",  # rank, local_rank, process.pid, process.exit.code, signal, expected,
    # peak_rss_mib, cpu_s, error.type
    "node.lost",  # node_rank, host, reason
    "restart",  # restarts_left
    "hang.suspected",  # reason
    "hang.stacks",  # stacks_files: {rank: path}
    "oom.killed",  # rank, peak_rss_mib
    "preemption",  # notice, value, stops, signal
    "launch.finished",  # process.exit.code, result, root_cause, compile_cache
)

QUEUE_SIZE = 1024
"""Events one sink may have waiting; past that, what comes is dropped (and counted) rather than queued."""

_TRACEPARENT = r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}"


def trace_id_of(environ: Mapping[str, str]) -> str | None:
    """The trace id of W3C ``TRACEPARENT`` (OpenTelemetry's environment carrier), or None where it is
    absent, malformed or all zeros (invalid by the W3C spec)."""
    match = re.match(_TRACEPARENT, environ.get("TRACEPARENT", "").strip())
    if match is None or match.group(1) == "0" * 32:
        return None
    return match.group(1)


class Event(Struct, frozen=True):
    """One thing that happened in the launch, with the launch's identity at that moment."""

    name: str
    time: float
    """``time.time()`` when it happened."""
    seq: int
    """1, 2, 3... in the order the launcher emitted them."""
    attempt: int
    attributes: Mapping[str, object]
    """JSON-ready values only."""
    run_id: str
    node_rank: int | None
    """None until the rendezvous assigned this node a rank (elastic launches)."""
    host: str
    trace_id: str | None = None
    """The trace id of ``TRACEPARENT`` in the launcher's environment, if any."""


class Sink(Protocol):
    """Where events go. Both methods are called on the sink's own thread; they may block or raise."""

    def handle(self, event: Event) -> None: ...

    def close(self) -> None: ...


_CLOSE = object()
"""What tells a sink's thread that no event comes after it."""


class _Lane(Struct):
    """One sink with its queue, its thread and what it dropped."""

    sink: Sink
    events: queue.Queue[object] = field(default_factory=lambda: queue.Queue(QUEUE_SIZE))
    dropped: int = 0
    last_error: str = ""
    busy: bool = False
    """Whether the sink is handling an event now."""
    thread: threading.Thread | None = None

    def offer(self, item: object) -> bool:
        try:
            self.events.put_nowait(item)
        except queue.Full:
            return False
        return True

    def run(self) -> None:
        while True:
            item = self.events.get()
            if item is _CLOSE:
                break
            self.busy = True
            try:
                self.sink.handle(item)  # type: ignore[arg-type]
            except Exception as error:  # a sink's fault costs its event, never the launch
                self.dropped += 1
                self.last_error = _reason(error)
            self.busy = False
        try:
            self.sink.close()
        except Exception as error:
            self.last_error = _reason(error)


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


class EventBus:
    """Emits events to every sink; see the module docstring."""

    def __init__(
        self,
        sinks: Iterable[Sink],
        *,
        run_id: str = "",
        node_rank: int | None = None,
        host: str | None = None,
        trace_id: str | None = None,
    ):
        self._lanes = [_Lane(sink) for sink in sinks]
        self.run_id = run_id
        self.node_rank = node_rank
        self.host = host if host is not None or not self._lanes else socket.gethostname()
        self.trace_id = trace_id
        self._seq = 0
        self._lock = threading.Lock()
        self._closed = False
        for index, lane in enumerate(self._lanes):
            lane.thread = threading.Thread(target=lane.run, name=f"xlarun-events-{index}", daemon=True)
            lane.thread.start()

    @property
    def active(self) -> bool:
        """Whether any sink listens: callers skip gathering what only an event would carry."""
        return bool(self._lanes)

    @property
    def dropped(self) -> int:
        """Events some sink never took, summed over the sinks (one event two sinks lost counts twice)."""
        return sum(lane.dropped for lane in self._lanes)

    def drops(self) -> list[tuple[Sink, int, str]]:
        """Each sink that dropped events: the sink, how many, and the last error it gave (or "")."""
        return [(lane.sink, lane.dropped, lane.last_error) for lane in self._lanes if lane.dropped]

    def identify(self, *, run_id: str | None = None, node_rank: int | None = None) -> None:
        """What the rendezvous told this node: the events from now on carry it."""
        if run_id is not None:
            self.run_id = run_id
        if node_rank is not None:
            self.node_rank = node_rank

    def emit(self, name: str, attempt: int, **attributes: object) -> None:
        """Hand one event to every sink; never blocks, never raises."""
        if not self._lanes:
            return
        with self._lock:
            if self._closed:
                return
            self._seq += 1
            event = Event(
                name=name,
                time=time.time(),
                seq=self._seq,
                attempt=attempt,
                attributes=attributes,
                run_id=self.run_id,
                node_rank=self.node_rank,
                host=self.host or "",
                trace_id=self.trace_id,
            )
            for lane in self._lanes:
                try:
                    lane.events.put_nowait(event)
                except queue.Full:
                    lane.dropped += 1
                    lane.last_error = "its queue was full"

    def close(self, deadline_s: float) -> None:
        """Let each sink take what is queued and close, for at most ``deadline_s`` in all; what is
        still queued then is counted as dropped, and the sink's thread is left behind (a daemon).
        Each sink that dropped events says so in one line (:func:`describe`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        end = time.monotonic() + deadline_s
        # The close marker waits for a place in each queue; at the deadline a stuck sink's oldest event makes it.
        waiting = [lane for lane in self._lanes if not lane.offer(_CLOSE)]
        while waiting and time.monotonic() < end:
            time.sleep(0.01)
            waiting = [lane for lane in waiting if not lane.offer(_CLOSE)]
        for lane in waiting:
            while not lane.offer(_CLOSE):
                try:
                    lane.events.get_nowait()
                    lane.dropped += 1
                except queue.Empty:
                    pass
        for lane in self._lanes:
            assert lane.thread is not None
            lane.thread.join(max(0.0, end - time.monotonic()))
            if lane.thread.is_alive():
                with lane.events.mutex:
                    queued = sum(1 for item in lane.events.queue if item is not _CLOSE)
                lane.dropped += queued + lane.busy
                lane.last_error = lane.last_error or f"it took more than {deadline_s:g} s"
        for sink, count, why in self.drops():
            say(f"{describe(sink)}: {count} event{'s' if count != 1 else ''} dropped ({why})")


def describe(sink: Sink) -> str:
    """How the drop line names a sink: its ``str`` where it has one of its own, else its class's name."""
    return str(sink) if type(sink).__str__ is not object.__str__ else f"the event sink {type(sink).__name__}"


NO_EVENTS = EventBus(())
"""The bus of a launch without sinks: emitting costs one test, and no thread is started."""
