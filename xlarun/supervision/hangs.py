"""Hang detection: a node's workers are hung when, for ``--hang-timeout`` seconds, none made progress
and none uses the CPU.

Usage (the worker group drives it from its event loop)::

    watch = HangWatch(timeout=600.0, cpu_seconds=lambda: {0: 1.2, 1: 1.1})
    watch.saw_progress()                # a line of output, a torch_xla step: costs one clock read
    timeout = watch.seconds_left()      # the loop's select() waits no longer than this
    verdict = watch.check()             # once it is up: None, BUSY or HUNG
    if verdict is Verdict.BUSY and watch.busy_checks == 1:
        say(busy_notice(watch))         # said once: the silence goes on being checked

Progress is what the launcher sees of the workers without polling: every chunk of output it
relays (stderr always, unless redirected to a file; stdout under ``--tee``) and every torch_xla
step in the step log. Nothing else is read while progress comes in. Once the timeout passes in
silence, the workers' CPU time is sampled twice, :attr:`HangWatch.confirm` apart: a worker that
used more than :data:`BUSY_SHARE` of a core meanwhile is busy (an XLA compile prints nothing for
minutes), and the silence is checked again a timeout later; otherwise the workers are hung.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping

from xlarun.host.procfs import CLOCK_TICKS, process_stats

BUSY_SHARE = 0.05
"""The share of one core above which a silent worker counts as busy: a worker blocked in a collective
or a lock uses next to none."""


class Verdict(enum.Enum):
    BUSY = "busy"
    """Silent for the timeout, but using the CPU: not hung."""
    HUNG = "hung"


class HangWatch:
    """See the module docstring. ``cpu_seconds`` gives each worker's CPU time so far, by local rank."""

    def __init__(
        self,
        timeout: float,
        cpu_seconds: Callable[[], Mapping[int, float]],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.timeout = timeout
        self.confirm = min(5.0, max(1.0, timeout / 10))
        self._cpu_seconds = cpu_seconds
        self._clock = clock
        self._last_progress = clock()
        self._next_check = self._last_progress + timeout
        self._sample: tuple[float, Mapping[int, float]] | None = None
        self.busy_ranks: list[int] = []
        """The workers found busy at the last check."""
        self.busy_checks = 0
        """How many checks found them busy."""

    @property
    def quiet_for(self) -> float:
        """Seconds since the last progress."""
        return self._clock() - self._last_progress

    def saw_progress(self) -> None:
        self._last_progress = self._clock()
        self._next_check = self._last_progress + self.timeout
        self._sample = None

    def seconds_left(self) -> float:
        """How long the loop may wait before :meth:`check` is due."""
        if self._sample is not None:
            return max(0.0, self._sample[0] + self.confirm - self._clock())
        return max(0.0, self._next_check - self._clock())

    def check(self) -> Verdict | None:
        """Call when :meth:`seconds_left` is 0: None while there is nothing to say."""
        if self.seconds_left() > 0:
            return None
        now = self._clock()
        if self._sample is None:
            self._sample = (now, self._cpu_seconds())  # silent for the timeout: is anyone computing?
            return None
        then, before = self._sample
        after = self._cpu_seconds()
        span = max(now - then, 1e-3)
        self.busy_ranks = sorted(
            rank for rank, seconds in after.items() if (seconds - before.get(rank, seconds)) / span > BUSY_SHARE
        )
        if not self.busy_ranks:
            return Verdict.HUNG
        # Busy: the next look comes a timeout later.
        self.busy_checks += 1
        self._next_check = now + self.timeout
        self._sample = None
        return Verdict.BUSY


def busy_notice(watch: HangWatch) -> str:
    """The line that says a silent group is busy, not hung."""
    from xlarun.supervision.stacks import rank_ranges  # loaded once a group is busy, not by every watch

    ranks = watch.busy_ranks
    return (
        f"local rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} made no progress for "
        f"{watch.timeout:g} s but {'use' if len(ranks) > 1 else 'uses'} the CPU (an XLA compile?): "
        "not hung; the run goes on"
    )


def group_cpu_seconds(pgids: Iterable[int]) -> dict[int, float]:
    """The CPU time (user and system, with reaped children's) of every live process in each process
    group, summed per group; one pass over /proc for all of them."""
    wanted = {pgid: 0.0 for pgid in pgids}
    for _, fields in process_stats():
        group = int(fields[5])
        if group in wanted:
            # utime, stime, cutime, cstime: fields 14 to 17 of proc(5).
            wanted[group] += sum(int(value) for value in fields[14:18]) / CLOCK_TICKS
    return wanted
