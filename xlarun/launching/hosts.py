"""The glue of a job on several hosts: from the command line to each host's plan and transport, then the
fan-out (:mod:`xlarun.remote.fanout`) or the dry run.

Every flag the user gave that is not the fan-out's own goes to every host unchanged, so it means
there what it means on one host; the host list decides the node count, each node's rank, node 0
and the run id. Nothing here contacts a host (``--tpu-pod`` lists the pod's workers from its
description, or a TPU7x slice's instances from its managed instance group).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Mapping

from xlarun import __version__
from xlarun.cli.options import OPTIONS_BY_DEST, OptionValues
from xlarun.exceptions import UsageError
from xlarun.flags import flag
from xlarun.planning.rules import HOST_SOURCES, HOSTS_ONLY, check_run_id, require_script
from xlarun.remote.plan import HostPlan, allowed_environment, plan_hosts
from xlarun.remote.transport import remote_command, transport_argv
from xlarun.runtimes.limits import MAX_VARIABLE_BYTES, variable_bytes

LAUNCHER_ONLY = frozenset(
    {*HOST_SOURCES, *HOSTS_ONLY, "tpu_zone", "dry_run", "summary_file", "master_addr", "master_port", "rdzv_id"}
)
"""The given flags no host gets as they are: the fan-out's own, the dry run, the summary file (the
launcher writes one for every host) and node 0's address, port and the run id (each host's plan
says them)."""
LAUNCHER_VARIABLES = frozenset(
    variable for dest in LAUNCHER_ONLY for variable in OPTIONS_BY_DEST[dest].environment_variables
)
"""Their variables (``XLARUN_HOSTS``...): they stay behind, or each host would fan out again."""


def node_options(given: Mapping[str, str | None]) -> list[str]:
    """The user's flags that every host's xlarun takes unchanged, as ``--flag=value`` (a switch bare)."""
    options = []
    for dest, text in given.items():
        if dest in LAUNCHER_ONLY or text is None:
            continue
        option = OPTIONS_BY_DEST[dest]
        options.append(f"{option.display_name}={text}" if option.takes_value else option.display_name)
    return options


def hosts_and_template(values: OptionValues) -> tuple[list[str], str | None]:
    """The hosts, and the ``--rsh`` template that reaches them (None: ssh); a TPU pod's from gcloud, listed once."""
    if values["tpu_pod"]:
        from xlarun.remote.tpupod import find_pod

        pod = find_pod(values["tpu_pod"], values["tpu_zone"])
        return pod.hosts, pod.template
    return list(values["hosts"] or values["hostfile"]), values["rsh"]


def check_travelling_values(dest: str, variables: Mapping[str, str]) -> None:
    """Refuse, before any host is contacted, a variable no process could be started with: a NUL byte (which
    ends a C string) or a ``NAME=value`` past Linux's limit on one (each host's ``execve`` would refuse it)."""
    for name, value in variables.items():
        if "\0" in value:
            raise UsageError(f"{flag(dest)}: the value of {name} holds a NUL byte, which no environment can carry")
        if variable_bytes(name, value) > MAX_VARIABLE_BYTES:
            raise UsageError(
                f"{flag(dest)}: {name}=... takes {variable_bytes(name, value):,} bytes, past Linux's limit on one "
                f"environment variable ({MAX_VARIABLE_BYTES:,} bytes, MAX_ARG_STRLEN): no host could start its node"
            )


def plan_job(
    values: OptionValues,
    given: Mapping[str, str | None],
    script: str | None,
    script_args: tuple[str, ...],
    environ: Mapping[str, str],
) -> tuple[list[HostPlan], list[list[str]], str]:
    """Each host's plan and transport argv, and the remote Python."""
    script = require_script(script)
    run_id = values.given("rdzv_id") or uuid.uuid4().hex
    check_run_id(values, run_id)
    travelling = {name: value for name, value in allowed_environment(environ).items() if name not in LAUNCHER_VARIABLES}
    given_env = {"env_file": values["env_file"] or {}, "env": dict(values["env"] or ())}
    for dest, variables in given_env.items():
        check_travelling_values(dest, variables)
    env = {**travelling, **given_env["env_file"], **given_env["env"]}
    program = "module" if values["module"] else "program" if values["no_python"] else "script"
    hosts, template = hosts_and_template(values)
    plans = plan_hosts(
        hosts,
        node_options(given),
        [script, *script_args],
        run_id=run_id,
        master_port=values["master_port"] if values.is_set("master_port") else None,
        cwd=values["remote_cwd"] or os.getcwd(),
        env=env,
        host_timeout=values["host_timeout"],
        version=__version__,
        master_addr=values.given("master_addr"),
        prefix_given=bool(values["log_line_prefix_template"]),
        streams_given=values.is_set("tee") or values.is_set("redirects"),
        cluster_ranks=bool(values["tpu_pod"]),
        program=program,
        device=values.raw("device") or "auto",
        allow_busy_device=values["allow_busy_device"],
    )
    remote_python = values["remote_python"] or sys.executable
    command = remote_command(remote_python)
    argvs = [transport_argv(plan.host, plan.index, command, values["ssh_config"], template) for plan in plans]
    return plans, argvs, remote_python


def launch_hosts(
    values: OptionValues,
    given: Mapping[str, str | None],
    script: str | None,
    script_args: tuple[str, ...],
    environ: Mapping[str, str],
    *,
    on_started: Callable[[], None] | None = None,
) -> int:
    """Run the job on every host (or print, for each, the transport's argv and the plan); the exit code.
    ``on_started``: called once every host is ready and told to start."""
    plans, argvs, remote_python = plan_job(values, given, script, script_args, environ)
    reached_addresses = not (values["tpu_pod"] or values["rsh"])
    if values["dry_run"]:
        document = {
            "hosts": [
                {"host": plan.host, "transport": argv, "plan": plan.shown()}
                for plan, argv in zip(plans, argvs, strict=True)
            ]
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from xlarun.remote.fanout import FanOut

    return FanOut(
        plans,
        argvs,
        remote_python,
        master_addr=values.given("master_addr"),
        reached_addresses=reached_addresses,
        summary_file=values["summary_file"],
        stop_signals=values["signals_to_handle"].signals,
        on_started=on_started,
    ).run()
