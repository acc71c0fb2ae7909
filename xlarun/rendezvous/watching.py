"""Watching the job while workers run: heartbeats, the news of an attempt's end, and the monitor.

The work per node is constant whatever the number of nodes:

- every agent bumps its own heartbeat key once per :attr:`~xlarun.rendezvous.store.Timeouts.beat_interval`;
- every agent blocks on one key per attempt, ``attempt_<n>/end``, which the server answers
  the moment anyone writes it: the first failure, a node lost or gone, the last node done,
  or the monitor's call to admit waiting nodes. The first writer wins (``compare_set``);
- one monitor, in the agent that serves the store, reads every heartbeat of the attempt's
  nodes in one ``multi_get`` per interval and writes the end key when a node falls silent.
  Its cost grows with the nodes (O(N) per interval for the whole job); nobody else's does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from xlarun.console import StatusLine
from xlarun.rendezvous import AttemptEnd, LostNode, shown
from xlarun.rendezvous.joining import Roster, read_roster
from xlarun.rendezvous.store import STATUS_INTERVAL, Client, JobKeys, read_count, wait_for_key
from xlarun.structs import Struct

DONE = "done"
HUNG = "hung"
LEFT = "left"
# The heartbeat value an agent leaves behind when it leaves on purpose.
LEFT_BEAT = b"left"
# How often the monitor asks torch's rendezvous whether nodes wait to join (a read of its whole state).
ADMISSION_INTERVAL = 1.0
# A timed wait of this process that overran by more than this many seconds: the process itself
# did not run (SIGSTOP, Ctrl-Z, a suspended host), and that time is no other party's silence.
STALL = 1.0
# What an end record may say, besides ``done``.
KINDS = ("failure", "lost", LEFT, "stopped", HUNG, "admit")


class News(Struct, frozen=True):
    """What ended an attempt, as written once to its end key and read alike by every node."""

    kind: str
    """``done``, ``failure``, ``lost`` (silent), ``left``, ``stopped`` (workers stopped for
    another reason), ``hung`` (a node found the job hung) or ``admit`` (nodes wait to join)."""
    reason: str = ""

    def encode(self) -> str:
        return DONE if self.kind == DONE else json.dumps({"kind": self.kind, "reason": self.reason})

    @classmethod
    def decode(cls, raw: bytes) -> News:
        """The end as written; one that xlarun did not write (the store is anyone's to write to) stops
        the attempt, and says so. Its reason comes back escaped (:func:`~xlarun.rendezvous.shown`)."""
        if raw == DONE.encode():
            return cls(DONE)
        try:
            fields = json.loads(raw)
            kind, reason = fields["kind"], fields["reason"]
        except (ValueError, TypeError, KeyError):
            kind = reason = None
        if kind not in KINDS or not isinstance(reason, str):
            return cls("stopped", f"the attempt's end record in the store is not one xlarun writes: {shown(raw)}")
        return cls(kind, shown(reason, 1000))

    def end(self, lost_node: LostNode | None = None) -> AttemptEnd:
        return AttemptEnd(
            succeeded=self.kind == DONE,
            lost=self.reason if self.kind in ("lost", LEFT) else None,
            admitting=self.kind == "admit",
            lost_node=lost_node,
        )


def announce(client: Client, keys: JobKeys, attempt: int, news: News) -> None:
    """Write ``news`` as the attempt's end unless something already ended it."""
    client.compare_set(keys.attempt(attempt, "end"), "", news.encode())


def settle(client: Client, keys: JobKeys, attempt: int, node_rank: int, how: str) -> None:
    """Say node ``node_rank`` of ``attempt`` settled: ``finished`` (its workers are gone), ``lost``, or
    ``accounted`` for (a node was found lost first). The first word stands.

    No counter: a TCPStore server answers ``add`` on a value that is not a number (anyone may
    write one) by closing the connection.
    """
    client.compare_set(keys.attempt(attempt, "settled", node_rank), "", how)


def lost_node(client: Client, keys: JobKeys, attempt: int, nnodes: int, deadline: float) -> LostNode | None:
    """The node found silent before ``attempt`` ended, if one was: waits until every node settled
    (one request), up to ``deadline`` (monotonic), by which a silent node has been found.

    A record xlarun did not write is ignored: the workers' own failures are the root cause then.
    """
    wait_for_key(client, [keys.attempt(attempt, "settled", rank) for rank in range(nnodes)], deadline)
    key = keys.attempt(attempt, "lost")
    if not client.check([key]):
        return None
    try:
        return LostNode.from_json(client.get(key))
    except ValueError:
        return None


class Heartbeat:
    """A thread that bumps this agent's heartbeat key every ``interval`` on a connection of its own.

    A beat that fails means the store is gone (closed, reset): ``on_lost`` hears it once and
    the beats stop. A store whose host hangs or vanishes without closing the connection
    never answers, and a TCPStore call has no deadline of its own: the process's
    :class:`Watchdog`, which makes no request, calls that lost once no beat was answered
    for ``limit`` seconds.
    """

    def __init__(
        self,
        client: Client,
        key: str,
        interval: float,
        limit: float,
        on_lost: Callable[[BaseException], None],
        watchdog: Watchdog | None = None,
    ):
        self.client = client
        self._watchdog = watchdog or WATCHDOG
        self._key = key
        self._interval = interval
        self.limit = limit
        self._on_lost = on_lost
        self.answered = time.monotonic()
        self._stopped = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="xlarun-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._watchdog.watch(self)

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self.client.add(self._key, 1)
            except Exception as error:  # any failure to beat is a store this agent cannot rely on
                self.report(error)
                return
            self.answered = time.monotonic()

    def report(self, error: BaseException) -> None:
        if not self._stopped.is_set() and not self._lost.is_set():
            self._lost.set()
            self._on_lost(error)

    def stop(self) -> None:
        """Stop beating; afterwards the connection is free for the caller (no beat is in flight),
        unless the store was reported lost: a beat may then hang for good, and is left behind."""
        self._stopped.set()
        self._watchdog.forget(self)
        if self._thread.is_alive() and not self._lost.is_set():
            self._thread.join()


class Watchdog:
    """One thread per process that reports heartbeats left unanswered past their limit.

    One for the whole process rather than one per heartbeat: the pod-scale benchmark runs
    hundreds of agents' rendezvous in one process, each a thread that must wake on time.
    """

    def __init__(self, check_interval: float = 1.0) -> None:
        self._check_interval = check_interval
        self._beats: set[Heartbeat] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, beat: Heartbeat) -> None:
        with self._lock:
            self._beats.add(beat)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="xlarun-heartbeat-watchdog", daemon=True)
                self._thread.start()

    def forget(self, beat: Heartbeat) -> None:
        with self._lock:
            self._beats.discard(beat)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(self._check_interval)
            now = time.monotonic()
            stalled, last = now - last - self._check_interval, now
            with self._lock:
                if stalled > STALL:
                    # This process did not run: no store left a beat unanswered meanwhile.
                    for beat in self._beats:
                        beat.answered = min(beat.answered + stalled, now)
                late = [beat for beat in self._beats if now - beat.answered > beat.limit]
                self._beats.difference_update(late)
            for beat in late:
                beat.report(TimeoutError(f"no answer to a heartbeat for {beat.limit:g} s"))


WATCHDOG = Watchdog()


class EndWatch:
    """Waits, in a thread of its own, for the end of one attempt and hands the news on.

    The wait is one blocked request: no traffic until the end key is written. ``on_news``
    runs in the watching thread; ``on_lost`` hears a store that dropped the connection.
    """

    def __init__(
        self, client: Client, key: str, on_news: Callable[[News], None], on_lost: Callable[[BaseException], None]
    ):
        self._client = client
        self._key = key
        self._on_news = on_news
        self._on_lost = on_lost
        self.ended = threading.Event()
        self.news: News | None = None
        self.heard = 0.0
        """When the news came (monotonic)."""
        threading.Thread(target=self._run, name="xlarun-attempt-end", daemon=True).start()

    def _run(self) -> None:
        try:
            wait_for_key(self._client, self._key, None)
            self.news = News.decode(self._client.get(self._key))
            self.heard = time.monotonic()
        except Exception as error:  # the store is gone: no news will ever come
            self._on_lost(error)
        else:
            self._on_news(self.news)
        finally:
            self.ended.set()

    def give_up(self) -> None:
        """The store is gone (found by the heartbeat): stop waiting for news that cannot come."""
        self.ended.set()


class Silence(Struct):
    """How long the monitor has seen one agent's heartbeat stand still."""

    beat: bytes | None = None
    seconds: float = 0.0
    declared: bool = False
    """The agent was declared lost in this attempt (once is enough)."""
    alive_after_end: bool = False
    """Its heartbeat moved after the attempt's end was written: lost later, it is not why the attempt ended."""


class Monitor:
    """The one watcher of the whole job, in the agent that serves the store.

    Each interval it reads the current attempt's heartbeats in one request; an agent whose
    counter stood still for ``heartbeat_timeout`` is declared lost: the attempt's end key
    says so, and ``gone/<agent>`` lets a replacement take its node rank. Time in which the
    store itself did not answer, or this process did not run, counts as nobody's silence.

    An agent silent since before the attempt's end was written is why the attempt ended, even
    where a worker elsewhere failed first (its collective lost the vanished node's workers):
    ``attempt_<n>/lost`` records it for every node's report. The order is the monitor's own
    view: a beat read after a read that already saw the end. It also reports agents of other
    jobs that were refused, and (c10d) calls a restart when nodes wait to join an attempt
    that runs with fewer than the maximum. Whatever another process wrote to the store is
    checked: a value xlarun did not write is named once and the watch goes on.
    """

    def __init__(
        self,
        client: Client,
        keys: JobKeys,
        heartbeat_timeout: float,
        interval: float,
        status: StatusLine,
        refusals_seen: int,
        nodes_waiting: Callable[[], int] | None = None,
        max_nodes: int = 0,
    ):
        self._client = client
        self._keys = keys
        self._timeout = heartbeat_timeout
        self._interval = interval
        self._status = status
        self._refusals_seen = refusals_seen
        self._nodes_waiting = nodes_waiting
        self._max_nodes = max_nodes
        self._attempt = -1
        self._roster: Roster | None = None
        self._silence: dict[int, Silence] = {}
        self.gone: set[int] = set()
        self._last_read = time.monotonic()
        self._end_seen = False
        self._named: set[str] = set()
        self._next_admission = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xlarun-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._look()
            except Exception as error:
                from torch.distributed import DistNetworkError

                if isinstance(error, DistNetworkError):  # the store is gone; every agent hears it on its own
                    return
                # A value xlarun did not write: named once, and the watch goes on.
                line = f"ignored a value in the rendezvous store that xlarun did not write: {shown(str(error))}"
                if line not in self._named:
                    self._named.add(line)
                    self._status.say(line)

    def _look(self) -> None:
        self._report_refusals()
        published = read_count(self._client, self._keys("published"))
        if published == 0:
            return
        if published - 1 != self._attempt:
            self._attempt = published - 1
            self._roster = read_roster(self._client, self._keys, self._attempt)
            self._silence = {member.agent: Silence() for member in self._roster.members}
            self._end_seen = False
        assert self._roster is not None
        self._check_heartbeats(self._roster)
        if self._nodes_waiting is not None and time.monotonic() >= self._next_admission:
            self._next_admission = time.monotonic() + ADMISSION_INTERVAL
            self._admit(self._roster)

    def _check_heartbeats(self, roster: Roster) -> None:
        # Seen before the beats are read: a beat that moves in a later read came after the end.
        ended_before = self._end_seen
        self._end_seen = ended_before or self._client.check([self._keys.attempt(self._attempt, "end")])
        asked = time.monotonic()
        beats = self._client.multi_get([self._keys.heartbeat(member.agent) for member in roster.members])
        answered = time.monotonic()
        # A read that overran by more than STALL: this process did not run, and counts the interval only.
        step = min(answered - self._last_read, self._interval + STALL) if answered - asked < self._interval else 0.0
        self._last_read = answered
        for rank, (member, beat) in enumerate(zip(roster.members, beats, strict=True)):
            if beat == LEFT_BEAT:
                continue
            silence = self._silence[member.agent]
            if beat != silence.beat:
                silence.beat, silence.seconds = beat, 0.0
                silence.alive_after_end = silence.alive_after_end or ended_before
            else:
                silence.seconds += step
            if not silence.declared and (member.agent in self.gone or silence.seconds > self._timeout):
                silence.declared = True
                self._declare_lost(roster, rank, silence)

    def _declare_lost(self, roster: Roster, rank: int, silence: Silence) -> None:
        member = roster.members[rank]
        lost = LostNode(rank, member.host, self._timeout)
        self.gone.add(member.agent)
        if not silence.alive_after_end:
            # Recorded before the end is announced: a node that reads a "lost" end finds its record.
            self._client.compare_set(self._keys.attempt(self._attempt, "lost"), "", lost.to_json())
        announce(self._client, self._keys, self._attempt, News("lost", lost.message))
        self._client.set(self._keys("gone", member.agent), "lost")
        settle(self._client, self._keys, self._attempt, rank, "lost")
        if not silence.alive_after_end:
            # The root cause is known: no node need wait for the others to settle.
            for other in range(len(roster.members)):
                settle(self._client, self._keys, self._attempt, other, "accounted")

    def _admit(self, roster: Roster) -> None:
        """torchrun's rule: nodes waiting while fewer than the maximum run are let in by a restart.

        Not once a node's workers are done: a finished node would have to run its workers again.
        """
        assert self._nodes_waiting is not None
        if len(roster.members) >= self._max_nodes or self._client.check([self._keys.attempt(self._attempt, "end")]):
            return
        if int(self._client.add(self._keys.attempt(self._attempt, "done"), 0)) > 0:
            return
        waiting = self._nodes_waiting()
        if waiting:
            announce(
                self._client,
                self._keys,
                self._attempt,
                News("admit", f"{waiting} node{'s' if waiting > 1 else ''} waiting to join"),
            )

    def _report_refusals(self) -> None:
        """The job's side of a refusal: one line per agent turned away (of another job, or planning it otherwise),
        in that agent's words, escaped."""
        count = read_count(self._client, JobKeys.REFUSED)
        if count > self._refusals_seen:
            self._refusals_seen = count
            last = self._client.get(JobKeys.REFUSED_LAST) if self._client.check([JobKeys.REFUSED_LAST]) else b"?"
            self._status.say(f"refused an agent: {shown(last)}")

    def gone_from(self, attempt: int) -> int:
        """How many of ``attempt``'s nodes were declared lost (they will never say they left)."""
        if attempt != self._attempt or self._roster is None:
            return 0
        return sum(member.agent in self.gone for member in self._roster.members)


def wait_for_end(watch: EndWatch, client: Client, keys: JobKeys, attempt: int, nnodes: int, status: StatusLine) -> None:
    """Wait for the attempt's end after this node's workers are gone, for as long as the others run.

    No deadline: nodes may finish hours apart. On a terminal the status line counts the nodes done.
    """
    started = time.monotonic()
    while not watch.ended.wait(None if not status.tty else STATUS_INTERVAL):
        done = int(client.add(keys.attempt(attempt, "done"), 0))
        status.update(f"waiting for the other nodes to finish: {done}/{nnodes} ({time.monotonic() - started:.0f} s)")
    status.clear()


def wait_until_left(
    client: Client, keys: JobKeys, attempt: int, nnodes: int, gone: Callable[[], int], deadline: float
) -> None:
    """The host keeps the store up until every node of the last attempt has read the outcome and left."""
    key = keys.attempt(attempt, "all_left")
    while time.monotonic() < deadline:
        # Nodes declared lost never say they left; the monitor counts them.
        if int(client.add(keys.attempt(attempt, "left"), 0)) + gone() >= nnodes:
            return
        if wait_for_key(client, key, min(deadline, time.monotonic() + 0.2)):
            return
