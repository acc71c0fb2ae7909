"""``xlarun --status ID``: a running run's ranks on this host, one line each, read from what already exists.

Each worker is found in ``/proc`` as ``xlarun --stacks`` finds it (the launcher's children that carry
their stack-dump file), and read there: its state, uptime, resident memory and CPU use (two reads of its
``stat``, :data:`CPU_SAMPLE_S` apart). The restarts come from the run's event log, the age of a rank's
last output from the modification time of its log files (``--tee``, ``--redirects``), else of the run's
console file, and its steps and steps per second from the count the launcher keeps beside them where
torch_xla's step log is on (:class:`~xlarun.supervision.relay.StepTally`: with ``--hang-timeout``). A rank
whose steps per second fall below :data:`STRAGGLER_FRACTION` of the ranks' median is marked a straggler.
Nothing is signalled, nothing is asked of the run: being looked at never slows it.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterable
from typing import Any

from xlarun.host.procfs import CLOCK_TICKS, stat_fields
from xlarun.jobs.records import Job
from xlarun.jobs.verbs import write_table
from xlarun.supervision.relay import STEPS_FILE

CPU_SAMPLE_S = 0.5
"""The time over which a rank's CPU use is measured."""
SILENT_S = 300.0
"""A rank with no output for this long is marked silent."""
STRAGGLER_FRACTION = 0.5
"""A rank slower than this share of the median rank's steps per second is a straggler."""
PAGE_BYTES = resource.getpagesize()
PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "waiting", "T": "stopped", "t": "traced", "Z": "exited"}


def uptime_s() -> float:
    with open("/proc/uptime") as handle:
        return float(handle.read().split()[0])


def restarts(event_log: str | None) -> int:
    """The restarts the run's event log records (letting waiting nodes in is none), 0 without a log."""
    if not event_log or event_log == "-":
        return 0
    count = 0
    try:
        with open(event_log, "rb") as handle:
            for line in handle:
                if b'"name":"restart"' in line:
                    event = json.loads(line)
                    count += 0 if event.get("attributes", {}).get("admitting") else 1
    except (OSError, ValueError):
        pass
    return count


def cpu_ticks(pids: Iterable[int]) -> dict[int, tuple[list[bytes], int]]:
    """Each process's ``stat`` fields and its CPU time so far (user and system, in clock ticks)."""
    read: dict[int, tuple[list[bytes], int]] = {}
    for pid in pids:
        try:
            _, fields = stat_fields(f"/proc/{pid}/stat")
        except OSError:
            continue
        read[pid] = (fields, int(fields[14]) + int(fields[15]))
    return read


def modified(paths: Iterable[str]) -> list[float]:
    times = []
    for path in paths:
        try:
            times.append(os.stat(path).st_mtime)
        except OSError:
            continue
    return times


def last_output_age(directory: str, console: str, now: float) -> float | None:
    """Seconds since the rank's log files (else the run's console) last grew."""
    times = modified(os.path.join(directory, name) for name in ("stdout.log", "stderr.log")) or modified([console])
    return None if not times else max(0.0, now - max(times))


def step_progress(directory: str, now: float) -> tuple[int | None, float | None]:
    """The rank's steps so far and its recent steps per second, from its step tally; None where it keeps none
    (no step log) or has no rate yet. A rank that stopped stepping reads slower the longer it has stopped."""
    try:
        with open(os.path.join(directory, STEPS_FILE)) as handle:
            steps, _, base_steps, base_time = handle.read().split()
        count, since = int(steps), float(base_time)
        rate = (count - int(base_steps)) / (now - since) if now > since and count > int(base_steps) else None
    except (OSError, ValueError):
        return None, None
    return count, rate


def mark_stragglers(ranks: list[dict[str, Any]]) -> None:
    """Mark each rank whose steps per second are below :data:`STRAGGLER_FRACTION` of the ranks' median."""
    rates = [rank["steps_per_s"] for rank in ranks if rank["steps_per_s"] is not None]
    median = statistics.median(rates) if len(rates) > 1 else None
    for rank in ranks:
        rate = rank["steps_per_s"]
        rank["straggler"] = median is not None and rate is not None and rate < STRAGGLER_FRACTION * median


def rank_states(job: Job) -> list[dict[str, Any]]:
    """The run's ranks on this host now, one object each (``--status --json``); empty where none runs."""
    from xlarun.supervision.stacks import launch_workers

    if job.launcher is None:
        return []
    try:
        _, workers = launch_workers(job.launcher.pid)
    except LookupError:
        return []
    first = cpu_ticks(worker.pid for worker in workers)
    time.sleep(CPU_SAMPLE_S)
    second = cpu_ticks(first)
    now, booted = time.time(), time.time() - uptime_s()
    restarted = restarts(job.event_log)
    ranks = []
    for worker in workers:
        if worker.pid not in second:
            continue
        fields, ticks = second[worker.pid]
        started = booted + int(fields[22]) / CLOCK_TICKS
        directory = os.path.dirname(worker.stacks_file)
        age = last_output_age(directory, job.console, now)
        steps, rate = step_progress(directory, now)
        ranks.append(
            {
                "rank": worker.rank,
                "local_rank": worker.local_rank,
                "pid": worker.pid,
                "state": PROCESS_STATES.get(fields[3].decode(), fields[3].decode()),
                "uptime_s": round(now - started, 1),
                "restarts": restarted,
                "rss_bytes": int(fields[24]) * PAGE_BYTES,
                "cpu_percent": round(100.0 * (ticks - first[worker.pid][1]) / CLOCK_TICKS / CPU_SAMPLE_S, 1),
                "steps": steps,
                "steps_per_s": None if rate is None else round(rate, 2),
                "last_output_age_s": None if age is None else round(age, 1),
                "silent": age is not None and age > SILENT_S,
            }
        )
    mark_stragglers(ranks)
    return ranks


def print_status(job: Job, as_json: bool) -> int:
    """``--status``: the run's state, then one line per rank (``as_json``: the ranks as a JSON list)."""
    ranks = rank_states(job) if job.state == "running" else []
    if as_json:
        json.dump(ranks, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    pid = f", launcher pid {job.launcher.pid}" if job.launcher is not None and job.state == "running" else ""
    code = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    sys.stdout.write(f"run {job.id}: {job.state}{code}{pid}\n")
    if not ranks:
        return 0
    rows = [("RANK", "PID", "STATE", "UPTIME", "RESTARTS", "RSS", "CPU", "STEPS", "STEPS/S", "LAST OUTPUT")]
    for rank in ranks:
        age = rank["last_output_age_s"]
        rows.append(
            (
                str(rank["rank"]),
                str(rank["pid"]),
                rank["state"],
                f"{rank['uptime_s']:.0f}s",
                str(rank["restarts"]),
                f"{rank['rss_bytes'] / 2**20:.0f} MiB",
                f"{rank['cpu_percent']:.0f}%",
                "-" if rank["steps"] is None else str(rank["steps"]),
                ("-" if rank["steps_per_s"] is None else f"{rank['steps_per_s']:.1f}")
                + (" (straggler)" if rank["straggler"] else ""),
                ("-" if age is None else f"{age:.0f}s ago") + (" (silent)" if rank["silent"] else ""),
            )
        )
    write_table(rows)
    return 0
