"""The log plan: torchrun's directory layout and which stream goes where, per worker.

Layout (as torchrun)::

    <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log, stderr.log, error.json}
    <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/stacks.txt   (xlarun's: stacks asked for)
    <log_dir>/<run_id>_<random>/attempt_<n>/{filtered_stdout.log, filtered_stderr.log}

A stream is *redirected* to its file, *tee'd* to the file and to the launcher's console
with a ``[{role}{local_rank}]:`` prefix, or left to the console; what the console shows of a
tee'd stream is also copied, line by line where it matches ``--duplicate-*-filters``, to the
attempt's filtered file. :mod:`xlarun.supervision.relay` carries out the plan.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Mapping

from xlarun.config import STDERR, STDOUT, LaunchConfig
from xlarun.contract import stacks_file
from xlarun.exceptions import UsageError
from xlarun.flags import flag
from xlarun.supervision.relay import MatchingLines, StreamPlan, WorkerLogPlan

FILTERED_LOGS = {STDOUT: "filtered_stdout.log", STDERR: "filtered_stderr.log"}


def make_run_log_dir(base: str | None, run_id: str) -> str:
    """The run's directory: ``<base>/<run_id>_<random>``, ``base`` a fresh temp dir when not given.

    It is always directly inside ``base``: a run id whose path, ``..`` resolved, leads elsewhere
    (``../x``, ``a/b``; the command line refuses such ids first) is refused here too. The last
    part is new (``mkdtemp``), so no link can be planted there.
    """
    try:
        if base is None:
            base = tempfile.mkdtemp(prefix="xlarun_")
        elif os.path.isfile(base):
            raise UsageError(f"{flag('log_dir')} {base} is a file: give a directory (it is created when missing)")
        prefix = f"{run_id}_"
        if os.path.dirname(os.path.normpath(os.path.join(base, prefix))) != os.path.normpath(base):
            raise UsageError(f"run id {run_id!r} would put its logs outside {flag('log_dir')} {base}")
        os.makedirs(base, exist_ok=True)
        return tempfile.mkdtemp(prefix=prefix, dir=base)
    except OSError as error:
        raise UsageError(
            f"{flag('log_dir')} {base} cannot hold the logs ({error.strerror}): give a writable directory"
        ) from None


def line_prefix(config: LaunchConfig, rank: int, local_rank: int) -> bytes:
    """torchrun's prefix: the template's macros substituted (``${hostname}`` is the short host name, as
    torchrun 2.14's), else ``[{role}{local_rank}]:``."""
    if config.log_line_prefix_template:
        from string import Template  # only a run given a template loads it

        text = Template(config.log_line_prefix_template).safe_substitute(
            role_name=config.role, rank=rank, local_rank=local_rank, hostname=socket.gethostname()
        )
    else:
        text = f"[{config.role}{local_rank}]:"
    return text.encode()


def plan_attempt_logs(config: LaunchConfig, run_dir: str, attempt: int) -> dict[int, MatchingLines]:
    """The attempt's filtered files, by stream, each created empty as torchrun creates it (whether
    any rank is tee'd or not) where its stream has filters."""
    filters = {STDOUT: config.duplicate_stdout_filters, STDERR: config.duplicate_stderr_filters}
    planned = {
        bit: MatchingLines(os.path.join(run_dir, f"attempt_{attempt}", FILTERED_LOGS[bit]), needles)
        for bit, needles in filters.items()
        if needles
    }
    for matching in planned.values():
        os.makedirs(os.path.dirname(matching.path), exist_ok=True)
        with open(matching.path, "wb"):
            pass
    return planned


def plan_worker_logs(
    config: LaunchConfig, run_dir: str, attempt: int, local_rank: int, rank: int, matching: Mapping[int, MatchingLines]
) -> WorkerLogPlan:
    """torchrun's stream rules for one worker; creates its attempt directory. ``matching`` (from
    :func:`plan_attempt_logs`) gets the lines the console shows of its tee'd streams."""
    directory = os.path.join(run_dir, f"attempt_{attempt}", str(local_rank))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    shown = config.local_ranks_filter is None or local_rank in config.local_ranks_filter
    redirects = config.redirects.for_rank(local_rank)
    tee = config.tee.for_rank(local_rank)
    prefix = line_prefix(config, rank, local_rank)

    def stream(bit: int, name: str, console_fd: int) -> StreamPlan:
        to_file = bool((redirects | tee) & bit)
        file = os.path.join(directory, f"{name}.log") if to_file else None
        if tee & bit:
            return StreamPlan(
                file=file,
                console_fd=console_fd if shown else None,
                prefix=prefix,
                relay=True,
                matching=matching.get(bit) if shown else None,
            )
        if file is not None:
            # Hang detection counts output as progress: it must pass through the launcher on its way.
            return StreamPlan(file=file, relay=config.hang_timeout is not None)
        whole_lines = config.console_whole_lines
        if bit == STDERR or whole_lines:
            return StreamPlan(console_fd=console_fd if shown else None, relay=True, whole_lines=whole_lines)
        return StreamPlan(console_fd=console_fd if shown else None)

    return WorkerLogPlan(
        directory=directory,
        error_file=os.path.join(directory, "error.json"),
        stdout=stream(STDOUT, "stdout", 1),
        stderr=stream(STDERR, "stderr", 2),
        stacks_file=stacks_file(directory),
    )
