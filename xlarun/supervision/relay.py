"""The stream relay: a worker's pipe copied to its log file and the console, whole lines at a time.

The launcher relays a worker's stderr (unchanged) instead of handing it the terminal, so the
failure report can quote the last lines even when the worker never wrote an error file. The
console side goes through the launcher's own writers (:mod:`xlarun.console`), which never block.
:class:`StreamPlan` says where one stream goes (the log plan, :mod:`xlarun.supervision.logs`,
decides it), :class:`MatchingLines` where a tee'd stream's matching lines are copied too
(torchrun's ``--duplicate-*-filters``). :class:`PipeReaders` reads the workers' pipes into their
relays from the event loop, and holds back a pipe while its console is too far behind.
"""

from __future__ import annotations

import os
import re
import selectors
import time
from collections import deque
from collections.abc import Callable, Mapping

from xlarun.console import ConsoleWriter, console, say
from xlarun.contract import STEP_LOG_VARIABLE
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import IO, BinaryIO, TypeAlias

TAIL_LINES = 200
"""The last stderr lines kept of each worker: enough for a traceback of a deep stack, chained
exceptions and all, which the failure report quotes whole (:func:`xlarun.failures.stderr_excerpt`)."""
# A worker that never ends a line (progress bars) still gets its text out in bounded pieces.
MAX_PARTIAL_LINE = 64 * 1024


class MatchingLines(Struct, frozen=True):
    """The attempt's file that receives every tee'd line holding one of ``needles``, behind its prefix.

    All the workers of an attempt append to it, each a whole line at a time (one ``write`` of a
    file opened ``O_APPEND``), so their lines never mix.
    """

    path: str
    needles: tuple[str, ...]


class StreamPlan(Struct, frozen=True):
    """Where one worker stream goes. ``file`` and ``console_fd`` may both be set (tee)."""

    file: str | None = None
    console_fd: int | None = None
    prefix: bytes = b""
    relay: bool = False
    matching: MatchingLines | None = None
    step_log: bool = False
    """The stream carries torch_xla's step log (:class:`StepLog`): its lines are counted and dropped."""
    steps_file: str | None = None
    """Where the step log's count is kept while the worker runs, for ``xlarun --status`` (:class:`StepTally`)."""
    whole_lines: bool = False
    """Unprefixed console text goes out in whole lines too, as prefixed text does."""


class WorkerLogPlan(Struct, frozen=True):
    directory: str
    error_file: str
    stdout: StreamPlan
    stderr: StreamPlan
    stacks_file: str = ""
    """Where the worker's Python writes its stacks when asked (:mod:`xlarun.contract`)."""


LINE_END = rb"[^\r\n]*(?:\r\n|\r|\n)"
"""One piece of a prefixed stream as the console shows it: up to a newline, or up to a carriage
return, with which a progress bar redraws its line."""


class LogFile:
    """A file the relay appends to. One that refuses bytes (a full disk, a quota) costs that file, not
    the run: one line, and nothing more is written to it."""

    def __init__(self, path: str):
        self.path = path
        self._handle: BinaryIO | None = open(path, "ab", buffering=0)

    def write(self, data: bytes) -> None:
        if self._handle is None:
            return
        try:
            self._handle.write(data)
        except OSError as error:
            say(f"cannot write {self.path}: {error.strerror or error}; it stops here, the console and the run go on")
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass  # the fault write() reported; the file is given up either way
            self._handle = None


class MatchingCopy:
    """Copies the lines of one stream that hold a needle to :class:`MatchingLines`' file, as torchrun does.

    torchrun reads the tee'd log file as text (universal newlines, undecodable bytes replaced) and
    writes each matching line behind the worker's prefix with a newline; so does this, from the
    bytes as they come. A carriage return at the end of what came so far waits for the next byte,
    which may make it ``\r\n``; an unended last line is written, with a newline, at the end.
    """

    def __init__(self, matching: MatchingLines, prefix: bytes):
        self._file = LogFile(matching.path)
        self._needles = matching.needles
        self._prefix = prefix.decode(errors="replace")
        self._pending = b""

    def feed(self, data: bytes) -> None:
        text = self._pending + data
        end = len(text) - 1 if text.endswith(b"\r") else len(text)
        ended = max(text.rfind(b"\n", 0, end), text.rfind(b"\r", 0, end)) + 1
        self._copy(re.compile(LINE_END).findall(text, 0, ended))
        self._pending = text[ended:]

    def close(self) -> None:
        if self._pending:
            self._copy([self._pending])
            self._pending = b""
        self._file.close()

    def _copy(self, pieces: list[bytes]) -> None:
        lines = (piece.rstrip(b"\r\n").decode(errors="replace") + "\n" for piece in pieces)
        matching = "".join(self._prefix + line for line in lines if any(needle in line for needle in self._needles))
        if matching:
            self._file.write(matching.encode(errors="replace"))


STEP_LINES = (b"torch_xla.torch_xla::sync\n", b"torch_xla.core.xla_model::mark_step\n")
"""The line torch_xla prints on stderr at each step under ``XLA_EMIT_STEPLOG=1``: ``torch_xla.sync``'s
(2.5 and later; ``xla_model.mark_step`` calls it), and ``xla_model.mark_step``'s before."""


def step_log_on(variables: Mapping[str, str]) -> bool:
    """Whether xlarun switched torch_xla's step log on: ``variables`` are what xlarun sets for a worker,
    not the environment it inherits, as a step log the user asked for is the user's output (torch_xla
    reads the variable as ``bool(int(value))``)."""
    try:
        return bool(int(variables.get(STEP_LOG_VARIABLE, "0")))
    except ValueError:
        return False


STEP_MARK = b"torch_xla."
"""What every step line holds: a stream without it passes at once."""
_STEP_LINE = rb"(?m)^(?:" + rb"|".join(re.escape(line) for line in STEP_LINES) + rb")"


STEPS_FILE = "steps"
"""The name of a worker's :class:`StepTally`, beside its logs and its stack-dump file."""


class StepTally:
    """A worker's step count, kept in a file for ``xlarun --status`` to read while the run goes on.

    One line, ``STEPS TIME BASE_STEPS BASE_TIME`` (Unix seconds): the count now and the count about
    :data:`RATE_WINDOW_S` seconds before, whose difference over the time between is the worker's recent
    steps per second. Written at most once every :data:`WRITE_EVERY_S` seconds, each time whole (a temporary
    file renamed over it), so a fast step log costs a write a second and a reader never sees part of one;
    a file that cannot be written costs the count, never the run.
    """

    WRITE_EVERY_S = 1.0
    RATE_WINDOW_S = 30.0

    def __init__(self, path: str):
        self.path = path
        self._samples: deque[tuple[float, int]] = deque()
        self._written_at = 0.0

    def record(self, steps: int) -> None:
        now = time.time()
        if now - self._written_at < self.WRITE_EVERY_S:
            return
        self._written_at = now
        self._samples.append((now, steps))
        while len(self._samples) > 1 and now - self._samples[0][0] > self.RATE_WINDOW_S:
            self._samples.popleft()
        base_time, base_steps = self._samples[0]
        temporary = f"{self.path}.tmp"
        try:
            with open(temporary, "w") as handle:
                handle.write(f"{steps} {now:.3f} {base_steps} {base_time:.3f}\n")
            os.replace(temporary, self.path)
        except OSError:
            pass


class StepLog:
    """Takes torch_xla's step-log lines out of a stream and counts them.

    Each line is printed whole, in one write, at the start of a line; the rest of the stream passes
    unchanged. An unended tail that could still become a step line waits for the next bytes.
    ``tally``: where the count is kept while the worker runs, if anywhere.
    """

    def __init__(self, tally: StepTally | None = None) -> None:
        self.steps = 0
        self._tally = tally
        self._held = b""
        self._at_line_start = True

    def strip(self, data: bytes) -> bytes:
        text, self._held = self._held + data, b""
        tail_start = text.rfind(b"\n") + 1
        tail = text[tail_start:]
        if tail and (tail_start > 0 or self._at_line_start) and any(step.startswith(tail) for step in STEP_LINES):
            self._held, text = tail, text[:tail_start]
        if not text:
            return b""
        # What comes next starts a line: the held tail does, or this text ended one.
        at_line_start, self._at_line_start = self._at_line_start, bool(self._held) or text.endswith(b"\n")
        if STEP_MARK not in text:
            return text  # no step line here: one search, not a look at every line
        first = 0
        if not at_line_start:
            # A first line that continues one already begun is the stream's own, whatever it says.
            first = text.find(b"\n") + 1
            if not first:
                return text
        rest, steps = re.subn(_STEP_LINE, b"", text[first:])
        self.steps += steps
        if steps and self._tally is not None:
            self._tally.record(self.steps)
        return text[:first] + rest

    def close(self) -> bytes:
        """What is still held back: it never became a step line."""
        held, self._held = self._held, b""
        return held


class StreamRelay:
    """Copies a worker's pipe to its log file and the console.

    The file gets the bytes unchanged. Prefixed console text goes out in whole pieces, each
    ended by a newline or a carriage return and each behind the prefix, so two workers' text
    never shares a line and a progress bar redraws with its prefix at the start of the line;
    unprefixed text passes through at once, unless the plan asks for whole lines. The console is a :class:`~xlarun.console.ConsoleWriter`,
    which never blocks: while it is :attr:`paused` the caller stops reading the pipe.
    """

    def __init__(self, plan: StreamPlan, writer: ConsoleWriter | None = None):
        self._file = LogFile(plan.file) if plan.file else None
        self._matching = MatchingCopy(plan.matching, plan.prefix) if plan.matching else None
        self._console = writer or (console(plan.console_fd) if plan.console_fd is not None else None)
        self._prefix = plan.prefix
        self._whole_lines = plan.whole_lines
        self._partial = b""
        self._unshown = b""
        self._after_carriage_return = False
        """The console's last piece ended with ``\r``: a ``\n`` that comes next ends that line (``\r\n``)."""
        self.tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self.step_log = StepLog(StepTally(plan.steps_file) if plan.steps_file else None) if plan.step_log else None

    @property
    def paused(self) -> bool:
        """The console is too far behind: stop reading the pipe until it catches up."""
        return self._console is not None and self._console.full

    @property
    def console_writer(self) -> ConsoleWriter | None:
        return self._console

    def feed(self, data: bytes) -> None:
        if self.step_log is not None:
            data = self.step_log.strip(data)
            if not data:
                return
        if self._file is not None:
            self._file.write(data)
        if self._matching is not None:
            self._matching.feed(data)
        if self._console is not None:
            if self._prefix or self._whole_lines:
                self._to_console_prefixed(data)
            else:
                self._console.write(data)
        # Split off only the last lines: the ones before them never reach the tail.
        lines = (self._partial + data).rsplit(b"\n", TAIL_LINES + 1)
        self._partial = lines.pop()
        if len(self._partial) > MAX_PARTIAL_LINE:
            lines.append(self._partial)
            self._partial = b""
        self.tail.extend(lines[-TAIL_LINES:])

    def close(self) -> None:
        if self.step_log is not None and (held := self.step_log.close()):
            # Bytes held back as a possible step line, which never came: the stream's own.
            steps, self.step_log = self.step_log, None
            self.feed(held)
            self.step_log = steps
        if self._partial:
            self.tail.append(self._partial)
            self._partial = b""
        if self._unshown and self._console is not None:
            self._console.write(self._prefix + self._unshown + b"\n")
        self._unshown = b""
        for log in (self._file, self._matching):
            if log is not None:
                log.close()
        self._file = self._matching = None

    def _to_console_prefixed(self, data: bytes) -> None:
        assert self._console is not None
        text = self._unshown + data
        # The \n of a \r\n split between two reads ends the line the \r left, behind no prefix of its own.
        lead = b""
        if self._after_carriage_return and not self._unshown and text.startswith(b"\n"):
            lead, text = b"\n", text[1:]
            self._after_carriage_return = False
        # Only up to the last line end: a search from every offset of an unended tail costs its square.
        shown = max(text.rfind(b"\n"), text.rfind(b"\r")) + 1
        if b"\r" not in text and len(text) - shown <= MAX_PARTIAL_LINE:
            # Plain lines, the common case: one replace puts the prefix behind every newline.
            self._unshown = text[shown:]
            if shown:
                lead += self._prefix + text[: shown - 1].replace(b"\n", b"\n" + self._prefix) + b"\n"
                self._after_carriage_return = False
            if lead:
                self._console.write(lead)
            return
        pieces = re.compile(LINE_END).findall(text, 0, shown)
        self._unshown = text[shown:]
        if len(self._unshown) > MAX_PARTIAL_LINE:
            # A worker that never ends a line still gets its text out, in bounded pieces.
            pieces.append(self._unshown + b"\n")
            self._unshown = b""
        # A lone carriage return at the start of a line (where each piece leaves the cursor) moves nothing.
        shown_pieces = [piece for piece in pieces if piece != b"\r"]
        if shown_pieces:
            self._after_carriage_return = shown_pieces[-1].endswith(b"\r")
        if lead or shown_pieces:
            self._console.write(lead + b"".join(self._prefix + piece for piece in shown_pieces))


READ_CHUNK = 64 * 1024

Pipe: TypeAlias = "tuple[IO[bytes], Callable[[], bool]]"
"""A worker's output pipe and the reader that copies what it holds to the stream's relay."""


class PipeReaders:
    """Reads the workers' pipes into their relays from an event loop's selector, with back-pressure.

    Each pipe's reader is the selector's callback for it. While a relay's console is too far
    behind (:attr:`StreamRelay.paused`), the pipes that feed it leave the selector: the worker then
    waits in its own write, and the loop goes on watching exits, signals and stops. The console's
    :attr:`~xlarun.console.ConsoleWriter.space_fd` joins the selector instead, and once it turns
    readable the paused pipes are read again. ``on_data`` hears of every chunk read;
    :meth:`held_back` says which consoles hold pipes back (their time is no worker's silence).
    """

    def __init__(self, selector: selectors.BaseSelector, on_data: Callable[[], None] | None = None):
        self._selector = selector
        self._on_data = on_data
        self._paused: dict[IO[bytes], tuple[Callable[[], bool], int]] = {}
        """Pipes left unread while their console catches up, with their readers and the console's descriptor."""
        self._space_watched: set[int] = set()

    def add(self, pipe: IO[bytes], relay: StreamRelay) -> Callable[[], bool]:
        """Watch ``pipe``; returns its reader, which copies what the pipe holds now and says whether
        it read anything (False once it is empty for the moment or closed)."""
        fd = pipe.fileno()
        os.set_blocking(fd, False)

        def read() -> bool:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return False
            if data:
                if self._on_data is not None:
                    self._on_data()
                relay.feed(data)
                if relay.paused and pipe not in self._paused:
                    self._pause(pipe, read, relay)
                return True
            if pipe in self._paused:
                del self._paused[pipe]
            else:
                self._selector.unregister(pipe)
            pipe.close()
            relay.close()
            return False

        self._selector.register(pipe, selectors.EVENT_READ, read)
        return read

    def close(self) -> None:
        """Close the pipes held back (those in the selector are its owner's to close)."""
        for pipe in self._paused:
            pipe.close()
        self._paused.clear()

    def _pause(self, pipe: IO[bytes], read: Callable[[], bool], relay: StreamRelay) -> None:
        self._selector.unregister(pipe)
        writer = relay.console_writer
        assert writer is not None
        self._paused[pipe] = read, writer.fd
        if writer.space_fd not in self._space_watched:
            self._space_watched.add(writer.space_fd)
            self._selector.register(writer.space_fd, selectors.EVENT_READ, lambda: self._resume(writer))

    def _resume(self, writer: ConsoleWriter) -> None:
        """The console caught up: its paused pipes are read again."""
        writer.take_space()
        if writer.full:
            return
        for pipe, (read, fd) in list(self._paused.items()):
            if fd == writer.fd:
                del self._paused[pipe]
                self._selector.register(pipe, selectors.EVENT_READ, read)

    def held_back(self) -> list[int]:
        """The console descriptors (1, 2) whose readers are too far behind: workers wait to write to them."""
        return sorted({fd for _, fd in self._paused.values()})


def drain(pipes: list[Pipe]) -> None:
    """Read each pipe to its end (its writers are gone), paused or not."""
    for pipe, read in pipes:
        while not pipe.closed and read():
            pass


def read_tail(path: str | None, limit: int = TAIL_LINES) -> list[str]:
    """The last lines of a log file (for a redirected stream), or nothing."""
    if not path:
        return []
    try:
        # The worker owns the directory: a link it planted there is not followed.
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except OSError:
        return []
    return [line.decode(errors="replace") for line in data.splitlines()[-limit:]]
