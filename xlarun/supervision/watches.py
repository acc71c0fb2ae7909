"""What watches a worker group's workers while its loop runs: each watch an object of its own, with one shape.

Usage (the worker group drives them; a run adds its own through ``WorkerGroup(..., watches=[...])``)::

    watches = (Hangs(timeout=600.0, on_hang=announce, on_stacks=publish), OomWatch(), *given)
    watch.start(group)              # before the first worker starts
    watch.started()                 # every worker started: the loop begins
    wait = min(left for watch in watches if (left := watch.seconds_left()) is not None)
    watch.look()                    # its time came (the group is not being torn down)
    watch.failed(result)            # a worker failed: what the watch knows of it goes in its result
    watch.close()                   # the group is gone

A watch fires on the clock (:meth:`Watch.seconds_left`, then :meth:`Watch.look`) or on a descriptor it
listens to through the group (:meth:`WatchedGroup.listen`: a thread of its own writes to a pipe), so the
loop never polls. What it finds it says itself, in one line (:func:`~xlarun.console.say`), and acts through
:class:`WatchedGroup`: the group's live workers, a signal to each, the teardown of a hung group.

- :class:`Hangs`: no progress and no CPU use for ``--hang-timeout`` seconds (:mod:`xlarun.supervision.hangs`),
  unless the launcher's own console held the workers' output back (a paused terminal: one line, said
  once); a hung group, found here or by another node, has every running worker's stacks taken on a
  thread (:class:`~xlarun.supervision.stacks.StackTaking`), handed on, then it is torn down.
- :class:`OomWatch`: whether the kernel's OOM killer ended a worker that died of SIGKILL
  (:mod:`xlarun.host.oom`, whose evidence counts from the workers' start).
- :class:`NoticeWatch`: the metadata server's notice that the VM is preempted or goes into host
  maintenance (:class:`~xlarun.host.metadata.Notices`), for the whole run: one line each, then the
  run's own word (``on_notice``: its event) and, for a VM that stops, ``--preemption-signal`` to
  every worker of the group under way.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from xlarun.console import say
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Protocol

    # Loaded when a run watches for hangs (hangs), takes stacks (stacks), starts workers (oom), or runs
    # where a metadata server is (metadata).
    from xlarun.host.metadata import Notice, Notices
    from xlarun.host.oom import OomWitness
    from xlarun.supervision.group import Worker, WorkerResult
    from xlarun.supervision.hangs import HangWatch
    from xlarun.supervision.stacks import StackTaking
else:
    Protocol = object  # the protocols below only type; at run time they are plain classes


class Hang(Struct, frozen=True):
    """A hung attempt as one node saw it: the stacks it took, and where each rank stood."""

    reason: str
    positions: dict[int, str]
    """Every rank of this node that was still running, by global rank."""
    stacks_files: dict[int, str]
    """The dump file of each rank whose stacks were taken."""
    found_here: bool
    """This node found the hang; otherwise another node said so."""


class WatchedGroup(Protocol):
    """What a watch sees of the worker group it watches, and what it may do to it."""

    @property
    def size(self) -> int:
        """How many workers the group starts."""
        ...

    @property
    def stopping(self) -> bool:
        """The group's teardown began."""
        ...

    def live(self) -> list[Worker]:
        """The workers not yet reaped."""
        ...

    def held_back(self) -> list[int]:
        """The console descriptors too far behind to take the workers' output
        (:class:`~xlarun.supervision.relay.PipeReaders`)."""
        ...

    def listen(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` from the loop whenever ``fd`` turns readable."""
        ...

    def unlisten(self, fd: int) -> None: ...

    def signal_workers(self, number: int) -> None:
        """Send signal ``number`` to every worker's process group."""
        ...

    def stop_hung(self, hang: Hang) -> None:
        """Tear the group down as hung."""
        ...


class Watch:
    """What the loop asks of every watch; each answers what concerns it (the rest does nothing)."""

    def start(self, group: WatchedGroup) -> None:
        """The group is about to start its workers."""

    def started(self) -> None:
        """Every worker started (or the start failed): the loop begins."""

    def seconds_left(self) -> float | None:
        """How long the loop may wait before :meth:`look` is due; None: nothing is due on the clock."""
        return None

    def look(self) -> None:
        """Its time came (never during the group's teardown)."""

    def failed(self, result: WorkerResult) -> None:
        """A worker failed, before its failure is reported."""

    def close(self) -> None:
        """The group is gone."""


class _Taking(Struct):
    """A hung group's stacks being taken, before its teardown."""

    reason: str
    found_here: bool
    taking: StackTaking
    workers: list[Worker]
    """The workers whose stacks are taken, which learn where they stood."""
    hang: Hang | None = None
    """Set once the Python stacks are taken and handed on."""


class Hangs(Watch):
    """A group's hangs: found here by the silence (with ``timeout``; None: never), or by another node
    (:meth:`found_elsewhere`). A hung group is told of first (``on_hang``, so that the other nodes take
    their stacks too), then every running worker's stacks are taken and handed on (``on_stacks``), then
    the group is torn down as for a failure."""

    def __init__(
        self,
        timeout: float | None,
        on_hang: Callable[[str], None] | None = None,
        on_stacks: Callable[[Hang], None] | None = None,
    ):
        self._on_hang = on_hang
        self._on_stacks = on_stacks
        self._watch: HangWatch | None = None
        if timeout is not None:
            from xlarun.supervision.hangs import HangWatch

            self._watch = HangWatch(timeout, self._cpu_by_rank)
        self._group: WatchedGroup | None = None
        self._taking: _Taking | None = None
        self._said_console_stalled = False

    @property
    def progress(self) -> Callable[[], None] | None:
        """What hears of every chunk of output relayed: the silence ends (None: no silence is watched)."""
        return self._watch.saw_progress if self._watch is not None else None

    def start(self, group: WatchedGroup) -> None:
        self._group = group

    def started(self) -> None:
        if self._watch is not None:
            self._watch.saw_progress()  # the silence counts from the workers' start

    def seconds_left(self) -> float | None:
        return None if self._watch is None or self._taking is not None else self._watch.seconds_left()

    def look(self) -> None:
        assert self._watch is not None and self._group is not None
        if self._watch.seconds_left() > 0 or self._taking is not None:
            return
        if held := self._group.held_back():
            self._console_stalled(self._watch, held)
            return
        from xlarun.supervision.hangs import Verdict, busy_notice

        verdict = self._watch.check()
        if verdict is Verdict.BUSY and self._watch.busy_checks == 1:
            say(busy_notice(self._watch))
        elif verdict is Verdict.HUNG:
            self._take_stacks(f"no output for {self._watch.quiet_for:.0f} s and no CPU use", found_here=True)

    def found_elsewhere(self, reason: str) -> None:
        """Another node found the job hung: this node's stacks are taken, then its group torn down."""
        self._take_stacks(reason, found_here=False)

    def close(self) -> None:
        if self._taking is not None:
            self._taking.taking.cancel()  # stacks no longer wanted: the workers are gone

    def _cpu_by_rank(self) -> dict[int, float]:
        from xlarun.supervision.hangs import group_cpu_seconds

        assert self._group is not None
        live = self._group.live()
        seconds = group_cpu_seconds(worker.pgid for worker in live)
        return {worker.spec.local_rank: seconds[worker.pgid] for worker in live}

    def _console_stalled(self, watch: HangWatch, consoles: list[int]) -> None:
        """The launcher itself held the workers' output back, its console being too far behind: that
        time is not the workers' silence. Said once; the silence counts anew."""
        watch.saw_progress()
        if not self._said_console_stalled:
            self._said_console_stalled = True
            names = " and ".join({1: "stdout", 2: "stderr"}.get(fd, f"descriptor {fd}") for fd in consoles)
            say(
                f"the launcher's {names} took no output for {watch.timeout:g} s (a paused terminal, a stalled "
                "pipe?): the workers wait to write, which is no hang; the run goes on"
            )

    def _take_stacks(self, reason: str, found_here: bool) -> None:
        """Tell the other nodes (when found here), then take every running worker's stacks on a thread
        of their own, whose progress comes back through a descriptor: meanwhile a signal, an exit or a
        stop request is handled at once, and tears the group down without waiting for the stacks."""
        from xlarun.supervision.stacks import StackTaking, StackTarget

        group = self._group
        assert group is not None
        if group.stopping or self._taking is not None:
            return
        if found_here and self._on_hang is not None:
            self._on_hang(reason)  # first, so that the other nodes take their stacks while every rank still waits
        workers = group.live()
        taking = StackTaking(
            [StackTarget(worker.result.rank, worker.pgid, worker.spec.logs.stacks_file) for worker in workers]
        )
        self._taking = _Taking(reason, found_here, taking, workers)
        group.listen(taking.fd, self._on_stacks_taken)

    def _on_stacks_taken(self) -> None:
        """The Python stacks are taken (handed on before the teardown, which can take the grace period),
        then py-spy's native frames follow them into the files (the teardown waits for those)."""
        progress, group = self._taking, self._group
        assert progress is not None and group is not None
        progress.taking.read_events()
        taken = progress.taking.taken
        if progress.hang is None and taken is not None and not group.stopping:
            for worker in progress.workers:
                worker.result.position = taken.positions.get(worker.result.rank, worker.result.position)
            progress.hang = Hang(progress.reason, taken.positions, taken.stacks_files, progress.found_here)
            if self._on_stacks is not None:
                self._on_stacks(progress.hang)
        if progress.taking.done:
            group.unlisten(progress.taking.fd)
            if not group.stopping:
                # No hang without its teardown, even where taking the stacks failed.
                group.stop_hung(progress.hang or Hang(progress.reason, {}, {}, progress.found_here))


class OomWatch(Watch):
    """Names the OOM killer in the result of a worker that died of SIGKILL where the kernel's evidence
    points at it (:attr:`~xlarun.supervision.group.WorkerResult.oom_killed`)."""

    def __init__(self) -> None:
        self._witness: OomWitness | None = None

    def start(self, group: WatchedGroup) -> None:
        from xlarun.host.oom import OomWitness

        self._witness = OomWitness(group.size)

    def failed(self, result: WorkerResult) -> None:
        if result.returncode == -signal.SIGKILL and self._witness is not None:
            result.oom_killed = self._witness.killed(result.pid, result.peak_rss_mib)

    def close(self) -> None:
        if self._witness is not None:
            self._witness.close()


class NoticeWatch(Watch):
    """The metadata server's notices (:class:`~xlarun.host.metadata.Notices`) over a whole run, shared by
    each attempt's group: every notice is one line, then ``on_notice`` hears of it, with the signal sent.
    A notice that the VM stops sends ``signal_number`` (if any) to every worker of the group under way
    (not being torn down), and is kept as :attr:`stopping_notice`. A notice that comes between two
    groups waits in the pipe for the next one, or for :meth:`end`."""

    def __init__(
        self,
        notices: Notices,
        signal_number: int | None,
        on_notice: Callable[[Notice, int | None], None],
    ):
        self._notices = notices
        self._signal_number = signal_number
        self._on_notice = on_notice
        self._group: WatchedGroup | None = None
        self.stopping_notice: Notice | None = None
        """The first notice that the VM stops, once one came: the run ends preempted."""

    def start(self, group: WatchedGroup) -> None:
        self._group = group
        group.listen(self._notices.fd, self._read)

    def close(self) -> None:
        self._group = None  # the group's selector goes with it; the pipe stays the run's

    def end(self) -> None:
        """The run is over: the notices still unread are told, and no other is watched for."""
        self._read()
        self._notices.close()

    def _read(self) -> None:
        for notice in self._notices.read():
            sent = None
            if notice.stops:
                self.stopping_notice = self.stopping_notice or notice
                if self._signal_number is not None and self._group is not None and not self._group.stopping:
                    self._group.signal_workers(self._signal_number)
                    sent = self._signal_number
            told = f"; sent {signal.Signals(sent).name} to every worker" if sent is not None else ""
            say(f"the metadata server's instance/{notice.key} is {notice.value}: {notice.meaning}{told}")
            self._on_notice(notice, sent)
