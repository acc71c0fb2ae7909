"""The runs of this user, one record each, in the state directory.

Usage::

    store = JobStore.from_environ(os.environ)
    job = store.create("3f2a9c01d4e7", command=[...], cwd=os.getcwd())   # before the launcher starts
    store.set_launcher(job.id, pid)                                        # once it runs
    store.set_end(job.id, exit_code=0, result="succeeded")                 # by the launcher, as it ends
    store.find("3f2a").state                                               # "running", "succeeded", ... "lost"

Where: ``$XLARUN_STATE_DIR``, else ``$XDG_STATE_HOME/xlarun``, else ``~/.local/state/xlarun``, with one
directory per run under ``runs/``, named by its id. The directories are mode 0700 and the files 0600: a
run's command line and its console output are its user's alone. A run's facts are written once each,
by the one process that knows them, to a file of their own: ``run.json`` (what was started, by the
caller, before the launcher starts), ``launcher.json`` (the launcher's process: by the caller once it is
started, and by the launcher as it starts, the same facts twice, whichever comes first) and ``end.json``
(how it ended, by the launcher). Each is written whole to a temporary name and
renamed into place, so a reader finds the file whole or not at all; a file that does not parse costs
its run's entry, never another's.

A pid alone would name another process once the launcher is gone and its number reused, so the
launcher is known by its pid, its start time (``/proc/<pid>/stat``'s ``starttime``) and the boot
(``/proc/sys/kernel/random/boot_id``): a run whose launcher is not that process any more, and that
recorded no end, is ``lost`` (the launcher was killed, the host rebooted).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from xlarun.exceptions import UsageError
from xlarun.host.procfs import stat_fields
from xlarun.structs import Struct

STATE_DIR_VARIABLE = "XLARUN_STATE_DIR"
RUNS = "runs"
RUN_FILE = "run.json"
LAUNCHER_FILE = "launcher.json"
END_FILE = "end.json"
CONSOLE_FILE = "console.log"
"""The detached launcher's standard output and error, as a terminal would have shown them."""
SUMMARY_FILE = "summary.json"
"""The run's summary file where the command line names none."""
EVENT_LOG_FILE = "events.jsonl"
"""The run's event log where the command line names none: what ``--status`` reads."""

STATES = ("running", "succeeded", "failed", "signaled", "lost")
START_GRACE_S = 30.0
"""How long a run may go without a recorded launcher before it counts as lost: the caller records the
launcher right after starting it and the launcher itself as it starts, so only a launcher that never
started leaves a run without one."""
KEPT_FINISHED_RUNS = 100
"""The most runs that ended a state directory keeps: recording a new run removes the oldest beyond them."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_ID = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
"""What a run id must be to name a directory of its own (a ``--rdzv-id``, or one made up)."""


class DamagedRecord(Exception):
    """A run's record that cannot be read; the message says which file and why."""


def state_dir(environ: Mapping[str, str]) -> str:
    """The directory of this user's run records (see the module docstring); XDG_STATE_HOME counts only
    when absolute, as the XDG Base Directory specification says."""
    given = environ.get(STATE_DIR_VARIABLE)
    if given:
        return os.path.abspath(given)
    xdg = environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "xlarun")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "xlarun")


def private_directory(path: str) -> str:
    """``path`` made where missing, and mode 0700."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_atomically(path: str, data: bytes) -> None:
    """Put ``data`` at ``path`` whole: written to a new temporary file (mode 0600) beside it, flushed to the
    disk, then renamed over it; a reader finds the old file or the new one."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_json(path: str, value: Mapping[str, Any]) -> None:
    write_atomically(path, (json.dumps(value, indent=2) + "\n").encode())


def read_json(path: str) -> dict[str, Any] | None:
    """The object in ``path``; None where there is no such file. Raises :class:`DamagedRecord` for anything else."""
    try:
        with open(path, "rb") as handle:
            value = json.loads(handle.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise DamagedRecord(f"{path}: {getattr(error, 'strerror', None) or error}") from None
    if not isinstance(value, dict):
        raise DamagedRecord(f"{path}: not a JSON object")
    return value


def boot_id() -> str:
    with open(BOOT_ID) as handle:
        return handle.read().strip()


class LauncherProcess(Struct, frozen=True):
    """A process as it can be told apart from any later one with its pid: pid, start time and boot."""

    pid: int
    start_ticks: int
    """``starttime`` of ``/proc/<pid>/stat``: clock ticks from the boot to the process's start."""
    boot: str

    @classmethod
    def of(cls, pid: int) -> LauncherProcess | None:
        """The running process ``pid``; None where there is none."""
        try:
            _, fields = stat_fields(f"/proc/{pid}/stat")
            return cls(pid, int(fields[22]), boot_id())
        except (OSError, ValueError, IndexError):
            return None

    def alive(self) -> bool:
        """Whether this very process still runs (a zombie has ended: it only waits to be reaped)."""
        try:
            if boot_id() != self.boot:
                return False
            _, fields = stat_fields(f"/proc/{self.pid}/stat")
        except OSError:
            return False
        return int(fields[22]) == self.start_ticks and fields[3] not in (b"Z", b"X")


def state_of(result: str | None, exit_code: int) -> str:
    """A run's state from its summary's ``result`` (where it wrote one) and its exit code."""
    if result == "succeeded" or (result is None and exit_code == 0):
        return "succeeded"
    if result == "signalled":
        return "signaled"
    return "failed"


def iso_time(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Job(Struct, frozen=True):
    """One run as its record says it, read at one moment."""

    id: str
    directory: str
    command: tuple[str, ...]
    """The command line, secrets redacted (as the dry run shows them)."""
    cwd: str
    started: float
    log_dir: str | None
    summary_file: str | None
    event_log: str | None
    launcher: LauncherProcess | None
    end: Mapping[str, Any] | None
    """``exit_code``, ``result`` (the summary's, where it wrote one) and ``ended`` (Unix time)."""
    launcher_alive: bool

    @property
    def state(self) -> str:
        if self.end is not None:
            return state_of(self.end.get("result"), int(self.end["exit_code"]))
        if self.launcher_alive:
            return "running"
        if self.launcher is None and time.time() - self.started < START_GRACE_S:
            return "running"  # the caller is recording its launcher
        return "lost"

    @property
    def exit_code(self) -> int | None:
        return None if self.end is None else int(self.end["exit_code"])

    @property
    def ended(self) -> float | None:
        return None if self.end is None else float(self.end["ended"])

    @property
    def console(self) -> str:
        return os.path.join(self.directory, CONSOLE_FILE)

    def as_json(self) -> dict[str, Any]:
        """The run as ``xlarun --jobs --json`` lists it (docs/jobs.md)."""
        return {
            "id": self.id,
            "state": self.state,
            "exit_code": self.exit_code,
            "started": iso_time(self.started),
            "ended": iso_time(self.ended),
            "command": list(self.command),
            "cwd": self.cwd,
            "pid": None if self.launcher is None else self.launcher.pid,
            "log_dir": self.log_dir,
            "summary_file": self.summary_file,
            "event_log": self.event_log,
            "console": self.console,
        }


class JobStore:
    """The records under one state directory; see the module docstring."""

    def __init__(self, root: str):
        self.root = root
        self.runs = os.path.join(root, RUNS)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> JobStore:
        return cls(state_dir(environ))

    def directory(self, job_id: str) -> str:
        return os.path.join(self.runs, job_id)

    def create(
        self,
        job_id: str,
        command: Sequence[str],
        cwd: str,
        *,
        log_dir: str | None = None,
        summary_file: str | None = None,
        event_log: str | None = None,
    ) -> Job:
        """A new run's record, before its launcher starts. A finished run of the same id gives way to it;
        a running one refuses it (:class:`UsageError`)."""
        if not re.fullmatch(_ID, job_id):
            raise UsageError(
                f"run id {job_id!r} cannot name a run you can leave: letters, digits, '_', '.' and '-' only"
            )
        private_directory(self.root)
        private_directory(self.runs)
        directory = self.directory(job_id)
        if os.path.lexists(directory):
            with contextlib.suppress(DamagedRecord):
                if self.load(job_id).state == "running":
                    raise UsageError(f"a run with id {job_id} is running: give another id, or stop it first")
            shutil.rmtree(directory, ignore_errors=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            raise UsageError(f"a run with id {job_id} is starting at this moment: give another id") from None
        write_json(
            os.path.join(directory, RUN_FILE),
            {
                "id": job_id,
                "command": list(command),
                "cwd": cwd,
                "started": time.time(),
                "log_dir": log_dir,
                "summary_file": summary_file,
                "event_log": event_log,
            },
        )
        self.remove_finished(keep=KEPT_FINISHED_RUNS)
        return self.load(job_id)

    def remove_finished(self, keep: int = 0) -> list[Job]:
        """Remove the records of the runs that are not running, but the newest ``keep`` of them; those removed."""
        finished = [job for job in self.jobs()[0] if job.state != "running"]
        for job in finished[keep:]:
            self.remove(job)
        return finished[keep:]

    def set_launcher(self, job_id: str, pid: int) -> None:
        """Record the run's launcher: ``pid``, which must be running."""
        process = LauncherProcess.of(pid)
        if process is not None:
            write_json(
                os.path.join(self.directory(job_id), LAUNCHER_FILE),
                {"pid": process.pid, "start_ticks": process.start_ticks, "boot_id": process.boot},
            )

    def set_end(self, job_id: str, exit_code: int, result: str | None) -> None:
        write_json(
            os.path.join(self.directory(job_id), END_FILE),
            {"exit_code": exit_code, "result": result, "ended": time.time()},
        )

    def load(self, job_id: str) -> Job:
        """The run ``job_id`` as recorded now. Raises :class:`DamagedRecord` for a record that does not read,
        :class:`FileNotFoundError` for none."""
        directory = self.directory(job_id)
        run = read_json(os.path.join(directory, RUN_FILE))
        if run is None:
            raise FileNotFoundError(os.path.join(directory, RUN_FILE))
        launcher = read_json(os.path.join(directory, LAUNCHER_FILE))
        end = read_json(os.path.join(directory, END_FILE))
        try:
            process = (
                None
                if launcher is None
                else LauncherProcess(int(launcher["pid"]), int(launcher["start_ticks"]), str(launcher["boot_id"]))
            )
            if end is not None:
                int(end["exit_code"]), float(end["ended"])
            return Job(
                id=str(run["id"]),
                directory=directory,
                command=tuple(str(word) for word in run["command"]),
                cwd=str(run["cwd"]),
                started=float(run["started"]),
                log_dir=run.get("log_dir"),
                summary_file=run.get("summary_file"),
                event_log=run.get("event_log"),
                launcher=process,
                end=end,
                launcher_alive=end is None and process is not None and process.alive(),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise DamagedRecord(f"{directory}: a record lacks or garbles {error}") from None

    def jobs(self) -> tuple[list[Job], list[str]]:
        """Every recorded run, newest first, and one line for each record that does not read."""
        try:
            names = os.listdir(self.runs)
        except FileNotFoundError:
            return [], []
        found: list[Job] = []
        damaged: list[str] = []
        for name in names:
            if name.startswith("."):
                continue
            try:
                found.append(self.load(name))
            except FileNotFoundError:
                continue  # being created, or removed, at this moment
            except DamagedRecord as error:
                damaged.append(f"the record of run {name} is damaged, left out: {error}")
        found.sort(key=lambda job: job.started, reverse=True)
        return found, damaged

    def find(self, prefix: str) -> Job:
        """The run whose id is ``prefix``, else the one whose id starts with it. Raises :class:`UsageError` for
        none, several, or a damaged record."""
        names = [] if not os.path.isdir(self.runs) else os.listdir(self.runs)
        matches = [prefix] if prefix in names else [name for name in names if name.startswith(prefix)]
        matches = [name for name in matches if not name.startswith(".")]
        if not prefix or not matches:
            raise UsageError(f"no run {prefix!r} in {self.runs} (xlarun --jobs lists them)")
        if len(matches) > 1:
            raise UsageError(f"run id {prefix!r} is ambiguous: it starts {', '.join(sorted(matches))}")
        try:
            return self.load(matches[0])
        except FileNotFoundError:
            raise UsageError(f"no run {prefix!r} in {self.runs} (xlarun --jobs lists them)") from None
        except DamagedRecord as error:
            raise UsageError(f"the record of run {matches[0]} is damaged: {error}") from None

    def remove(self, job: Job) -> None:
        shutil.rmtree(job.directory, ignore_errors=True)
