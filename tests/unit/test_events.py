"""The event bus and the JSON-lines sink, in process: order, drops, deadlines, the record's shape."""

from __future__ import annotations

import array
import errno
import fcntl
import json
import os
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, slack_s, wait_for

from xlarun.supervision.eventlog import JsonLinesSink, line_of
from xlarun.supervision.events import NO_EVENTS, QUEUE_SIZE, Event, EventBus, trace_id_of


class Collecting:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = False

    def handle(self, event: Event) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed = True


class Stuck:
    """A sink whose every write hangs, as on a stalled network disk."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def handle(self, event: Event) -> None:
        self.release.wait(30)

    def close(self) -> None:
        pass


class Failing:
    def handle(self, event: Event) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_events_are_numbered_in_order_and_carry_the_identity_given_so_far() -> None:
    sink = Collecting()
    bus = EventBus([sink], run_id="job", host="h", trace_id="ab" * 16)
    bus.emit("launch.started", 0, nnodes=1)
    bus.identify(run_id="job-2", node_rank=3)
    bus.emit("worker.started", 1, rank=0)
    bus.close(5)
    first, second = sink.events
    assert (first.seq, first.run_id, first.node_rank, first.attempt) == (1, "job", None, 0)
    assert (second.seq, second.run_id, second.node_rank, second.attempt) == (2, "job-2", 3, 1)
    assert first.trace_id == "ab" * 16 and dict(second.attributes) == {"rank": 0}
    assert sink.closed and bus.dropped == 0


def test_a_stuck_sink_never_blocks_emit_nor_another_sink_and_close_keeps_its_deadline() -> None:
    stuck, healthy = Stuck(), Collecting()
    bus = EventBus([stuck, healthy], host="h")
    started = time.monotonic()
    for number in range(QUEUE_SIZE):  # as many as a queue holds: the healthy sink misses none
        bus.emit("worker.started", 0, rank=number)
    emitted = time.monotonic() - started
    started = time.monotonic()
    bus.close(0.3)
    closing = time.monotonic() - started
    stuck.release.set()
    assert emitted < slack_s(1) and closing < 0.3 + slack_s(0.7)
    assert [event.attributes["rank"] for event in healthy.events] == list(range(QUEUE_SIZE))
    # Every event the stuck sink did not finish is counted, the one it hangs in too.
    assert [(sink, count) for sink, count, _ in bus.drops()] == [(stuck, QUEUE_SIZE)]


def test_past_a_full_queue_events_are_dropped_not_waited_for() -> None:
    stuck = Stuck()
    bus = EventBus([stuck], host="h")
    started = time.monotonic()
    for number in range(QUEUE_SIZE + 100):
        bus.emit("worker.started", 0, rank=number)
    assert time.monotonic() - started < slack_s(1)
    bus.close(0.1)
    stuck.release.set()
    assert bus.dropped == QUEUE_SIZE + 100


def test_a_sink_that_raises_costs_its_events_counted_and_said_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    from xlarun.console import flush_consoles

    # The console writes from a thread of its own: what the earlier tests' buses said is written first.
    flush_consoles()
    capfd.readouterr()
    bus = EventBus([Failing()], host="h")
    for _ in range(3):
        bus.emit("restart", 0, restarts_left=1)
    bus.close(5)
    assert bus.dropped == 3
    flush_consoles()
    said = [line for line in capfd.readouterr().err.splitlines() if "dropped" in line]
    assert said == ["xlarun: the event sink Failing: 3 events dropped (No space left on device)"]


def test_no_sink_no_thread_and_emitting_is_free() -> None:
    before = threading.active_count()
    NO_EVENTS.emit("launch.started", 0, nnodes=1)
    NO_EVENTS.close(1)
    assert not NO_EVENTS.active and NO_EVENTS.dropped == 0 and threading.active_count() == before


def test_a_launch_without_an_event_log_loads_no_sink() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, xlarun.launching.node\n"
            "print(*sorted(m for m in sys.modules if m.startswith('xlarun.supervision')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    assert "xlarun.supervision.events" in loaded and "xlarun.supervision.eventlog" not in loaded


@pytest.mark.parametrize(
    ("value", "trace_id"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # all zeros: invalid (W3C)
        ("garbage", None),
        ("", None),
    ],
)
def test_the_trace_id_comes_from_traceparent(value: str, trace_id: str | None) -> None:
    assert trace_id_of({"TRACEPARENT": value}) == trace_id


def event(**attributes: object) -> Event:
    return Event(
        name="worker.exited",
        time=1764640780.850442,
        seq=7,
        attempt=1,
        attributes=attributes,
        run_id="job",
        node_rank=0,
        host="h",
        trace_id=None,
    )


def test_a_line_is_one_json_object_with_an_rfc3339_utc_time() -> None:
    line = line_of(event(**{"process.exit.code": 0, "rank": 1}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "schema_version": 1,
        "seq": 7,
        "time": "2025-12-02T01:59:40.850442Z",
        "run_id": "job",
        "node_rank": 0,
        "host": "h",
        "attempt": 1,
        "name": "worker.exited",
        "trace_id": None,
        "attributes": {"process.exit.code": 0, "rank": 1},
    }


def test_lines_are_appended_to_what_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "ev.jsonl"
    path.write_text('{"earlier": true}\n')
    sink = JsonLinesSink.open(str(path))
    sink.handle(event(rank=0))
    sink.handle(event(rank=1))
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line).get("attributes", {}).get("rank") for line in lines] == [None, 0, 1]


def test_a_fifo_nobody_reads_is_opened_without_waiting_and_each_event_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "ev.fifo"
    os.mkfifo(path)
    started = time.monotonic()
    sink = JsonLinesSink.open(str(path))
    with pytest.raises(OSError, match="no reader"):
        sink.handle(event(rank=0))
    assert time.monotonic() - started < slack_s(1)


def test_a_path_that_can_never_take_the_log_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JsonLinesSink.open(str(tmp_path / "missing" / "ev.jsonl"))


def fill(sink: JsonLinesSink) -> None:
    """Events into ``sink``'s FIFO until its reader, which reads nothing, leaves no room for the next."""
    with pytest.raises(BlockingIOError):
        for rank in range(1 << 20):
            sink.handle(event(rank=rank))


def read_all(reader: int) -> bytes:
    """What the FIFO holds now (``reader`` is open without waiting)."""
    taken = b""
    while True:
        try:
            chunk = os.read(reader, 1 << 16)
        except BlockingIOError:
            return taken
        if not chunk:
            return taken
        taken += chunk


def whole_lines(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def fifo_and_reader(tmp_path: Path) -> Iterator[tuple[str, int]]:
    path = tmp_path / "ev.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    yield str(path), reader
    os.close(reader)


def queued(reader: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(reader, termios.FIONREAD, count)
    return count[0]


def handle_on_a_thread(sink: JsonLinesSink, each: Event) -> tuple[threading.Thread, list[OSError]]:
    errors: list[OSError] = []

    def handle() -> None:
        try:
            sink.handle(each)
        except OSError as error:
            errors.append(error)

    thread = threading.Thread(target=handle, daemon=True)
    thread.start()
    return thread, errors


LONG = {"rank": 99, "traceback": "x" * 9000}
"""A line over PIPE_BUF (4096 bytes) and under a pipe's 64 KiB."""


def test_a_long_line_behind_what_a_stopped_reader_left_is_held_and_follows_whole_once_read(
    fifo_and_reader: tuple[str, int],
) -> None:
    """The reader read 5,000 bytes of a full pipe and stopped: a write of the long line would put a part of
    it where the room ends. It is held, nothing of it in the pipe, and follows the others whole once the
    reader empties the pipe."""
    path, reader = fifo_and_reader
    sink = JsonLinesSink.open(path)
    fill(sink)
    received = [os.read(reader, 5000)]
    before = queued(reader)
    writing, errors = handle_on_a_thread(sink, event(**LONG))
    writing.join(1.0)  # the chance to write a part at once, as a plain write would
    assert writing.is_alive() and queued(reader) == before

    def the_long_line_arrived() -> bool:
        received.append(read_all(reader))
        return b"".join(received).endswith(line_of(event(**LONG))[-100:])

    wait_for(the_long_line_arrived, "the held line once the reader emptied the pipe", timeout=30)
    writing.join(30)
    lines = whole_lines(b"".join(received))
    assert not writing.is_alive() and not errors
    assert lines[-1]["attributes"] == LONG and [line["attributes"]["rank"] for line in lines[:-1]] == list(
        range(len(lines) - 1)
    )
    sink.close()


def test_a_line_longer_than_the_pipe_grows_the_pipe_and_goes_whole_to_a_reader_that_reads_nothing(
    fifo_and_reader: tuple[str, int],
) -> None:
    path, reader = fifo_and_reader
    sink = JsonLinesSink.open(path)
    huge = event(rank=0, traceback="y" * 100_000)
    writing, errors = handle_on_a_thread(sink, huge)
    writing.join(30)
    assert not writing.is_alive() and not errors
    assert queued(reader) == len(line_of(huge))
    assert whole_lines(read_all(reader)) == [json.loads(line_of(huge))]
    sink.close()


def test_a_held_line_is_dropped_when_the_reader_goes(tmp_path: Path) -> None:
    path = tmp_path / "ev.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    sink = JsonLinesSink.open(str(path))
    fill(sink)
    os.read(reader, 5000)
    writing, errors = handle_on_a_thread(sink, event(**LONG))
    writing.join(1.0)
    assert writing.is_alive()
    os.close(reader)
    writing.join(30)
    assert not writing.is_alive() and [error.errno for error in errors] == [errno.EPIPE]
    sink.close()
