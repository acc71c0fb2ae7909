"""Unit layer: the stream relay in-process, over a real pipe standing in for the console."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from xlarun.console import ConsoleWriter, flush_consoles
from xlarun.supervision.relay import MAX_PARTIAL_LINE, TAIL_LINES, StreamPlan, StreamRelay


class Console:
    """A pipe standing in for the launcher's console, large enough to hold what a test writes."""

    def __init__(self) -> None:
        self.read_end, write_end = os.pipe()
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4 * MAX_PARTIAL_LINE)
        os.set_blocking(self.read_end, False)
        self.writer = ConsoleWriter(write_end)

    def drain(self) -> bytes:
        """What reached the console so far, once the writer has written what it was given."""
        self.writer.flush()
        return drain(self.read_end)


def relay_to_pipe(prefix: bytes = b"", file: str | None = None) -> tuple[StreamRelay, Console]:
    pipe = Console()
    plan = StreamPlan(file=file, console_fd=pipe.writer.fd, prefix=prefix, relay=True)
    return StreamRelay(plan, writer=pipe.writer), pipe


def drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_prefixed_lines_reach_the_console_whole() -> None:
    relay, console = relay_to_pipe(prefix=b"[default0]:")
    relay.feed(b"one\ntw")
    assert console.drain() == b"[default0]:one\n"
    relay.feed(b"o\nthree")
    assert console.drain() == b"[default0]:two\n"
    relay.close()
    assert console.drain() == b"[default0]:three\n"


def test_many_lines_in_one_read_each_get_the_prefix_and_the_tail_keeps_the_last() -> None:
    relay, console = relay_to_pipe(prefix=b"p:")
    relay.feed(b"a\n\nb\nc")
    assert console.drain() == b"p:a\np:\np:b\n"
    assert list(relay.tail) == [b"a", b"", b"b"]
    relay.feed(b"".join(b"%d\n" % number for number in range(3 * TAIL_LINES)))
    assert console.drain().split(b"\n", 1)[0] == b"p:c0"
    assert list(relay.tail) == [b"%d" % number for number in range(2 * TAIL_LINES, 3 * TAIL_LINES)]


def test_unprefixed_text_passes_at_once() -> None:
    relay, console = relay_to_pipe()
    relay.feed(b"50%\r")
    assert console.drain() == b"50%\r"


def test_an_endless_line_is_cut_rather_than_held() -> None:
    relay, console = relay_to_pipe(prefix=b"> ")
    relay.feed(b"x" * (MAX_PARTIAL_LINE + 1))
    assert console.drain() == b"> " + b"x" * (MAX_PARTIAL_LINE + 1) + b"\n"


def test_the_file_gets_the_bytes_unchanged_and_the_tail_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    relay, console = relay_to_pipe(prefix=b"p:", file=str(log))
    relay.feed(b"".join(b"line %d\n" % number for number in range(TAIL_LINES + 5)))
    relay.close()
    assert log.read_bytes().count(b"\n") == TAIL_LINES + 5
    assert not log.read_bytes().startswith(b"p:")
    assert list(relay.tail) == [b"line %d" % number for number in range(5, TAIL_LINES + 5)]
    assert console.drain().count(b"p:line") == TAIL_LINES + 5


def test_a_closed_reader_ends_the_console_copy_silently(capfd: pytest.CaptureFixture[str]) -> None:
    relay, console = relay_to_pipe(prefix=b"p:")
    os.close(console.read_end)
    relay.feed(b"lost\n")
    relay.feed(b"also lost\n")
    assert capfd.readouterr().err == ""


def test_a_progress_bar_redraws_behind_its_prefix() -> None:
    relay, console = relay_to_pipe(prefix=b"p:")
    relay.feed(b"\r 10%|#")
    relay.feed(b"\r 20%|##")
    assert console.drain() == b"p: 10%|#\r"
    relay.feed(b"\n")
    assert console.drain() == b"p: 20%|##\n"


def test_a_windows_line_end_split_between_two_reads_ends_one_line() -> None:
    relay, console = relay_to_pipe(prefix=b"p:")
    relay.feed(b"first\r")
    relay.feed(b"\nsecond\r\nthird\r")
    relay.feed(b"\n")
    relay.feed(b"\nafter an empty line\n")
    assert console.drain() == b"p:first\r\np:second\r\np:third\r\np:\np:after an empty line\n"


def test_a_log_file_that_refuses_bytes_costs_only_that_file(capfd: pytest.CaptureFixture[str]) -> None:
    relay, console = relay_to_pipe(prefix=b"p:", file="/dev/full")
    relay.feed(b"one\n")
    relay.feed(b"two\n")
    assert console.drain() == b"p:one\np:two\n"
    flush_consoles()
    assert capfd.readouterr().err == (
        "xlarun: cannot write /dev/full: No space left on device; it stops here, the console and the run go on\n"
    )


def test_a_flush_long_after_the_last_write_still_waits_for_what_was_just_queued() -> None:
    console = Console()
    console.writer.write(b"x" * (4 * MAX_PARTIAL_LINE))  # exactly what the pipe holds
    assert console.writer.flush()
    console.writer._progress -= 60  # the last write was a minute ago
    console.writer.write(b"the report\n")  # waits for the reader, who comes 0.3 s later
    reader = threading.Timer(0.3, lambda: drained.append(drain(console.read_end)))
    drained: list[bytes] = []
    reader.start()
    assert console.writer.flush(patience=2.0)
    reader.join()
    assert (drained[0] + drain(console.read_end)).endswith(b"the report\n")
