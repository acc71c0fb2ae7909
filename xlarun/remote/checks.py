"""What a host checks before it reports ready: everything a start on that host needs, so that a
multi-host launch refuses before any worker starts anywhere.

Usage (the agent, on its host, before it reports ready)::

    problem = check_host(plan)     # None, or one line: "/dev/accel0 held by ..." naming the cause

The launcher prefixes the line with the host (``host w-3: ...``). In order, first failure wins:

- the same xlarun as the launcher's (a host with another release would plan and report differently);
- the working directory exists;
- the command is there: the script (relative to the working directory), the ``--no-python``
  program on PATH, or the ``--module``'s top-level package (:mod:`xlarun.host.programs`, the
  launcher's own check);
- no other process holds the device (:mod:`xlarun.host.holders`, the launcher's busy-device
  preflight), unless ``--allow-busy-device``.

Everything is read on the host itself, in its environment with the plan's variables over it,
as the node's launcher will read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xlarun import __version__
from xlarun.config import WorkerCommand
from xlarun.exceptions import PlanError
from xlarun.flags import flag
from xlarun.host.devices import host_root, resolve_device
from xlarun.host.holders import busy_device_holders, busy_device_refusal, describe_holder
from xlarun.host.programs import module_problem, program_problem
from xlarun.remote.plan import HostPlan

PROGRAMS = ("script", "module", "program")
""":attr:`HostPlan.program`'s values."""


def check_host(plan: HostPlan, environ: Mapping[str, str] | None = None) -> str | None:
    """The first reason this host cannot start its node of ``plan``, as one line; None when it can.

    ``environ`` is this host's environment (``os.environ`` unless given); the plan's variables
    are laid over it, as the node's launcher gets them.
    """
    if plan.version != __version__:
        return (
            f"xlarun {__version__} is installed here, the launcher runs {plan.version or 'an unknown release'}: "
            f"install the same release on every host (or pass {flag('remote_python')} for a Python that has it)"
        )
    if not os.path.isdir(plan.cwd):
        return f"working directory {plan.cwd} not found: pass {flag('remote_cwd')} DIR, a directory every host has"
    environ = {**(os.environ if environ is None else environ), **plan.env}
    command = host_command(plan)
    if command is None:
        return "the plan names no command after '--'"
    problem = (
        module_problem(command.script, plan.cwd, environ) if command.module else program_problem(command, plan.cwd)
    )
    if problem is not None:
        relative = not (command.module or command.no_python or os.path.isabs(command.script))
        return f"{problem} in {plan.cwd}" if relative else problem
    if not plan.allow_busy_device:
        return busy_device_problem(plan.device, environ)
    return None


def host_command(plan: HostPlan) -> WorkerCommand | None:
    """The command of ``plan``'s node: the first word after the ``--`` that ends the options
    (:func:`~xlarun.remote.plan.plan_hosts` puts it there), as :attr:`HostPlan.program` says to run it."""
    if "--" not in plan.argv or plan.argv.index("--") + 1 >= len(plan.argv):
        return None
    start = plan.argv.index("--") + 1
    return WorkerCommand(
        script=plan.argv[start],
        args=plan.argv[start + 1 :],
        module=plan.program == "module",
        no_python=plan.program == "program",
    )


def busy_device_problem(requested: str, environ: Mapping[str, str]) -> str | None:
    """The busy-device preflight as one line: who holds the device's files, and what to do; None when no one does."""
    try:
        device = resolve_device(requested, environ, host_root(environ))
    except PlanError as error:
        return str(error)
    holders = busy_device_holders(device, environ)
    if not holders:
        return None
    return "; ".join([*(describe_holder(holder) for holder in holders), busy_device_refusal(device, holders)])
