"""The ``xlarun`` command: torchrun's flags, parsed as torchrun parses them, and xlarun's own.

Parsing follows argparse's rules where torchrun's users rely on them: both spellings of
each long flag, unique prefixes (``--nproc_per_n=2``), ``PET_*`` defaults, and every
argument after the training script passed to it untouched. Errors are one line on
stderr and exit code 2; nothing is started.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

import click

from xlarun.exceptions import LaunchError, UsageError

TORCHRUN_OPTIONS: list[tuple[tuple[str, ...], bool, str]] = [
    # (spellings, takes a value, help)
    (("--nnodes",), True, "Number of nodes, N or MIN:MAX."),
    (("--nproc-per-node", "--nproc_per_node"), True, "Workers per node: N, auto, cpu or gpu."),
    (("--rdzv-backend", "--rdzv_backend"), True, "Rendezvous backend: static or c10d."),
    (("--rdzv-endpoint", "--rdzv_endpoint"), True, "Rendezvous endpoint, host[:port]."),
    (("--rdzv-id", "--rdzv_id"), True, "Job id shared by all nodes."),
    (("--rdzv-conf", "--rdzv_conf"), True, "Rendezvous options, key=value,..."),
    (("--standalone",), False, "Single node on a free port with a fresh run id."),
    (("--max-restarts", "--max_restarts"), True, "Group restarts before failing."),
    (("--monitor-interval", "--monitor_interval"), True, "Accepted for compatibility: exits are seen at once."),
    (("--start-method", "--start_method"), True, "spawn, fork or forkserver (accepted; workers are processes)."),
    (("--event-log-handler", "--event_log_handler"), True, "Accepted for compatibility."),
    (("--role",), True, "Worker role name (ROLE_NAME, log prefix)."),
    (("-m", "--module"), False, "Run the script as a module: python -u -m."),
    (("--no-python", "--no_python"), False, "Execute the script directly, without python."),
    (("--run-path", "--run_path"), False, "Run the script with runpy.run_path."),
    (("--log-dir", "--log_dir"), True, "Base directory for worker logs."),
    (("-r", "--redirects"), True, "Redirect streams to files: 0-3 or LOCAL_RANK:0-3,..."),
    (("-t", "--tee"), True, "Tee streams to files and console: 0-3 or LOCAL_RANK:0-3,..."),
    (("--local-ranks-filter", "--local_ranks_filter"), True, "Local ranks shown on the console, e.g. 0,1."),
    (("--node-rank", "--node_rank"), True, "This node's rank (static rendezvous)."),
    (("--master-addr", "--master_addr"), True, "Address of node 0 (static rendezvous)."),
    (("--master-port", "--master_port"), True, "Port of node 0's store (static rendezvous)."),
    (("--local-addr", "--local_addr"), True, "This node's address."),
    (("--logs-specs", "--logs_specs"), True, "Logs specs; only 'default'."),
    (("--numa-binding", "--numa_binding"), True, "node, socket, exclusive or core-complex (accepted)."),
]

XLARUN_OPTIONS: list[tuple[tuple[str, ...], bool, str]] = [
    (("--dry-run", "--dry_run"), False, "Print the launch plan as JSON and start nothing."),
    (("--kill-timeout", "--kill_timeout"), True, "Seconds between SIGTERM and SIGKILL at teardown (default 30)."),
    (("--summary-file", "--summary_file"), True, "Write a JSON record of the run to this path."),
    (("--device",), True, "auto, tpu, neuron, cuda, cpu or xpu (env XLARUN_DEVICE)."),
    (("--runtime",), True, "auto, pjrt or xrt."),
    (("--spmd",), False, "One process per node that sees every local device."),
    (("--virtual-devices", "--virtual_devices"), True, "CPU devices per process (CPU_NUM_DEVICES)."),
    (("--coordinator-port", "--coordinator_port"), True, "Port of the XLA coordinator (default: a fixed rule)."),
    (("--cluster",), True, "none, auto, slurm, k8s, gke-tpu or mpi (env XLARUN_CLUSTER)."),
]

ALL_OPTIONS = TORCHRUN_OPTIONS + XLARUN_OPTIONS


def dest_of(spellings: tuple[str, ...]) -> str:
    """argparse's dest: the first long spelling without dashes, ``-`` turned into ``_``."""
    long_name = next(name for name in spellings if name.startswith("--"))
    return long_name[2:].replace("-", "_")


def split_command_line(argv: Sequence[str]) -> tuple[list[str], Optional[str], list[str]]:
    """Split into (launcher options, script, script arguments), expanding option prefixes.

    The first token that is not an option or an option's value is the script; everything
    after it belongs to the script. One ``--`` is dropped, before or right after the script.
    """
    long_names = {name: takes_value for spellings, takes_value, _ in ALL_OPTIONS
                  for name in spellings if name.startswith("--")}
    long_names["--help"] = False
    short_names = {name: takes_value for spellings, takes_value, _ in ALL_OPTIONS
                   for name in spellings if not name.startswith("--")}
    short_names["-h"] = False
    dests = {name: dest_of(spellings) for spellings, _, _ in ALL_OPTIONS for name in spellings}
    options: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            index += 1
            break
        if token.startswith("--"):
            name, equals, value = token.partition("=")
            name = expand_prefix(name, long_names, dests)
            options.append(name + equals + value)
            if long_names[name] and not equals:
                if index + 1 >= len(argv):
                    raise UsageError(f"argument {name}: expected one argument")
                options.append(argv[index + 1])
                index += 1
        elif token.startswith("-") and len(token) > 1:
            flag = token[:2]
            if flag not in short_names:
                raise UsageError(f"unrecognized arguments: {token}")
            options.append(token)
            if short_names[flag] and len(token) == 2:
                if index + 1 >= len(argv):
                    raise UsageError(f"argument {flag}: expected one argument")
                options.append(argv[index + 1])
                index += 1
        else:
            break
        index += 1
    else:
        return options, None, []
    rest = list(argv[index:])
    if not rest:
        return options, None, []
    script, script_args = rest[0], rest[1:]
    dropped_before = index > 0 and argv[index - 1] == "--"
    if not dropped_before and script_args[:1] == ["--"]:
        script_args = script_args[1:]
    return options, script, script_args


def expand_prefix(name: str, long_names: dict[str, bool], dests: dict[str, str]) -> str:
    if name in long_names:
        return name
    matches = [candidate for candidate in long_names if candidate.startswith(name)]
    if not matches:
        raise UsageError(f"unrecognized arguments: {name} (see xlarun --help)")
    if len({dests.get(match, match) for match in matches}) > 1:
        raise UsageError(f"ambiguous option: {name} could match {', '.join(sorted(matches))}")
    return matches[0]


class SectionedCommand(click.Command):
    """``--help`` lists torchrun's flags and xlarun's own flags apart."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own = {dest_of(spellings) for spellings, _, _ in XLARUN_OPTIONS}
        for title, wanted in (("torchrun options", False), ("xlarun options", True)):
            rows = [param.get_help_record(ctx) for param in self.get_params(ctx)
                    if isinstance(param, click.Option) and (param.name in own) == wanted]
            with formatter.section(title):
                formatter.write_dl([row for row in rows if row])


def _option(spellings: tuple[str, ...], takes_value: bool, help_text: str):  # type: ignore[no-untyped-def]
    dest = dest_of(spellings)
    if takes_value:
        return click.option(*spellings, dest, default=None, help=help_text, metavar="VALUE")
    return click.option(*spellings, dest, is_flag=True, default=None, help=help_text)


def _build_command() -> click.Command:
    @click.command(cls=SectionedCommand, context_settings={"help_option_names": ["-h", "--help"]},
                   add_help_option=True)
    @click.argument("training_script", required=False)
    @click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def command(ctx: click.Context, training_script: Optional[str], training_script_args: tuple[str, ...],
                **values: Optional[str]) -> int:
        """Launch TRAINING_SCRIPT on every worker, as torchrun does, with XLA devices set up.

        Every argument after TRAINING_SCRIPT is passed to it untouched.
        """
        from xlarun.launch import launch_from_command_line

        given = {name: ("1" if value is True else value) for name, value in values.items()
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
        return launch_from_command_line(given, training_script, tuple(training_script_args), os.environ)

    # Options added to a built command are listed in the order they are added.
    for spellings, takes_value, help_text in ALL_OPTIONS:
        command = _option(spellings, takes_value, help_text)(command)
    return command


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: exits with the run's code (see the README's exit code table)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, script, script_args = split_command_line(args)
        click_args = options + (["--", script, *script_args] if script is not None else [])
        code = _build_command().main(args=click_args, prog_name="xlarun", standalone_mode=False)
    except (UsageError, click.UsageError) as error:
        message = error.format_message() if isinstance(error, click.UsageError) else str(error)
        sys.stderr.write(f"xlarun: error: {message}\n")
        sys.exit(UsageError.exit_code)
    except LaunchError as error:
        sys.stderr.write(f"xlarun: {error}\n")
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except Exception as error:
        if os.environ.get("XLARUN_DEBUG"):
            raise
        sys.stderr.write(f"xlarun: internal error: {type(error).__name__}: {error} "
                         "(set XLARUN_DEBUG=1 for the traceback)\n")
        sys.exit(1)
    finish(code if isinstance(code, int) else 0)


def finish(code: int) -> None:
    """Exit with ``code``. After a multi-node run torch's C++ threads (store server, rendezvous
    keep-alive) may still run; a normal interpreter exit can abort in their destructors, so
    the process ends at once once everything it wrote is flushed."""
    if "torch" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
