"""``xlarun.launch()``: the command's launch, from Python and notebooks.

Usage::

    import xlarun

    result = xlarun.launch(fn, 1, 2, nproc_per_node=4, device="cpu")   # fn(1, 2) on every worker
    result.values        # what each rank returned, in rank order
    xlarun.launch("train.py", "--epochs", "3", nproc_per_node=2)         # a script and its arguments
    xlarun.launch(["-m", "pkg.train", "--epochs", "3"], standalone=True)  # a module

One engine: the keyword arguments are the command line's options in Python spelling, read by the
same option table (a refusal is a :class:`ValueError` with the command's line), and the run is
:func:`xlarun.launching.node.run_launch`'s: the same planning, preflight, supervision, orphan guard
(with the caller as the launcher), report and summary. With ``hosts=[...]`` (or ``hostfile=``,
``tpu_pod=``) the run is the command's fan-out (:func:`xlarun.launching.hosts.launch_hosts`, docs/hosts.md),
and the summary is the fan-out's; a :class:`WorkerFailed` lists every failed worker the hosts'
summaries list, the root cause first, each on its host as the caller named it.

Workers are fresh interpreters, never forks of the caller: ``python -m xlarun.worker.call PAYLOAD``
(:mod:`xlarun.worker.call`). The payload, a file in the launch's private directory (mode 0700,
removed afterwards; for a job on several hosts, one under the job's working directory, ``remote_cwd``
or else the caller's, which the hosts share: xlarun copies no files), carries the function and its arguments: by reference where the function can
be imported by name, else by value with cloudpickle (the ``notebook`` extra): a lambda, a closure,
a function defined in ``__main__`` or a notebook cell.

Output: the launcher's lines and the workers' reach the caller's ``sys.stdout`` and ``sys.stderr``
as they reach a terminal under the command, prefixed alike; where those are objects of their own
rather than descriptors 1 and 2 (a notebook's), through :class:`StreamPump`.

The stop signals (Ctrl-C, a notebook's interrupt: SIGINT) tear the workers down as under the
command (SIGTERM, the grace period, SIGKILL; a second one skips the grace); once every worker is
gone and the private directory removed, the signal is raised again in the caller with its own handlers
back, so a SIGINT is a :class:`KeyboardInterrupt` and a SIGTERM or SIGHUP under their default ends the
caller with nothing of the launch left behind. Signal handlers are the main thread's, so ``launch`` runs there only.
"""

from __future__ import annotations

import codecs
import json
import linecache
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

from xlarun.cli.options import OPTIONS_BY_DEST, OptionValues, read_options
from xlarun.console import flush_consoles
from xlarun.contract import LAUNCHED_MARKER
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import NOT_AVAILABLE, FailureRecord, signal_name
from xlarun.launching.node import run_launch
from xlarun.planning.plan import plan_launch
from xlarun.planning.rules import check_hosts
from xlarun.supervision.end import RootCause, RunEnd
from xlarun.supervision.report import read_run_end
from xlarun.worker.call import exception_file, result_file

if TYPE_CHECKING:
    from xlarun.launching.detach import DetachedRun

WORKER_MODULE = "xlarun.worker.call"
WORKER_VARIABLES = (LAUNCHED_MARKER, "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
"""Variables set in a worker's environment: a caller that has one is a worker itself."""
SCRIPT_ONLY_OPTIONS = ("module", "no_python", "run_path")
"""How a script runs; a function runs in the worker module."""
NOTEBOOK_EXTRA = "pip install 'xlarun[notebook]'"


@dataclass(frozen=True)
class LaunchResult:
    """How a launch that succeeded ended."""

    values: list[Any]
    """What each rank of this node returned, in rank order; ``None`` for each rank of a script."""
    exit_code: int
    summary: dict[str, Any]
    """What ``--summary-file`` writes for the same run (docs/results.md)."""


class WorkerFailed(Exception):
    """The run failed: a worker raised, exited with an error or was killed, or the workers hung.

    ``root_cause`` is the failure report's root cause: a :class:`~xlarun.failures.FailureRecord`
    (``host``, ``rank``, ``returncode``, ``signal``, ``traceback``: the worker's traceback text), a
    hang, or a node lost; ``failures`` every worker failure, the root cause's first. The exception
    the root cause raised, where it could be pickled, is this one's ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        root_cause: RootCause | None,
        failures: Sequence[FailureRecord],
        exit_code: int,
        summary: dict[str, Any],
    ):
        super().__init__(message)
        self.root_cause = root_cause
        self.failures = list(failures)
        self.exit_code = exit_code
        self.summary = summary


@overload
def launch(
    target: str | os.PathLike[str] | Sequence[str],
    *args: Any,
    reraise: bool = False,
    detach: Literal[True],
    **options: Any,
) -> DetachedRun: ...


@overload
def launch(
    target: Callable[..., Any] | str | os.PathLike[str] | Sequence[str],
    *args: Any,
    reraise: bool = False,
    detach: Literal[False] = False,
    **options: Any,
) -> LaunchResult: ...


def launch(
    target: Callable[..., Any] | str | os.PathLike[str] | Sequence[str],
    *args: Any,
    reraise: bool = False,
    **options: Any,
) -> LaunchResult | DetachedRun:
    """Run ``target`` on every worker, as the ``xlarun`` command would, and return once all are gone.

    ``target``: a function (called with ``*args`` in each worker; its return values come back), a
    script's path (``*args`` are its arguments), or ``["-m", "module", *arguments]``. ``options``:
    the command line's options by their Python names (``nproc_per_node=4``, ``device="cpu"``,
    ``standalone=True``, ``max_restarts=2``); a list is given comma-joined, a dict as ``key=value``
    pairs. Raises :class:`WorkerFailed` when the run fails (with ``reraise=True``, the root cause's
    own exception where it came back), :class:`ValueError` for a refused target or option, :class:`RuntimeError`
    where the launcher cannot go on (another process holds the device, ...). With ``detach=True`` the
    run is left running as ``xlarun --detach`` leaves it, and its :class:`~xlarun.launching.detach.DetachedRun`
    returned at once (docs/jobs.md).
    """
    refuse_caller()
    given = given_options(options)
    if given.get("detach") == "1":
        return launch_detached(target, args, given)
    try:
        with ExitStack() as redirected:
            for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
                if not is_descriptor(stream, fd):
                    redirected.enter_context(StreamPump(fd, stream))
            return launch_target(target, args, given, reraise)
    except StoppedBySignal as stopped:
        number = stopped.number
    # Outside the try: a KeyboardInterrupt raised here is the caller's own, with no launch exception before it.
    raise_signal_again(number)


class StoppedBySignal(Exception):
    """The launch took a stop signal and its workers are gone: raised through the private directory's clean-up
    and the output's pumps, so that the signal is delivered again (:func:`raise_signal_again`) only once
    nothing of the launch is left, since under SIGTERM's or SIGHUP's default disposition the caller ends there."""

    def __init__(self, number: int):
        super().__init__(signal_name(number))
        self.number = number


def launch_detached(
    target: Callable[..., Any] | str | os.PathLike[str] | Sequence[str], args: tuple[Any, ...], given: dict[str, str]
) -> DetachedRun:
    """``launch(..., detach=True)``: the launch checked and started as ``xlarun --detach`` does."""
    from xlarun.jobs.records import JobStore
    from xlarun.launching.detach import DetachedRun, start_detached
    from xlarun.launching.node import check_before_start

    if callable(target):
        raise ValueError("detach=True runs a script or a module: a function's values come back to a caller that waits")
    environ = dict(os.environ)
    with engine_errors():
        script, script_args = script_of(target, args, given)
        values = read_options(given, environ)
        on_hosts = check_hosts(values)
        if not on_hosts:
            check_before_start(plan_launch(values, script, script_args, environ), environ)
        started, process = start_detached(values, given, script, script_args, environ, on_hosts=on_hosts)
    return DetachedRun(JobStore.from_environ(environ), started.id, process)


def job(job_id: str) -> DetachedRun:
    """The run ``job_id`` (or the one run whose id starts with it) that ``--detach`` or ``detach=True`` started,
    found again; raises :class:`LookupError` where no run, or several, answer to it."""
    from xlarun.launching.detach import find_job

    return find_job(job_id, os.environ)


def launch_target(
    target: Callable[..., Any] | str | os.PathLike[str] | Sequence[str],
    args: tuple[Any, ...],
    given: dict[str, str],
    reraise: bool,
) -> LaunchResult:
    directory = tempfile.mkdtemp(prefix="xlarun-launch-")
    directories = [directory]
    try:
        given.setdefault("summary_file", os.path.join(directory, "summary.json"))
        payload: str | None = None
        script_args: tuple[str, ...]
        if callable(target):
            if given.get("dry_run") == "1":
                raise ValueError("dry_run plans a command line: run xlarun --dry-run with the script instead")
            for name in SCRIPT_ONLY_OPTIONS:
                if given.pop(name, "0") != "0":
                    raise ValueError(f"{name}= says how a script runs; {target!r} is a function")
            given["module"] = "1"
        else:
            script, script_args = script_of(target, args, given)
        environ = dict(os.environ)
        with engine_errors():
            values = read_options(given, environ)
            on_hosts = check_hosts(values)
        if callable(target):
            if on_hosts:  # the workers' files live where every host finds them: the job's working directory
                directories.append(shared_directory(values["remote_cwd"] or os.getcwd()))
            payload = os.path.join(directories[-1], "call")
            write_payload(payload, target, args)
            script, script_args = WORKER_MODULE, (payload,)  # the path only: the call itself is in the file
        if on_hosts:
            return hosts_result(
                run_hosts(values, given, script, script_args, environ),
                read_summary(given["summary_file"]),
                payload,
                reraise,
            )
        end = run(values, script, script_args, environ)
        summary = read_summary(given["summary_file"])
        if end.launcher_signal is not None:
            raise StoppedBySignal(end.launcher_signal)
        if end.exit_code != 0:
            raise failure(end, summary, payload, reraise)
        return LaunchResult(values=values_of([summary], payload), exit_code=end.exit_code, summary=summary)
    finally:
        for made in directories:
            shutil.rmtree(made, ignore_errors=True)


def shared_directory(working_directory: str) -> str:
    """A private directory for a job on several hosts, in its working directory, which they share with the caller."""
    try:
        return tempfile.mkdtemp(prefix=".xlarun-launch-", dir=working_directory)
    except OSError as error:
        raise ValueError(
            f"remote_cwd={working_directory!r} takes no directory here ({error.strerror}): a function and "
            "its ranks' values travel through the job's working directory, which the caller and every host "
            "share at the same path"
        ) from None


def is_descriptor(stream: Any, fd: int) -> bool:
    """Whether ``stream`` writes to descriptor ``fd`` itself, as a terminal's or a file's sys.stdout does."""
    try:
        return bool(stream.fileno() == fd)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False


class StreamPump:
    """For the launch's length, descriptor ``fd`` writes to a pipe whose text goes to ``stream``.

    A notebook's ``sys.stdout`` is an object that sends text to the cell, not descriptor 1: the
    launcher's lines and the workers' (which inherit descriptors 1 and 2, or are relayed to them) would
    miss the cell. Whatever reaches the descriptor meanwhile is written to the object by a thread;
    afterwards the descriptor is what it was.
    """

    def __init__(self, fd: int, stream: Any):
        self.fd = fd
        self.stream = stream
        self._saved = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StreamPump:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        self._saved = os.dup(self.fd)
        os.dup2(write_fd, self.fd)  # inheritable, as the descriptor it stands in for
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), name=f"xlarun-pump-{self.fd}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        flush_consoles()
        os.dup2(self._saved, self.fd)  # the pipe's last write end closes: the pump reads to its end
        os.close(self._saved)
        assert self._thread is not None
        self._thread.join()

    def _pump(self, read_fd: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(read_fd, "rb", buffering=0) as pipe:
            while data := pipe.read(65536):
                self._write(decoder.decode(data))
        self._write(decoder.decode(b"", final=True))

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a stream closed meanwhile costs the text, not the launch


def refuse_caller() -> None:
    """A launch runs from the main thread of a process that is not a worker."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "xlarun.launch() runs in the main thread only: it takes the stop signals (Ctrl-C, "
            "a notebook's interrupt) to stop the workers, and Python delivers signals there"
        )
    found = next((name for name in WORKER_VARIABLES if name in os.environ), None)
    if found is not None:
        raise RuntimeError(
            f"xlarun.launch() called inside a worker ({found} is set): a worker launches no "
            "workers of its own; call it from the program that starts the job"
        )


def given_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The options as the command line would give them: text by dest, ``"1"`` or ``"0"`` for a switch."""
    given: dict[str, str] = {}
    for name, value in options.items():
        option = OPTIONS_BY_DEST.get(name)
        if option is None:
            raise ValueError(
                f"unknown option {name}= (xlarun.launch takes the command line's options by their "
                "Python names: nproc_per_node=4, device='cpu', ...)"
            )
        if value is None:
            continue
        if not option.takes_value:
            if not isinstance(value, bool):
                raise ValueError(f"{option.display_name} is a switch: give {name}=True or False, not {value!r}")
            given[name] = "1" if value else "0"
        else:
            given[name] = spelt(value)
    return given


def spelt(value: Any) -> str:
    """An option's value as the command line spells it."""
    if isinstance(value, Mapping):
        return ",".join(f"{key}={item}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def script_of(target: Any, args: tuple[Any, ...], given: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """A script target's script and arguments; ``["-m", module, ...]`` sets ``module``."""
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target), tuple(str(arg) for arg in args)
    command = [str(part) for part in target] if isinstance(target, Sequence) else []
    if len(command) >= 2 and command[0] == "-m":
        given["module"] = "1"
        return command[1], (*command[2:], *(str(arg) for arg in args))
    raise ValueError(f"the target {target!r} is neither a function, a script's path nor ['-m', module, ...]")


def write_payload(path: str, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The call, for :mod:`xlarun.worker.call`: the caller's ``sys.path``, then the function and its
    arguments, by reference where the standard pickle can, else by value with cloudpickle."""
    try:
        if not importable_by_name(function):
            raise pickle.PicklingError(f"{function!r} cannot be imported by name")
        data = pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        try:
            import cloudpickle
        except ImportError:
            raise ImportError(
                f"{error}: a lambda, a closure or a function defined in __main__ or a notebook cell "
                f"travels to the workers by value with cloudpickle, which is not installed: "
                f"{NOTEBOOK_EXTRA}"
            ) from None
        try:
            data = cloudpickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as refused:
            raise ValueError(
                f"the call cannot travel to the workers ({refused}): a function and its arguments reach "
                "every worker pickled"
            ) from None
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        pickle.dump([entry for entry in sys.path if entry], handle)
        pickle.dump(unsaved_sources(), handle)
        handle.write(data)


def unsaved_sources() -> dict[str, Any]:
    """The caller's ``linecache`` entries of code without a file (mtime ``None``): IPython registers
    each notebook cell there, so a worker's traceback shows a cell's failing line, not only its number."""
    return {name: entry for name, entry in linecache.cache.items() if len(entry) == 4 and entry[1] is None}


def importable_by_name(function: Callable[..., Any]) -> bool:
    """Whether a fresh interpreter finds ``function`` by its module and qualified name.

    ``__main__`` is the worker module there, not the caller's script or notebook.
    """
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if module is None or module.__name__ == "__main__":
        return False
    found: Any = module
    for part in getattr(function, "__qualname__", "<unnamed>").split("."):
        found = getattr(found, part, None)
    return found is function


@contextmanager
def engine_errors() -> Iterator[None]:
    """The command's refusals as exceptions: :class:`ValueError` for bad input, :class:`RuntimeError`
    for a launcher that cannot go on; the lines printed meanwhile are out before the caller goes on."""
    try:
        yield
    except UsageError as error:
        raise ValueError(str(error)) from None
    except LaunchError as error:
        raise RuntimeError(str(error)) from error.__cause__
    finally:
        flush_consoles()


def run(values: OptionValues, script: str, script_args: tuple[str, ...], environ: Mapping[str, str]) -> RunEnd:
    """The command's engine on this host's workers."""
    with engine_errors():
        return run_launch(plan_launch(values, script, script_args, environ), environ)


def run_hosts(
    values: OptionValues,
    given: Mapping[str, str],
    script: str,
    script_args: tuple[str, ...],
    environ: Mapping[str, str],
) -> int:
    """The command's fan-out over the hosts (docs/hosts.md); its exit code."""
    from xlarun.launching.hosts import launch_hosts

    with engine_errors():
        return launch_hosts(values, given, script, script_args, environ)


def hosts_result(exit_code: int, summary: dict[str, Any], payload: str | None, reraise: bool) -> LaunchResult:
    """A job on several hosts as :func:`launch` returns or raises it, from the fan-out's summary."""
    if summary.get("result") == "signaled":
        raise StoppedBySignal(exit_code - 128)
    nodes = node_summaries(summary)
    if exit_code == 0:
        return LaunchResult(values=values_of(nodes, payload), exit_code=exit_code, summary=summary)
    failures = job_failures(nodes)
    record = failures[0] if failures else None
    message = (
        describe_failure(record)
        if record is not None
        else (f"the run {summary.get('result', 'failed')} (exit code {exit_code})")
    )
    cause = pickled_exception(payload, record)
    if reraise and isinstance(cause, BaseException):
        raise cause
    error = WorkerFailed(message, record, failures, exit_code, summary)
    raise error from cause if isinstance(cause, BaseException) else None


def node_summaries(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The nodes' summaries that a run's summary holds: each host's node's where it ran on several hosts (as the
    fan-out writes them), else its own; a host's node that wrote none is an empty one."""
    if "hosts" not in summary:
        return [summary]
    return [host.get("summary") or {} for host in summary["hosts"]]


def job_failures(node_summaries: Sequence[Mapping[str, Any]]) -> list[FailureRecord]:
    """Every failed worker the nodes' summaries list, once, the root cause first: every node names the job's
    root cause (the rendezvous tells it), and lists its own workers' other failures after it. A summary that is
    not xlarun's (none was written: the node was killed first) names none."""
    ends = []
    for node in node_summaries:
        try:
            ends.append(read_run_end(node))
        except ValueError:
            continue
    listed = [end.failure for end in ends] + [failure for end in ends for failure in end.other_failures]
    failures: dict[tuple[int, int], FailureRecord] = {}
    for record in listed:
        if record is not None:
            failures.setdefault((record.node_rank, record.rank), record)
    return list(failures.values())


def read_summary(path: str) -> dict[str, Any]:
    try:
        with open(path) as handle:
            summary: dict[str, Any] = json.load(handle)
    except (OSError, ValueError):
        return {}
    return summary


def raise_signal_again(number: int) -> NoReturn:
    """The stop signal the launch took, delivered again now that its workers and its private directory are
    gone and the caller's own handlers are back: Python's SIGINT handler raises :class:`KeyboardInterrupt`."""
    signal.raise_signal(number)
    if number == signal.SIGINT:
        raise KeyboardInterrupt
    raise RuntimeError(f"the launch was stopped by {signal.Signals(number).name}")


def values_of(summaries: Sequence[Mapping[str, Any]], payload: str | None) -> list[Any]:
    """The ranks' return values, in rank order (``None`` for each rank of a script), from the nodes' summaries."""
    ranks = sorted(
        worker["rank"] for summary in summaries for worker in ((summary.get("attempts") or [{}])[-1].get("workers", []))
    )
    if payload is None:
        return [None] * len(ranks)
    values = []
    for rank in ranks:
        with open(result_file(payload, rank), "rb") as handle:
            values.append(pickle.load(handle))
    return values


def pickled_exception(payload: str | None, record: FailureRecord | None) -> Any:
    """The exception the failing rank left, where it left one that unpickles here."""
    if payload is None or record is None:
        return None
    try:
        with open(exception_file(payload, record.rank), "rb") as handle:
            return pickle.load(handle)
    except Exception:  # noqa: BLE001 - none left (a signal, an exit), or one that does not unpickle here
        return None


def failure(end: RunEnd, summary: dict[str, Any], payload: str | None, reraise: bool) -> BaseException:
    """The :class:`WorkerFailed` for a run that failed; with ``reraise``, the root cause's own exception."""
    failures = [] if end.failure is None else [end.failure, *end.other_failures]
    cause = pickled_exception(payload, end.failure)
    if reraise and isinstance(cause, BaseException):
        return cause
    error = WorkerFailed(describe_end(end), end.root_cause, failures, end.exit_code, summary)
    error.__cause__ = cause if isinstance(cause, BaseException) else None
    return error


def describe_end(end: RunEnd) -> str:
    """One line: what failed, as the report's heading says it."""
    if end.failure is not None:
        return describe_failure(end.failure)
    return end.error or f"the run {end.result} (exit code {end.exit_code})"


def describe_failure(record: FailureRecord) -> str:
    """``rank 2 on h1 exited with code 1: ValueError: bad``: the last line of what the worker left (its
    traceback, else its last stderr lines) follows where it left anything."""
    how = f"was killed by {record.signal}" if record.signal else f"exited with code {record.returncode}"
    left = "" if record.traceback == NOT_AVAILABLE else record.traceback
    last = left.strip().splitlines()[-1:]
    return f"rank {record.rank} on {record.host} {how}" + (f": {last[0]}" if last else "")
