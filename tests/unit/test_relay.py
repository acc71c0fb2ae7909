"""Unit layer: the stream relay in-process, over a real pipe standing in for the console."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from xlarun.supervision.relay import MAX_PARTIAL_LINE, TAIL_LINES, StreamPlan, StreamRelay


def relay_to_pipe(prefix: bytes = b"", file: str | None = None) -> tuple[StreamRelay, int]:
    """A relay whose console is a pipe large enough to hold what a test writes before reading it."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4 * MAX_PARTIAL_LINE)
    os.set_blocking(read_end, False)
    return StreamRelay(StreamPlan(file=file, console_fd=write_end, prefix=prefix, relay=True)), read_end


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
    assert drain(console) == b"[default0]:one\n"
    relay.feed(b"o\nthree")
    assert drain(console) == b"[default0]:two\n"
    relay.close()
    assert drain(console) == b"[default0]:three\n"


def test_unprefixed_text_passes_at_once() -> None:
    relay, console = relay_to_pipe()
    relay.feed(b"50%\r")
    assert drain(console) == b"50%\r"


def test_an_endless_line_is_cut_rather_than_held() -> None:
    relay, console = relay_to_pipe(prefix=b"> ")
    relay.feed(b"x" * (MAX_PARTIAL_LINE + 1))
    assert drain(console) == b"> " + b"x" * (MAX_PARTIAL_LINE + 1) + b"\n"


def test_the_file_gets_the_bytes_unchanged_and_the_tail_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    relay, console = relay_to_pipe(prefix=b"p:", file=str(log))
    relay.feed(b"".join(b"line %d\n" % number for number in range(TAIL_LINES + 5)))
    relay.close()
    assert log.read_bytes().count(b"\n") == TAIL_LINES + 5
    assert not log.read_bytes().startswith(b"p:")
    assert list(relay.tail) == [b"line %d" % number for number in range(5, TAIL_LINES + 5)]
    assert drain(console).count(b"p:line") == TAIL_LINES + 5


def test_a_closed_reader_ends_the_console_copy_silently(capfd: pytest.CaptureFixture[str]) -> None:
    relay, console = relay_to_pipe(prefix=b"p:")
    os.close(console)
    relay.feed(b"lost\n")
    relay.feed(b"also lost\n")
    assert capfd.readouterr().err == ""
