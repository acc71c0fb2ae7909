"""The ``xlarun`` command: torchrun's flags, parsed as torchrun parses them, and xlarun's own.

Parsing follows argparse's rules where torchrun's users rely on them: both spellings of
each long flag, unique prefixes (``--nproc_per_n=2``), ``PET_*`` defaults, and every
argument after the training script passed to it untouched. Errors are one line on
stderr and exit code 2; nothing is started. ``--help`` is built from the option table
(value names, defaults, variables) so it cannot drift from what is parsed, and so is the shell
completion ``--print-completion`` prints: click's own for bash and zsh, a ``complete`` line for
tcsh, which click does not support.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import click

from xlarun import __version__
from xlarun.cli.jobs import (
    DETACHED_RUN_FLAG,
    record_end,
    record_start,
    run_verb,
    take_started_announcer,
    verb_request,
)
from xlarun.cli.options import ENV_SEPARATOR, OPTIONS, OPTIONS_BY_DEST, XLARUN, Option
from xlarun.console import flush_consoles, say
from xlarun.contract import LAUNCHED_MARKER
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import AGENT_FLAG, STACKS_NAME, flag
from xlarun.host.devices import HOST_ROOT_VARIABLE

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

HELP_NAMES = ("-h", "--help")
VERSION_NAME = "--version"
COMPLETION_NAMES = ("--print-completion", "--print_completion")
COMPLETION_SHELLS = ("bash", "zsh", "tcsh")
"""torchrun's shells (2.14, through shtab); bash and zsh come from click, tcsh from :func:`tcsh_completion`."""
COMPLETE_VARIABLE = "_XLARUN_COMPLETE"
"""The variable through which click's completion scripts ask the command for completions."""
PROGRAM = "xlarun"


def split_command_line(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Split into (launcher options, script, script arguments), expanding option prefixes.

    The first token that is not an option or an option's value is the script; everything
    after it belongs to the script. One ``--`` is dropped, before or right after the script.
    """
    long_names = {name: option.takes_value for option in OPTIONS for name in option.spellings if name.startswith("--")}
    long_names.update({HELP_NAMES[1]: False, VERSION_NAME: False, **dict.fromkeys(COMPLETION_NAMES, True)})
    short_names = {
        name: option.takes_value for option in OPTIONS for name in option.spellings if not name.startswith("--")
    }
    short_names[HELP_NAMES[0]] = False
    dests = {name: option.dest for option in OPTIONS for name in option.spellings}
    dests.update(dict.fromkeys(COMPLETION_NAMES, "print_completion"))
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

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        # The script is required; click is told otherwise only so that a missing one is refused
        # in xlarun's own words, as a one-line error like every other.
        return [self.options_metavar or "", "TRAINING_SCRIPT", "[SCRIPT_ARGS]..."]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own = {option.dest for option in OPTIONS if option.owner == XLARUN} | {"version"}
        for title, wanted in (("torchrun options", False), ("xlarun options", True)):
            rows = [
                param.get_help_record(ctx)
                for param in self.get_params(ctx)
                if isinstance(param, click.Option) and (param.name in own) == wanted
            ]
            with formatter.section(title):
                formatter.write_dl([row for row in rows if row])

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Written only where --help asks for it: its variables' modules are no launch's to load.
        self.epilog = epilog()
        super().format_epilog(ctx, formatter)


def help_text(option: Option) -> str:
    """The row's help with its default and, for xlarun's flags, the variable that stands in."""
    default = option.default if option.shown_default is None else option.shown_default
    notes = [f"default: {default}"] if default else []
    if option.variable:
        notes.append(f"env: {option.variable}")
    return option.help + (f" [{'; '.join(notes)}]" if notes else "")


def complete_value(option: Option) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    """What the shell offers for the option's value: its choices, or files for a path."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem  # only a shell asking for completions loads it

        if option.metavar == "PATH":
            return [CompletionItem(incomplete, type="file")]
        return [CompletionItem(value) for value in option.choices if value.startswith(incomplete)]

    return complete


def complete_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The training script and its arguments: the shell's own file completion."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type="file")]


def _click_option(option: Option) -> Callable[[click.Command], click.Command]:
    # Values stay text here: the table's parsers check them, with PET_* fallbacks, in one place.
    if option.takes_value:
        return click.option(
            *option.spellings,
            option.dest,
            default=None,
            help=help_text(option),
            metavar=option.metavar,
            shell_complete=complete_value(option),
            multiple=option.repeatable,
        )
    return click.option(*option.spellings, option.dest, is_flag=True, default=None, help=help_text(option))


def tcsh_completion() -> str:
    """A tcsh ``complete`` command for xlarun: its long flags after ``--``, its short ones after ``-``, and
    the values of the choice flags after them (click, which makes the bash and zsh scripts, has no tcsh)."""
    long_names = [name[2:] for option in OPTIONS for name in option.spellings if name.startswith("--")]
    long_names += [HELP_NAMES[1][2:], VERSION_NAME[2:], *(name[2:] for name in COMPLETION_NAMES)]
    short_names = [name[1:] for option in OPTIONS for name in option.spellings if not name.startswith("--")]
    values = [(name, option.choices) for option in OPTIONS if option.choices for name in option.spellings]
    values += [(name, COMPLETION_SHELLS) for name in COMPLETION_NAMES]
    rules = [
        f"'c/--/({' '.join(long_names)})/'",
        f"'c/-/({' '.join([*short_names, HELP_NAMES[0][1:]])})/'",
        *(f"'n/{name}/({' '.join(choices)})/'" for name, choices in values),
    ]
    return f"complete {PROGRAM} {' '.join(rules)}"


def print_completion(ctx: click.Context, param: click.Parameter, shell: str | None) -> None:
    """``--print-completion SHELL``: the completion script on stdout, and nothing launched."""
    if shell is None or ctx.resilient_parsing:
        return
    if shell == "tcsh":
        click.echo(tcsh_completion())
    else:
        from click.shell_completion import get_completion_class

        completion = get_completion_class(shell)
        assert completion is not None  # click has bash and zsh
        click.echo(completion(ctx.command, {}, PROGRAM, COMPLETE_VARIABLE).source())
    ctx.exit()


def description() -> str:
    """What ``--help`` says before the flags."""
    return (
        f"Launch TRAINING_SCRIPT on every worker, as torchrun does, with XLA devices set up.\n\n"
        f"TRAINING_SCRIPT is a Python file, a module with {flag('module')}, or a program with "
        f"{flag('no_python')}. Every argument after it goes to it untouched; ${{local_rank}} in them becomes "
        "each worker's local rank. README.md and docs/ cover devices, multi-node jobs and clusters."
    )


def epilog() -> str:
    """What ``--help`` says after the flags: the variables xlarun reads and its exit codes."""
    from xlarun.jobs.records import STATE_DIR_VARIABLE

    return f"""\b
Environment:
  PET_<FLAG>            a torchrun flag's default (PET_NPROC_PER_NODE=4;
                        switches 0 or 1), as torchrun reads it; flags win
  {OPTIONS_BY_DEST["device"].variable:<21} the default of {flag("device")}
  {OPTIONS_BY_DEST["cluster"].variable:<21} the default of {flag("cluster")}
  XLARUN_RDZV_TOKEN     the job's rendezvous token, as {flag("rdzv_conf")} token=...
  XLARUN_DEBUG=1        a traceback for an internal error
  {HOST_ROOT_VARIABLE:<21} read /sys, /dev and /proc under this directory (fake hosts)
  {STATE_DIR_VARIABLE:<21} where runs to leave are recorded (docs/jobs.md)
Workers also get {LAUNCHED_MARKER}=1; {flag("dry_run")} shows every variable they get.

\b
xlarun --stacks [PID]   print every worker's Python stacks of a running launch
                        (PID: its launcher; default: the only one on this host)

\b
Runs started with {flag("detach")} (ID: the id it printed, or a prefix naming one):
xlarun --jobs [--json]  list this user's runs, newest first; --prune removes
                        those that ended
xlarun --logs ID        print the run's console output; --follow: until it ends
xlarun --attach ID      follow the run; Ctrl-C leaves it going
xlarun --status ID      the run's ranks now: pid, state, memory, CPU; --json
xlarun --wait ID        wait for the run's end, exit with its exit code
xlarun --stop ID        stop the run as SIGTERM to its launcher would

\b
Exit codes: 0 success; the root-cause worker's own code (128+N when signal N
killed it); 124 the workers hung ({flag("hang_timeout")}); 2 bad usage; 1 a
launcher failure. A worker may exit 1 or 2 too: the "result" field of
{flag("summary_file")} tells them apart."""


class CommandLine(NamedTuple):
    """What the command line says: option texts by dest (``"1"`` for a switch), script, its arguments."""

    given: dict[str, str | None]
    script: str | None
    script_args: tuple[str, ...]


def _build_command() -> click.Command:
    @click.command(
        cls=SectionedCommand,
        context_settings={"help_option_names": list(HELP_NAMES)},
        add_help_option=True,
        help=description(),
    )
    @click.argument("training_script", required=False, shell_complete=complete_files)
    @click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED, shell_complete=complete_files)
    @click.pass_context
    def command(
        ctx: click.Context,
        training_script: str | None,
        training_script_args: tuple[str, ...],
        **values: str | bool | tuple[str, ...] | None,
    ) -> CommandLine:
        """What the command line gave, for the launch to read with the option table."""
        given: dict[str, str | None] = {
            name: (
                "1"
                if value is True
                else value
                if isinstance(value, str)
                else ENV_SEPARATOR.join(value)
                if isinstance(value, tuple)
                else None
            )
            for name, value in values.items()
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        }
        return CommandLine(given, training_script, tuple(training_script_args))

    # Options added to a built command are listed in the order they are added.
    built: click.Command = command
    for option in OPTIONS:
        built = _click_option(option)(built)
    built = click.option(
        *COMPLETION_NAMES,
        type=click.Choice(COMPLETION_SHELLS),
        is_eager=True,
        expose_value=False,
        callback=print_completion,
        metavar="|".join(COMPLETION_SHELLS),
        help="Print a shell completion script for xlarun and exit, e.g. "
        "xlarun --print-completion bash > ~/.local/share/bash-completion/completions/xlarun",
    )(built)
    return click.version_option(
        __version__,
        VERSION_NAME,
        prog_name=PROGRAM,
        message="%(prog)s %(version)s",
        help="Show xlarun's version and exit.",
    )(built)


def parse_command_line(args: Sequence[str]) -> CommandLine | None:
    """Parse as torchrun's argparse would; None when ``--help`` or ``--version`` was answered instead.

    Raises :class:`UsageError` with one line for anything the parser refuses.
    """
    options, script, script_args = split_command_line(args)
    click_args = options + (["--", script, *script_args] if script is not None else [])
    try:
        parsed = _build_command().main(
            args=click_args, prog_name=PROGRAM, complete_var=COMPLETE_VARIABLE, standalone_mode=False
        )
    except click.UsageError as error:
        raise UsageError(error.format_message()) from None
    return parsed if isinstance(parsed, CommandLine) else None


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: exits with the run's code (see the exit code table in docs/results.md)."""
    from xlarun.cli.launch import launch_from_command_line

    hold_standard_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    record: str | None = None
    on_started: Callable[[], None] | None = None
    """The record of the run this launcher runs detached (``--detach`` started it), where it does."""
    try:
        if args == [AGENT_FLAG]:
            from xlarun.remote.agent import run_agent  # a host's agent, started by a multi-host launcher

            finish(run_agent())
        if args[:1] == [DETACHED_RUN_FLAG] and len(args) > 1:
            record, args = args[1], args[2:]
            record_start(record)
            on_started = take_started_announcer(os.environ)
        if args and args[0].startswith(STACKS_NAME):  # the stacks' module loads only where they may be asked for
            from xlarun.cli.stacks import print_stacks, stacks_request

            wanted, launcher = stacks_request(args)
            if wanted:
                finish(print_stacks(launcher))
        verb = verb_request(args)
        if verb is not None:
            finish(run_verb(verb, os.environ))
        command_line = parse_command_line(args)
        code = (
            0
            if command_line is None
            else launch_from_command_line(*command_line, os.environ, detached=record is not None, on_started=on_started)
        )
    except UsageError as error:
        say(f"error: {error}")
        code = UsageError.exit_code
    except LaunchError as error:
        if os.environ.get("XLARUN_DEBUG") and error.__cause__ is not None:
            import traceback  # only here: it costs every launch 2 ms

            traceback.print_exception(error.__cause__)
        say(str(error) + (" (set XLARUN_DEBUG=1 for the traceback)" if error.__cause__ is not None else ""))
        code = error.exit_code
    except click.exceptions.Abort:
        code = 130
    except KeyboardInterrupt:  # Ctrl-C outside a launch's own signal handling (a slow gcloud, a device probe)
        say("interrupted (SIGINT)")
        code = 130
    except Exception as error:
        if os.environ.get("XLARUN_DEBUG"):
            raise
        say(f"internal error: {type(error).__name__}: {error} (set XLARUN_DEBUG=1 for the traceback)")
        code = 1
    if record is not None:
        record_end(record, code)
    finish(code)


def hold_standard_streams() -> None:
    """Put /dev/null on a standard descriptor the launcher was started without (``2>&-``).

    Otherwise the first file the launcher opens takes that number, and whatever it writes to
    stderr (or a worker inherits as its stdout) lands in that file, a pipe or a socket.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one


def finish(code: int) -> None:
    """Exit with ``code`` once the launcher's queued output is written (while its readers take it).

    After a multi-node run torch's C++ threads (store server, rendezvous keep-alive) may still
    run; a normal interpreter exit can abort in their destructors, so the process ends at once.
    """
    flush_consoles()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a reader gone or a stream closed changes nothing of the exit
    os._exit(code)
