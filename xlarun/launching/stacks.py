"""``xlarun --stacks [PID]``: every worker's Python stacks of a running launch, printed; the run goes on.

PID is the launcher's; without it, the only launch on this host of this user's (root may name
another user's launch by its PID). Each worker's Python writes its stacks (every thread's) to its
``stacks.txt`` when signalled (:mod:`xlarun.contract`), so this needs neither ptrace rights nor a
change to the script. What is printed shows control characters escaped.
"""

from __future__ import annotations

import sys

from xlarun.exceptions import LaunchError
from xlarun.supervision.report import escape_controls
from xlarun.supervision.stacks import (
    UNKNOWN,
    StackTarget,
    describe_positions,
    dump_stacks,
    launch_workers,
    native_stacks,
    where,
)


def print_stacks(launcher: int | None) -> int:
    """Print every worker's stacks on stdout (with py-spy's native frames where it is installed), then one
    line of where the ranks stand; returns the exit code."""
    try:
        parent, workers = launch_workers(launcher)
    except LookupError as error:
        raise LaunchError(str(error)) from None
    dumps = dump_stacks(StackTarget(worker.rank, worker.pid, worker.stacks_file) for worker in workers)
    natives = native_stacks(worker.pid for worker in workers)

    def write(text: str) -> None:
        # Stacks hold any text a program gives (file and function names): an escape sequence in
        # them would reach the terminal and could rewrite it.
        sys.stdout.write(escape_controls(text))

    write(f"xlarun launch {parent}: {len(workers)} worker{'s' if len(workers) != 1 else ''}\n")
    positions = {}
    for worker in workers:
        dump = dumps.get(worker.rank)
        positions[worker.rank] = where(dump) if dump is not None else UNKNOWN
        write(f"\nrank {worker.rank} (local rank {worker.local_rank}, pid {worker.pid}):\n")
        write((dump.rstrip("\n") if dump else f"  {UNKNOWN}") + "\n")
        if worker.pid in natives:
            write(f"\nrank {worker.rank}, native (py-spy dump --native):\n{natives[worker.pid]}\n")
    write(f"\n{describe_positions(positions)}\n")
    return 0
