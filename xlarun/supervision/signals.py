"""The launcher's signals, turned into bytes on a pipe that an event loop reads.

Usage::

    with SignalInbox(config.signals_to_handle.signals) as inbox:
        selector.register(inbox.fd, selectors.EVENT_READ)
        ...
        numbers = inbox.drain()

The stop signals (``--signals-to-handle``, torchrun's SIGTERM, SIGINT, SIGHUP and SIGQUIT unless
it says otherwise) end a run: the workers are torn down. :data:`RELAYED_SIGNALS` are passed to
every worker and the run goes on, and :data:`SUSPEND_SIGNAL` suspends the workers with the
launcher, whether the list names them or not.
A signal the list leaves out keeps the disposition the launcher started with: its default action,
or ignored where the launcher inherited it ignored (a background job's SIGINT and SIGQUIT), as
under torchrun; the workers inherit it in turn.

:class:`StopRequests` carries the stops other threads ask for (a rendezvous watcher's) to the
same loop, the same way.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable

from xlarun.structs import Struct

RELAYED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
SUSPEND_SIGNAL = signal.SIGTSTP
"""Ctrl-Z. The workers lead sessions of their own, out of the terminal's reach, so the launcher
stops them (SIGSTOP: a stop signal a terminal sends to an orphaned group is discarded), stops
itself, and once continued (``fg``, ``bg``: SIGCONT) continues them."""


class SignalInbox:
    """Turns the launcher's signals into bytes on a pipe that the event loop reads.

    The handlers do nothing themselves (no exceptions raised inside a handler): the
    interpreter's wakeup fd carries each signal number to the loop. ``stop_signals`` are those
    that end the run; a relayed or the suspend signal among them keeps its own meaning.

    SIGINT left out of them gets its default action back for the inbox's life: Python's own
    handler would raise ``KeyboardInterrupt`` wherever the launcher happens to be, a traceback
    instead of the end a signal's default action is.
    """

    def __init__(self, stop_signals: Iterable[int]):
        self.stop_signals = tuple(number for number in stop_signals if number not in (*RELAYED_SIGNALS, SUSPEND_SIGNAL))
        self._signals = (*self.stop_signals, *RELAYED_SIGNALS, SUSPEND_SIGNAL)
        self._previous: dict[int, object] = {}
        self.fd = -1
        self._write_fd = -1
        self._previous_wakeup = -1

    def __enter__(self) -> SignalInbox:
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for number in self._signals:
            self._previous[number] = signal.signal(number, _ignore_in_handler)
        if signal.SIGINT not in self._signals and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_DFL)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self.fd)
        os.close(self._write_fd)

    def drain(self) -> list[int]:
        received: list[int] = []
        while True:
            try:
                data = os.read(self.fd, 512)
            except BlockingIOError:
                return received
            if not data:
                return received
            received.extend(number for number in data if number in self._signals)


class StopRequest(Struct, frozen=True):
    reason: str
    hung: bool
    """Another node found the job hung: the workers' stacks are taken before they are stopped."""


class StopRequests:
    """Stop requests from any thread, as lines on a pipe that the event loop reads (:attr:`fd`)."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # A watcher thread may ask for a stop after the loop is gone: the pipe's descriptor
        # numbers may by then belong to another file, so closing and writing exclude each other.
        self._lock = threading.Lock()

    def send(self, reason: str, hung: bool = False) -> None:
        """Safe from any thread; a no-op once :meth:`close` ran."""
        with self._lock:
            if self._write_fd >= 0:
                os.write(self._write_fd, (b"H" if hung else b"S") + reason.encode()[:512] + b"\n")

    def receive(self) -> list[StopRequest]:
        """The requests that came since the last call, oldest first."""
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return []
        return [StopRequest(line[1:], line.startswith("H")) for line in data.decode(errors="replace").splitlines()]

    def close(self) -> None:
        with self._lock:
            os.close(self.fd)
            os.close(self._write_fd)
            self._write_fd = -1


def _ignore_in_handler(signum: int, frame: object) -> None:
    """The wakeup fd already told the loop; nothing else happens inside the handler."""


def suspend_self() -> None:
    """Stop the launcher as Ctrl-Z would have (its handler took the signal); returns once continued."""
    os.kill(os.getpid(), signal.SIGSTOP)
