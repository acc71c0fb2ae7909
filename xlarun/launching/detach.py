"""Runs you can leave: ``xlarun --detach ...``, and the verbs that find a run again by its id.

The verbs' words are read with the options (:func:`xlarun.cli.options.verb_request`); what each does is
:mod:`xlarun.jobs.verbs`' and :mod:`xlarun.jobs.status`'; the records are :mod:`xlarun.jobs.records`'.

A detached run has two halves. The caller (:func:`start_detached`) has checked what a foreground run
checks before anything starts, records the run and starts the launcher again as
``python -m xlarun --detached-run RECORD_DIR OPTIONS -- SCRIPT ARGS`` in a session of its own
(``setsid``: no terminal, so no hang-up reaches it), its standard input ``/dev/null`` and its standard
output and error the run's console file; then it returns. The detached launcher (:func:`record_end`)
runs the launch as the foreground would, its workers' console lines written whole (the relay takes
every stream, as ``--tee`` does), and records how the run ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from xlarun.cli.options import ENV_SEPARATOR, OPTIONS_BY_DEST, OptionValues, VerbRequest
from xlarun.console import say
from xlarun.exceptions import UsageError
from xlarun.flags import DETACHED_RUN_FLAG, PROGRAM, flag

if TYPE_CHECKING:
    from xlarun.jobs.records import Job, JobStore
    from xlarun.launching.library import LaunchResult

STARTED_FD_VARIABLE = "XLARUN_DETACHED_STARTED_FD"
"""Given only to the detached launcher of a job on several hosts: the pipe on which it says that every host
passed its checks and was told to start, which ``--detach`` waits for (:func:`take_started_announcer`)."""


def run_verb(request: VerbRequest, environ: Mapping[str, str]) -> int:
    """Do what ``request`` asks; the command's exit code."""
    from xlarun.jobs import verbs
    from xlarun.jobs.records import JobStore

    store = JobStore.from_environ(environ)
    if request.verb == "--jobs":
        if "--prune" in request.switches:
            verbs.prune(store)
        return verbs.list_jobs(store, as_json="--json" in request.switches)
    assert request.job_id is not None
    job = store.find(request.job_id)
    if request.verb == "--logs":
        return verbs.show_logs(store, job, follow="--follow" in request.switches)
    if request.verb == "--attach":
        return verbs.attach(store, job)
    if request.verb == "--stop":
        return verbs.stop(store, job)
    if request.verb == "--wait":
        return verbs.wait(store, job)
    from xlarun.jobs.status import print_status

    return print_status(job, as_json="--json" in request.switches)


def command_options(given: Mapping[str, str | None], leave_out: frozenset[str] = frozenset()) -> list[str]:
    """The options the command line gave, spelt again as ``--flag=value`` (a switch bare, a repeated flag once
    per value), but those of ``leave_out``."""
    words: list[str] = []
    for dest, text in given.items():
        if dest in leave_out or text is None:
            continue
        option = OPTIONS_BY_DEST[dest]
        if not option.takes_value:
            if text != "0":
                words.append(option.display_name)
        else:
            words += [f"{option.display_name}={value}" for value in text.split(ENV_SEPARATOR)]
    return words


def redacted_command(words: Sequence[str]) -> list[str]:
    """A command line as the run's record shows it: each value whose name looks secret replaced, as the dry
    run replaces such variables' values: ``--env HF_TOKEN=...``, ``--api-key=...``, ``--api-key VALUE``."""
    from xlarun.planning.dryrun import REDACTED, looks_secret

    def pairs(text: str) -> str:
        kept = (pair.partition("=") for pair in text.split(","))
        return ",".join(
            f"{key}={REDACTED}" if equals and looks_secret(key) else key + equals + value for key, equals, value in kept
        )

    shown: list[str] = []
    hide_next = False
    for word in words:
        name, equals, value = word.partition("=")
        if hide_next:
            shown.append(REDACTED)
        elif word.startswith("-") and equals:
            shown.append(f"{name}={REDACTED if looks_secret(name.lstrip('-')) else pairs(value)}")
        else:
            shown.append(pairs(word) if equals else word)
        hide_next = not hide_next and word.startswith("--") and not equals and looks_secret(word.lstrip("-"))
    return shown


def detached_run_id(values: OptionValues) -> str:
    """The id of a run to leave: its ``--rdzv-id`` where one is given, else one made up (12 hex digits)."""
    given = values["rdzv_id"]
    return given if values.is_set("rdzv_id") and given not in ("", "none") else os.urandom(6).hex()


def start_detached(
    values: OptionValues,
    given: Mapping[str, str | None],
    script: str,
    script_args: Sequence[str],
    environ: Mapping[str, str],
    *,
    on_hosts: bool = False,
    started_fd: int | None = None,
) -> tuple[Job, subprocess.Popen[bytes]]:
    """Record the run and start its launcher in a session of its own; the caller has checked the launch.
    ``started_fd``: the write end of the pipe on which the launcher says its hosts are ready, if it is to.

    The run's summary file and (on one host) its event log go to its record where the command line
    names none: how the run ended and ``--status`` read them there.
    """
    from xlarun.jobs.records import EVENT_LOG_FILE, SUMMARY_FILE, JobStore

    store = JobStore.from_environ(environ)
    job_id = detached_run_id(values)
    directory = store.directory(job_id)
    added: list[str] = []
    summary_file = values["summary_file"]
    if summary_file is None:
        summary_file = os.path.join(directory, SUMMARY_FILE)
        added.append(f"{flag('summary_file')}={summary_file}")
    event_log = values["event_log"]
    if event_log is None and not on_hosts:  # a host's agent could not write to this host's state directory
        event_log = os.path.join(directory, EVENT_LOG_FILE)
        added.append(f"{flag('event_log')}={event_log}")
    options = command_options(given, leave_out=frozenset({"detach"}))
    job = store.create(
        job_id,
        redacted_command([PROGRAM, *command_options(given), script, *script_args]),
        os.getcwd(),
        log_dir=None if values["log_dir"] is None else os.path.abspath(values["log_dir"]),
        summary_file=os.path.abspath(summary_file),
        event_log=event_log if event_log == "-" or event_log is None else os.path.abspath(event_log),
    )
    if event_log is not None and os.path.dirname(event_log) == directory:
        os.close(os.open(event_log, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))  # appended to, mode kept
    console = os.open(job.console, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "xlarun",
                DETACHED_RUN_FLAG,
                job.directory,
                *options,
                *added,
                "--",
                script,
                *script_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=console,
            start_new_session=True,
            env={**environ, STARTED_FD_VARIABLE: str(started_fd)} if started_fd is not None else dict(environ),
            pass_fds=() if started_fd is None else (started_fd,),
        )
    finally:
        os.close(console)
    store.set_launcher(job.id, process.pid)
    return store.load(job.id), process


def detach(
    values: OptionValues,
    given: Mapping[str, str | None],
    script: str,
    script_args: Sequence[str],
    environ: Mapping[str, str],
    *,
    on_hosts: bool = False,
) -> int:
    """``--detach``: start the run to leave, print its id on stdout and how to come back to it on stderr.

    A job on several hosts returns once every host passed the checks a foreground run makes before anything
    starts (the working directory, the script, a busy device): one that fails them ends the run, and the
    caller with the run's code (1) and its lines, as in the foreground. One host's checks are made here.
    """
    if not on_hosts:
        job, _ = start_detached(values, given, script, script_args, environ)
    else:
        read_end, write_end = os.pipe()
        try:
            job, process = start_detached(
                values, given, script, script_args, environ, on_hosts=True, started_fd=write_end
            )
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as started:
            ready = started.read(1)  # a byte once the hosts are told to start; nothing if the launcher ended first
        if not ready:
            code = process.wait()
            with open(job.console, errors="replace") as console:
                sys.stderr.write(console.read())
            return code or 1
    sys.stdout.write(job.id + "\n")
    say(f"run {job.id} started in the background: xlarun --logs {job.id} --follow shows its output,")
    say(f"xlarun --wait {job.id} waits for its end (and exits with its code), xlarun --stop {job.id} stops it")
    return 0


def take_started_announcer(environ: MutableMapping[str, str]) -> Callable[[], None] | None:
    """What a detached launcher of several hosts calls once they are ready (:data:`STARTED_FD_VARIABLE`, taken
    out of ``environ`` so that it travels nowhere), or None for any other launcher."""
    text = environ.pop(STARTED_FD_VARIABLE, None)
    if text is None or not text.isdigit():
        return None
    fd = int(text)
    os.set_inheritable(fd, False)

    def announce() -> None:
        try:
            os.write(fd, b"1")
            os.close(fd)
        except OSError:  # the caller is gone: nobody waits
            pass

    return announce


def record_start(directory: str) -> None:
    """The detached launcher's first act: itself, in its run's record. Its caller records it too, once it is
    started, but may be killed before it does (a closed terminal): the run must not pass for lost then."""
    from xlarun.jobs.records import JobStore

    try:
        JobStore(os.path.dirname(os.path.dirname(directory))).set_launcher(os.path.basename(directory), os.getpid())
    except OSError as error:
        say(f"cannot record the launcher of run {os.path.basename(directory)}: {error}")


def record_end(directory: str, exit_code: int) -> None:
    """The detached launcher's last act: how the run ended, in its record (the summary's result where it
    wrote one). A record that cannot take it costs a line in the run's console, not its exit code."""
    import json

    from xlarun.jobs.records import DamagedRecord, JobStore

    store = JobStore(os.path.dirname(os.path.dirname(directory)))
    job_id = os.path.basename(directory)
    try:
        job = store.load(job_id)
        result = None
        if job.summary_file:
            try:
                with open(job.summary_file) as handle:
                    result = json.load(handle).get("result")
                if os.path.dirname(job.summary_file) == directory:
                    os.chmod(job.summary_file, 0o600)  # written as any summary file is; the record's are private
            except (OSError, ValueError, AttributeError):
                pass  # no summary: a run refused before it started
        store.set_end(job_id, exit_code, result)
    except (OSError, DamagedRecord) as error:
        say(f"cannot record the end of run {job_id}: {error}")


class DetachedRun:
    """A run :func:`xlarun.launch` left running (``detach=True``) or :func:`xlarun.job` found again."""

    def __init__(self, store: JobStore, job_id: str, process: subprocess.Popen[bytes] | None = None):
        self._store = store
        self.id = job_id
        self._process = process
        """The launcher, where this process started it: reaped once it ends, so it leaves no zombie."""

    def __repr__(self) -> str:
        return f"<xlarun job {self.id} {self.status()['state']}>"

    def _job(self) -> Job:
        if self._process is not None:
            self._process.poll()
        return self._store.load(self.id)

    def status(self) -> dict[str, Any]:
        """The run now, as ``xlarun --jobs --json`` lists it, with ``ranks``: ``xlarun --status --json``'s
        objects while it runs."""
        from xlarun.jobs.status import rank_states

        job = self._job()
        return {**job.as_json(), "ranks": rank_states(job) if job.state == "running" else []}

    def wait(self) -> LaunchResult:
        """Block until the run ends: its :class:`~xlarun.LaunchResult`; raises :class:`~xlarun.WorkerFailed`
        where it failed (every failed worker its summary lists, the root cause first), as a foreground launch
        would, and for a lost run."""
        from xlarun.jobs.verbs import LOST_EXIT_CODE, describe_state, wait_for_change
        from xlarun.launching.library import (
            LaunchResult,
            WorkerFailed,
            describe_failure,
            job_failures,
            node_summaries,
            read_summary,
            values_of,
        )

        job = self._job()
        while job.state == "running":
            job = wait_for_change(self._store, job, None)
            if self._process is not None:
                self._process.poll()
        summary = read_summary(job.summary_file) if job.summary_file else {}
        nodes = node_summaries(summary)
        if job.exit_code == 0:
            return LaunchResult(values=values_of(nodes, None), exit_code=0, summary=summary)
        failures = job_failures(nodes)
        message = describe_failure(failures[0]) if failures else f"run {job.id} {describe_state(job)}"
        code = LOST_EXIT_CODE if job.exit_code is None else job.exit_code
        raise WorkerFailed(message, failures[0] if failures else None, failures, code, summary)

    def stop(self) -> None:
        """Stop the run as SIGTERM to its launcher would; returns once its workers are gone."""
        from xlarun.jobs.verbs import stop

        stop(self._store, self._job())
        if self._process is not None:
            self._process.wait()

    def logs(self) -> str:
        """The run's console output so far."""
        try:
            with open(self._job().console, "rb") as handle:
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def find_job(job_id: str, environ: Mapping[str, str]) -> DetachedRun:
    """:func:`xlarun.job`: the recorded run ``job_id`` (or the one run its prefix names)."""
    from xlarun.jobs.records import JobStore

    store = JobStore.from_environ(environ)
    try:
        return DetachedRun(store, store.find(job_id).id)
    except UsageError as error:
        raise LookupError(str(error)) from None
