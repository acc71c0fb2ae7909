"""Every worker's Python stacks, on demand: asked for, read back and summed up in one line.

Usage::

    dumps = dump_stacks([StackTarget(rank=0, pid=pid, path=".../attempt_0/0/stacks.txt")])
    positions = {rank: where(text) for rank, text in dumps.items()}
    say(describe_positions(positions))   # rank 2: load_batch (train.py:11) · ranks 0-1,3: all_reduce (train.py:20)
    taken = snapshot(targets)             # a hung group's: where each stood, which dumps came

A worker's Python armed :mod:`faulthandler` at start (:mod:`xlarun.contract`); a dump is one
signal to it and a read of what it appended to its file. No ptrace is involved, so this works
where py-spy is refused (Docker without SYS_PTRACE, Kubernetes' restricted pods, Yama's
``ptrace_scope=1``). :func:`launch_workers` finds the workers of a running launch for
``xlarun --stacks``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO

from xlarun.contract import ERROR_FILE_VARIABLE, STACKS_DESCRIPTOR, STACKS_SIGNAL, STACKS_VARIABLE, stacks_file
from xlarun.host.procfs import process_owner, process_stats, started_environ
from xlarun.structs import Struct

DUMP_WAIT = 3.0
"""How long a dump may take to appear: the handler writes it at once, unless the process is stopped."""
_SETTLE = 0.05
"""A dump is whole once its file stopped growing for this long (the handler writes it in many small writes)."""
MAX_DUMP_BYTES = 256 * 1024
"""The most of one dump read back: faulthandler prints at most 100 frames per thread and 100 threads."""
UNKNOWN = "no stack (its Python did not arm the dump, or closed its file)"

_FRAME = r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<function>.*)$'
_LIBRARY = r"/lib/python\d+(\.\d+)?t?/|/site-packages/|/dist-packages/|^<"
"""Where a frame is not the user's own: the standard library, installed packages, frozen modules."""
_ATTEMPT = r"attempt_\d+"
"""The name of an attempt's log directory, which holds each worker's (:mod:`xlarun.supervision.logs`)."""


class StackTarget(Struct, frozen=True):
    rank: int
    pid: int
    path: str
    """The worker's dump file."""


def is_armed(target: StackTarget) -> bool:
    """Whether the target's dump may be asked for: its process catches :data:`~xlarun.contract.STACKS_SIGNAL`
    (its ``SigCgt`` mask says so) and still holds its dump file at :data:`~xlarun.contract.STACKS_DESCRIPTOR`,
    where the handler writes (a process that closed it may hold a file of its own there)."""
    try:
        with open(f"/proc/{target.pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigCgt:"):
                    catches = bool(int(line.split()[1], 16) >> (int(STACKS_SIGNAL) - 1) & 1)
                    return catches and _dump_file_held(target, os.stat(target.path, follow_symlinks=False))
    except (OSError, ValueError):
        pass
    return False


def _dump_file_held(target: StackTarget, found: os.stat_result) -> bool:
    """Whether ``found`` is the regular file the target's process holds at its dump descriptor."""
    try:
        held = os.stat(f"/proc/{target.pid}/fd/{STACKS_DESCRIPTOR}")
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and (held.st_dev, held.st_ino) == (found.st_dev, found.st_ino)


def dump_stacks(
    targets: Iterable[StackTarget], wait: float = DUMP_WAIT, cancel: threading.Event | None = None
) -> dict[int, str]:
    """Ask every armed target for its stacks at once and read each dump back, by rank.

    A target that is not armed, has gone, or wrote nothing within ``wait`` seconds (or before
    ``cancel`` was set) is left out.
    """
    pending: list[_Dump] = []
    for target in targets:
        if not is_armed(target):
            continue
        dump = _Dump(target, _size(target.path), time.monotonic())
        try:
            os.kill(target.pid, STACKS_SIGNAL)
        except OSError:
            continue
        pending.append(dump)
    dumps: dict[int, str] = {}
    deadline = time.monotonic() + wait
    while pending and time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
        time.sleep(0.01)
        for dump in list(pending):
            if dump.settled():
                dumps[dump.target.rank] = _read_from(dump.target, dump.before)
                pending.remove(dump)
    return dict(sorted(dumps.items()))


class _Dump(Struct):
    """One dump asked for: the file's size before it, and since when the file has kept its size."""

    target: StackTarget
    before: int
    unchanged_since: float
    size: int = -1

    def settled(self) -> bool:
        """The dump came and its file stopped growing (the handler writes it in many small writes)."""
        size, now = _size(self.target.path), time.monotonic()
        if size != self.size:
            self.size, self.unchanged_since = size, now
            return False
        return size > self.before and now - self.unchanged_since >= _SETTLE


NATIVE_WAIT = 20.0
"""How long py-spy may take for all the workers together (it reads each process's memory and symbols)."""


def py_spy() -> str | None:
    """py-spy, where it is installed: on PATH or beside the launcher's Python (a virtualenv's bin)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def native_stacks(
    pids: Iterable[int], wait: float = NATIVE_WAIT, cancel: threading.Event | None = None
) -> dict[int, str]:
    """``py-spy dump --native`` of each process, by pid, all at once: the frames inside C and C++
    (gloo, NCCL, libtpu) that faulthandler cannot see. Empty where py-spy is not installed; a process
    py-spy may not trace (no ptrace rights) gets py-spy's own line saying why.

    Each py-spy writes to a file of its own, in a session of its own: once it ended, or outlived
    ``wait`` (or ``cancel``), its session is killed with whatever it left there, and what it wrote
    is read without waiting for a pipe's end, which a child it left behind could hold open for good."""
    program = py_spy()
    if program is None:
        return {}
    cancel = cancel or threading.Event()
    running: dict[int, tuple[subprocess.Popen[bytes], IO[bytes]]] = {}
    for pid in pids:
        output: IO[bytes] = tempfile.TemporaryFile()
        running[pid] = (
            subprocess.Popen(
                [program, "dump", "--native", "--pid", str(pid)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            output,
        )
    deadline = time.monotonic() + wait
    found: dict[int, str] = {}
    for pid, (process, output) in running.items():
        while process.poll() is None and time.monotonic() < deadline and not cancel.is_set():
            cancel.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        late = process.poll() is None
        try:
            # py-spy, if late, and anything it left behind: the group's number stays taken while it has members.
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass  # nothing is left of it
        process.wait()
        with output:
            output.seek(0)
            text = output.read(MAX_DUMP_BYTES).decode(errors="replace").strip()
        if late:
            text += f"\n(py-spy gave no dump within {wait:g} s)"
        found[pid] = text
    return found


def append_native(path: str, text: str) -> None:
    """Add py-spy's dump after faulthandler's in a worker's dump file."""
    try:
        with open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC), "a") as handle:
            handle.write(f"\n--- py-spy dump --native ---\n{text}\n")
    except OSError:
        pass  # the worker's directory is gone or refuses: the Python stacks are there already


class Snapshot(Struct, frozen=True):
    """Where each worker of a hung group stood, from the stacks it dumped."""

    positions: dict[int, str]
    """Every target, by rank: :func:`where` its dump shows, or :data:`UNKNOWN` where none came."""
    stacks_files: dict[int, str]
    """The dump file of each rank whose dump came."""


def snapshot(targets: list[StackTarget], cancel: threading.Event | None = None) -> Snapshot:
    """Every target's Python stacks, taken at once and summed up, in the targets' order."""
    dumps = dump_stacks(targets, cancel=cancel)
    return Snapshot(
        {target.rank: where(dumps[target.rank]) if target.rank in dumps else UNKNOWN for target in targets},
        {target.rank: target.path for target in targets if target.rank in dumps},
    )


def add_native_stacks(targets: list[StackTarget], cancel: threading.Event | None = None) -> None:
    """py-spy's native frames after the Python ones in each target's dump file, where py-spy is
    installed (:func:`native_stacks`); nothing once ``cancel`` is set."""
    natives = native_stacks((target.pid for target in targets), cancel=cancel)
    for target in targets:
        if target.pid in natives and not (cancel is not None and cancel.is_set()):
            append_native(target.path, natives[target.pid])


class StackTaking:
    """A hung group's stacks, taken on a thread of its own, so that the event loop goes on seeing
    signals, exits and stop requests meanwhile (a dump may take :data:`DUMP_WAIT` seconds, py-spy
    :data:`NATIVE_WAIT`).

    First every target's Python stacks (:func:`snapshot`), then py-spy's native frames after them
    (:func:`add_native_stacks`). :attr:`fd` turns readable as each part is done: :attr:`taken` is set
    after the first, :attr:`done` after the second. :meth:`cancel` ends what still runs at once: py-spy
    is killed with its children, and nothing more is written.
    """

    def __init__(self, targets: list[StackTarget]):
        self.targets = targets
        self.taken: Snapshot | None = None
        self.done = False
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._take, name="xlarun-stacks", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        try:
            self.taken = snapshot(self.targets, self._cancel)
            os.write(self._write_fd, b"p")
            add_native_stacks(self.targets, self._cancel)
        finally:
            self.done = True
            os.write(self._write_fd, b"n")

    def read_events(self) -> None:
        """Empty :attr:`fd`; :attr:`taken` and :attr:`done` say what happened."""
        try:
            os.read(self.fd, 16)
        except BlockingIOError:
            pass

    def cancel(self) -> None:
        """Stop taking stacks and wait for the thread, which then ends at once; close the descriptors."""
        self._cancel.set()
        self._thread.join()
        os.close(self.fd)
        os.close(self._write_fd)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_from(target: StackTarget, offset: int) -> str:
    """The target's dump from ``offset`` on; empty unless the file read is the one its process holds
    at its dump descriptor (a path another user's process names may lead to any file)."""
    try:
        with open(os.open(target.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            if not _dump_file_held(target, os.fstat(handle.fileno())):
                return ""
            handle.seek(offset)
            return handle.read(MAX_DUMP_BYTES).decode(errors="replace")
    except OSError:
        return ""


class Frame(Struct, frozen=True):
    file: str
    line: str
    function: str

    @property
    def is_users(self) -> bool:
        return not re.search(_LIBRARY, self.file)


def main_thread(dump: str) -> list[Frame]:
    """The main thread's frames in one faulthandler dump, innermost first.

    faulthandler lists the threads newest first, so the main thread, the oldest, comes last.
    """
    threads: list[list[Frame]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
        elif (found := re.match(_FRAME, line)) and threads:
            threads[-1].append(Frame(found["file"], found["line"], found["function"]))
    return threads[-1] if threads else []


def where(dump: str) -> str:
    """Where a worker stands, from its dump: the function its main thread is in, at the innermost line
    of the user's own code, e.g. ``all_reduce (train.py:20)``."""
    frames = main_thread(dump)
    if not frames:
        return UNKNOWN
    own = next((frame for frame in frames if frame.is_users), None)
    function = frames[0].function
    if own is None:
        return f"{function} ({os.path.basename(frames[0].file)}:{frames[0].line})"
    return f"{function} ({os.path.basename(own.file)}:{own.line})"


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 3]`` as ``0-1,3``."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def describe_positions(positions: Mapping[int, str]) -> str:
    """The ranks grouped by where they stand, the smallest groups (the odd ones out) first:
    ``rank 2: load_batch (train.py:11) · ranks 0-1,3: all_reduce (train.py:20)``."""
    groups: dict[str, list[int]] = {}
    for rank, position in sorted(positions.items()):
        groups.setdefault(position, []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[1][0]))
    return " · ".join(
        f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}: {position}" for position, ranks in ordered
    )


class LiveWorker(Struct, frozen=True):
    pid: int
    rank: int
    local_rank: int
    stacks_file: str


def launch_workers(launcher: int | None) -> tuple[int, list[LiveWorker]]:
    """The launcher's pid and its workers, found in /proc: processes started with a dump file whose
    parent was not (``launcher`` None: the only such launcher on this host).

    Only one user's processes count, the caller's, or where the caller names a launcher and is
    root, the launcher's user: any user may put the variable in a process's environment, and what
    a launch names is signalled and read. A worker's dump file must lie where xlarun puts it
    (:func:`_dump_path`), else the worker is not xlarun's.

    Raises :class:`LookupError` with the line to show when there is none, or several to choose from.
    """
    not_a_launcher = f"process {launcher} is not an xlarun launcher with running workers"
    owner = os.geteuid()
    if launcher is not None and owner == 0:
        named_owner = process_owner(launcher)
        if named_owner is None:
            raise LookupError(not_a_launcher)
        owner = named_owner
    by_launcher: dict[int, list[LiveWorker]] = {}
    armed_pids: set[int] = set()
    for pid, fields in process_stats():
        environ = started_environ(f"/proc/{pid}/environ")
        if STACKS_VARIABLE not in environ or process_owner(pid) != owner:
            continue
        armed_pids.add(pid)
        path = _dump_path(environ)
        if path is None:
            continue
        worker = LiveWorker(
            pid=pid,
            rank=_integer(environ.get("RANK")),
            local_rank=_integer(environ.get("LOCAL_RANK")),
            stacks_file=path,
        )
        by_launcher.setdefault(int(fields[4]), []).append(worker)
    # A worker's own Python children inherit nothing of the hook, but a --no-python worker's do.
    launchers = {
        parent: workers
        for parent, workers in by_launcher.items()
        if parent not in armed_pids and process_owner(parent) == owner
    }
    if launcher is not None:
        if launcher not in launchers:
            raise LookupError(not_a_launcher)
        return launcher, sorted(launchers[launcher], key=lambda worker: worker.rank)
    if not launchers:
        raise LookupError("no running xlarun launch on this host (or none of its workers is this user's)")
    if len(launchers) > 1:
        raise LookupError(
            f"several xlarun launches run on this host (launcher pids "
            f"{', '.join(map(str, sorted(launchers)))}): give one, as xlarun --stacks PID"
        )
    ((parent, workers),) = launchers.items()
    return parent, sorted(workers, key=lambda worker: worker.rank)


def _dump_path(environ: Mapping[str, str]) -> str | None:
    """The dump file a worker's environment names, where it lies where xlarun puts it: beside the
    worker's error file, in its run's ``attempt_<n>/<local rank>/`` (the launcher's local rank, which
    ``--virtual-local-rank`` hides from ``LOCAL_RANK``), by a path without ``..``; else ``None``."""
    path = environ[STACKS_VARIABLE].partition(":")[2]
    directory = os.path.dirname(path)
    if (
        not os.path.isabs(path)
        or os.path.normpath(path) != path
        or path != stacks_file(os.path.dirname(environ.get(ERROR_FILE_VARIABLE, "")))
        or not os.path.basename(directory).isdigit()
        or not re.fullmatch(_ATTEMPT, os.path.basename(os.path.dirname(directory)))
    ):
        return None
    return path


def _integer(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else -1
