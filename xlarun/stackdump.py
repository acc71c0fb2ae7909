"""The contract between the launcher and the stack-dump hook its Python workers start with.

Every worker's Python arms :mod:`faulthandler` for :data:`STACKS_SIGNAL` before the script runs,
without a change to the script: the launcher puts :data:`HOOK_DIRECTORY`, which holds only a
``sitecustomize`` module, first on the worker's ``PYTHONPATH`` and names the dump file in
:data:`STACKS_VARIABLE`. The hook then

- registers ``faulthandler`` for the signal with ``all_threads=True``: on the signal, the C-level
  handler writes every thread's Python stack to the file, without the GIL and while the main
  thread is blocked in a C call (a collective, a lock, a read), and the process goes on;
- gives the worker its environment and ``sys.path`` back as they were (``PYTHONPATH`` restored,
  the variable removed, so the worker's own children do not arm), and hands over to the
  ``sitecustomize`` it shadows, if there is one.

A real-time signal keeps clear of SIGUSR1 and SIGUSR2, which the launcher forwards to the
workers. Its default action ends a process, so the launcher sends it only to a process whose
``/proc/<pid>/status`` says it catches it (:func:`xlarun.supervision.stacks.is_armed`); a worker
that did not arm (``--no-python``, ``python -I`` or ``-S``) is never sent it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

STACKS_VARIABLE = "XLARUN_STACKS"
"""``<signal number>:<path of the dump file>``, read by the hook once, at interpreter start."""
STACKS_SIGNAL = signal.SIGRTMIN + 6
STACKS_FILE = "stacks.txt"
"""The dump file's name in the worker's log directory (``attempt_<n>/<local_rank>/``)."""
HOOK_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker", "startup")


def stacks_file(worker_log_directory: str) -> str:
    """Where a worker's dump goes: beside its error file, in its log directory."""
    return os.path.join(worker_log_directory, STACKS_FILE)


def hook_variables(stacks_file: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker gets so that its Python arms the dump to ``stacks_file`` (``environ``: the
    launcher's own, whose ``PYTHONPATH`` comes after the hook's directory and is restored by it)."""
    inherited = environ.get("PYTHONPATH")
    path = HOOK_DIRECTORY if inherited is None else HOOK_DIRECTORY + os.pathsep + inherited
    return {STACKS_VARIABLE: f"{int(STACKS_SIGNAL)}:{stacks_file}", "PYTHONPATH": path}
