"""What the verbs do with a recorded run: list the runs, print or follow a run's console, wait for its
end, stop it. Each returns the command's exit code; output goes to stdout, the launcher's own lines
(:func:`~xlarun.console.say`) to stderr.

A run's end is waited for on its launcher's pidfd (``pidfd_open``, which any process of the user may
open on any of the user's processes): no signal and no polling of the run. The console file is read
as it grows, at most :data:`FOLLOW_INTERVAL_S` after each write, whole lines only until the run ends.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import BinaryIO

from xlarun.console import say
from xlarun.durations import format_age
from xlarun.jobs.records import Job, JobStore

FOLLOW_INTERVAL_S = 0.2
"""How long a follower waits for more console output before it reads the file again."""
READ_CHUNK = 1 << 16
LOST_EXIT_CODE = 1
"""``--wait`` and ``--logs --follow`` of a lost run: a launcher failure's code (docs/results.md)."""


def launcher_exit_fd(job: Job) -> int | None:
    """A pidfd that turns readable when the run's launcher ends; None where it ended already (or was never
    recorded). The launcher is checked after the pidfd is open: a reused pid cannot slip in between."""
    if job.launcher is None:
        return None
    try:
        fd = os.pidfd_open(job.launcher.pid)
    except ProcessLookupError:
        return None
    if not job.launcher.alive():
        os.close(fd)
        return None
    return fd


def wait_for_change(store: JobStore, job: Job, timeout: float | None) -> Job:
    """The run as recorded once its launcher ended, or ``timeout`` seconds passed (None: no limit)."""
    fd = launcher_exit_fd(job)
    if fd is None:
        if job.launcher is None and job.state == "running":
            time.sleep(FOLLOW_INTERVAL_S)  # the caller is recording the launcher it just started
        return store.load(job.id)
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return store.load(job.id)


def ended_code(job: Job) -> int:
    """The exit code of a run that ended: its own, or :data:`LOST_EXIT_CODE` with a line for a lost one."""
    if job.exit_code is not None:
        return job.exit_code
    say(f"run {job.id} was lost: its launcher ended without recording the run's end")
    return LOST_EXIT_CODE


def wait(store: JobStore, job: Job) -> int:
    """``--wait``: block until the run ends; its exit code."""
    while job.state == "running":
        job = wait_for_change(store, job, None)
    return ended_code(job)


def stop(store: JobStore, job: Job) -> int:
    """``--stop``: SIGTERM to the launcher, which tears the workers down as in the foreground (the grace
    period, then SIGKILL); returns once the launcher, the last of the run's processes, is gone."""
    while job.state == "running" and job.launcher is None:
        job = wait_for_change(store, job, None)
    if job.state != "running":
        say(f"run {job.id} is not running: {describe_state(job)}")
        return 0
    fd = launcher_exit_fd(job)
    if fd is not None:
        try:
            signal.pidfd_send_signal(fd, signal.SIGTERM)
            select.select([fd], [], [])
        finally:
            os.close(fd)
    job = store.load(job.id)
    say(f"run {job.id} stopped: {describe_state(job)}")
    return 0


def describe_state(job: Job) -> str:
    state = job.state
    return f"{state} (exit code {job.exit_code})" if job.exit_code is not None else state


def show_logs(store: JobStore, job: Job, follow: bool) -> int:
    """``--logs``: the run's console output so far; with ``follow``, then what comes, until the run ends, and
    its exit code."""
    out = sys.stdout.buffer
    try:
        console = open(job.console, "rb")
    except FileNotFoundError:
        console = open(os.devnull, "rb")  # a run that never got as far as its console: nothing to show
    with console:
        partial = b""
        while True:
            # The state first: what a run wrote before it ended is read after its end is seen.
            running = follow and job.state == "running"
            partial = copy_lines(console, out, partial)
            if not running:
                out.write(partial)
                out.flush()
                return ended_code(job) if follow else 0
            job = wait_for_change(store, job, FOLLOW_INTERVAL_S)


def copy_lines(source: BinaryIO, out: BinaryIO, partial: bytes) -> bytes:
    """Copy the whole lines ``source`` holds now, after ``partial``, the start of a line read before; the
    start of the next line is returned."""
    while data := source.read(READ_CHUNK):
        data = partial + data
        whole = data.rfind(b"\n") + 1
        out.write(data[:whole])
        partial = data[whole:]
    out.flush()
    return partial


def attach(store: JobStore, job: Job) -> int:
    """``--attach``: follow the run; Ctrl-C leaves it going and exits 0, its end exits with its code."""
    try:
        return show_logs(store, job, follow=True)
    except KeyboardInterrupt:
        say(f"detached from run {job.id}; it goes on (xlarun --attach {job.id} to come back)")
        return 0


def list_jobs(store: JobStore, as_json: bool) -> int:
    """``--jobs``: every recorded run, newest first, as a table or a JSON list."""
    jobs, damaged = store.jobs()
    for line in damaged:
        say(line)
    if as_json:
        json.dump([job.as_json() for job in jobs], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = [("ID", "STATE", "EXIT", "STARTED", "DURATION", "COMMAND")]
    for job in jobs:
        ended = job.ended if job.ended is not None else time.time() if job.state == "running" else None
        rows.append(
            (
                job.id,
                job.state,
                "" if job.exit_code is None else str(job.exit_code),
                datetime.fromtimestamp(job.started).strftime("%Y-%m-%d %H:%M:%S"),
                "" if ended is None else format_age(ended - job.started),
                " ".join(job.command),
            )
        )
    write_table(rows)
    return 0


def write_table(rows: Sequence[Sequence[str]]) -> None:
    """Rows of cells on stdout, each column as wide as its widest cell (the last one as it is)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")


def prune(store: JobStore) -> int:
    """``--jobs --prune``: remove the records (console output included) of every run that is not running."""
    removed = store.remove_finished()
    say(f"removed {len(removed)} run{'s' if len(removed) != 1 else ''} that ended")
    return 0
