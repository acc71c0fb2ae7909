"""The worker group's parts on their own: its stopping state, its stop requests, the back-pressure
on the workers' pipes, and what it says of a busy group."""

from __future__ import annotations

import os
import selectors
import signal

import pytest

from xlarun.console import PAUSE_BYTES, ConsoleWriter
from xlarun.supervision.group import Cause, Hang, Stopping
from xlarun.supervision.hangs import HangWatch, Verdict, busy_notice
from xlarun.supervision.relay import READ_CHUNK, PipeReaders, StreamPlan, StreamRelay, drain
from xlarun.supervision.signals import StopRequest, StopRequests


def test_a_teardown_sends_sigterm_until_the_launcher_is_sent_a_stop_signal() -> None:
    stopping = Stopping(Cause.ENDED, deadline=130.0)
    assert stopping.signal == signal.SIGTERM and stopping.launcher_signal is None
    assert stopping.seconds_left(100.0) == 30.0 and not stopping.due(100.0) and stopping.due(130.0)
    # Ctrl-C during a failure's teardown: passed on, with the grace started anew; the cause stays.
    interrupted = stopping.signalled(signal.SIGINT, deadline=160.0)
    assert (interrupted.signal, interrupted.launcher_signal, interrupted.deadline) == (
        signal.SIGINT,
        signal.SIGINT,
        160.0,
    )
    assert interrupted.cause is Cause.ENDED and stopping.signal == signal.SIGTERM  # the old value is unchanged
    # A second one: SIGKILL now, and once it went out there is nothing left to wait for.
    hurried = interrupted.hurried(now=140.0)
    assert hurried.due(140.0) and hurried.seconds_left(140.0) == 0.0
    assert hurried.killed().deadline is None and hurried.killed().seconds_left(200.0) is None
    assert not hurried.killed().due(200.0)


def test_the_first_reason_given_for_a_stop_is_the_one_kept() -> None:
    failed_start = Stopping(Cause.START_FAILED, 10.0, reason="cannot start local rank 1: train.py: No such file")
    assert failed_start.asked("node 1 left").reason == "cannot start local rank 1: train.py: No such file"
    assert Stopping(Cause.ENDED, 10.0).asked("node 1 left").reason == "node 1 left"


def test_a_hung_groups_teardown_holds_its_hang() -> None:
    hang = Hang("no output for 60 s and no CPU use", {0: "all_reduce (train.py:20)"}, {}, found_here=True)
    assert Stopping(hang, 10.0, hang.reason).hang is hang
    assert Stopping(Cause.REQUESTED, 10.0, "node 1 left").hang is None


def test_stop_requests_arrive_in_order_and_none_after_close() -> None:
    requests = StopRequests()
    requests.send("node 1 left")
    requests.send("node 2: no output for 60 s", hung=True)
    assert requests.receive() == [StopRequest("node 1 left", False), StopRequest("node 2: no output for 60 s", True)]
    assert requests.receive() == []
    requests.close()
    requests.send("too late")  # writes nowhere


class Console:
    """A pipe standing in for the launcher's console, read only when the test says so."""

    def __init__(self) -> None:
        self.read_end, write_end = os.pipe()
        os.set_blocking(self.read_end, False)
        self.writer = ConsoleWriter(write_end)

    def take(self) -> None:
        try:
            os.read(self.read_end, 1 << 20)
        except BlockingIOError:
            pass


def dispatch(selector: selectors.BaseSelector, timeout: float) -> int:
    events = selector.select(timeout)
    for key, _ in events:
        key.data()
    return len(events)


def test_a_pipe_whose_console_falls_behind_is_left_unread_until_it_catches_up() -> None:
    console, chunks = Console(), []
    relay = StreamRelay(StreamPlan(console_fd=console.writer.fd), writer=console.writer)
    read_end, write_end = os.pipe()
    pipe = os.fdopen(read_end, "rb", buffering=0)
    line = b"x" * (READ_CHUNK - 1) + b"\n"
    with selectors.DefaultSelector() as selector:
        readers = PipeReaders(selector, on_data=lambda: chunks.append(1))
        read = readers.add(pipe, relay)
        # Nobody reads the console: once a pause's worth waits, the pipe leaves the selector.
        for _ in range(4 * PAUSE_BYTES // READ_CHUNK):
            if pipe not in selector.get_map():
                break
            os.write(write_end, line)
            dispatch(selector, 5.0)
        assert pipe not in selector.get_map() and console.writer.space_fd in selector.get_map()
        assert len(chunks) >= PAUSE_BYTES // READ_CHUNK
        # The worker's next line waits in its pipe, and the loop sees no event for it.
        os.write(write_end, line)
        paused_at = len(chunks)
        assert dispatch(selector, 0.1) == 0 and len(chunks) == paused_at
        # The console catches up: the pipe is read again.
        for _ in range(1000):
            if pipe in selector.get_map():
                break
            console.take()
            dispatch(selector, 0.01)
        assert pipe in selector.get_map()
        dispatch(selector, 5.0)
        assert len(chunks) == paused_at + 1
        # Its writer gone, the pipe is read to its end and closed, with its relay.
        os.close(write_end)
        drain([(pipe, read)])
        assert pipe.closed and len(selector.get_map()) == 1  # the console's space_fd alone
        readers.close()
    os.close(console.read_end)


def test_a_paused_pipe_is_drained_to_its_end_and_closed() -> None:
    console = Console()
    relay = StreamRelay(StreamPlan(console_fd=console.writer.fd), writer=console.writer)
    read_end, write_end = os.pipe()
    pipe = os.fdopen(read_end, "rb", buffering=0)
    with selectors.DefaultSelector() as selector:
        readers = PipeReaders(selector)
        read = readers.add(pipe, relay)
        while pipe in selector.get_map():
            os.write(write_end, b"y" * (READ_CHUNK - 1) + b"\n")
            dispatch(selector, 5.0)
        os.write(write_end, b"last words\n")
        os.close(write_end)
        drain([(pipe, read)])
        assert pipe.closed and relay.tail[-1] == b"last words"
        readers.close()  # nothing is left for it to close
    os.close(console.read_end)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("cpu", [{0: 1.0}, {0: 1.0, 1: 1.0, 3: 1.0}])
def test_a_busy_group_is_counted_at_each_check_and_named_in_one_line(cpu: dict[int, float]) -> None:
    clock = Clock()
    watch = HangWatch(30.0, lambda: dict(cpu), clock=clock)
    for checks in (1, 2):
        clock.now += 30.0
        watch.check()
        clock.now += watch.confirm
        for rank in cpu:
            cpu[rank] += watch.confirm
        assert watch.check() is Verdict.BUSY and watch.busy_checks == checks
    ranks = (
        "local rank 0 made no progress for 30 s but uses"
        if len(cpu) == 1
        else "local ranks 0-1,3 made no progress for 30 s but use"
    )
    assert busy_notice(watch) == f"{ranks} the CPU (an XLA compile?): not hung; the run goes on"
