"""Whether the program a worker would run is on this host: the script, the ``--no-python``
program, the ``-m`` module.

Usage::

    problem = program_problem(config.command, os.getcwd())    # None, or the one line that says what is missing

Both the launcher (before its workers start) and the agent of a multi-host launch (before it
reports ready, on its own host) ask; each line names the flag that changes the answer.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from xlarun.config import WorkerCommand
from xlarun.flags import flag


def program_problem(command: WorkerCommand, cwd: str) -> str | None:
    """What is missing of ``command``'s script or program, relative paths read from ``cwd``; None when nothing is.

    A ``-m`` module is not looked for here (as torchrun, the worker names a missing one); see
    :func:`module_problem`.
    """
    if command.no_python:
        path = os.path.join(cwd, command.script)
        if "/" in command.script and os.path.isfile(path) and not os.access(path, os.X_OK):
            return (
                f"{command.script} is not executable ({flag('no_python')} runs it directly): "
                f"chmod +x it, or drop {flag('no_python')} to run it with python"
            )
        found = shutil.which(path) if "/" in command.script else shutil.which(command.script)
        if found is None:
            return (
                f"command not found: {command.script} ({flag('no_python')} runs it directly; "
                "give a path or a program on PATH)"
            )
    elif not command.module and not os.path.exists(os.path.join(cwd, command.script)):
        return f"training script not found: {command.script}"
    return None


def module_problem(name: str, cwd: str, environ: Mapping[str, str]) -> str | None:
    """Whether ``python -m name``, started in ``cwd`` with ``environ``'s ``PYTHONPATH``, finds the
    module's top-level package: the working directory and ``PYTHONPATH`` first, then this
    interpreter's own path and finders (editable installs have finders of their own).

    Only the top-level name is looked for: finding ``pkg.sub`` would import ``pkg`` and run its code.
    """
    # Only a host's agent asks, before it reports ready: a launch loads none of importlib's finders.
    import importlib.machinery
    import importlib.util

    top = name.partition(".")[0]
    search = [cwd, *(entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry)]
    if importlib.machinery.PathFinder.find_spec(top, search) is not None:
        return None
    try:
        if importlib.util.find_spec(top) is not None:
            return None
    except (ImportError, ValueError):
        pass
    return f"module not found: {name} ({flag('module')} runs it with python -m)"
