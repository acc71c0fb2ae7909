"""The click command behind ``xlarun``: ``--help``, ``--version``, the shell completion scripts, and the
words of a refusal only click gives (a switch given a value, short switches run together).

A plain launch's command line never comes here: :func:`xlarun.cli.command.parse_command_line` reads it
from the option table, and click, whose import alone costs a launch several interpreter starts' worth of
milliseconds, is loaded only where it answers. Both read the same split command line
(:func:`~xlarun.cli.command.split_command_line`), so a launch means the same either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from xlarun import __version__
from xlarun.cli.command import (
    COMPLETE_VARIABLE,
    COMPLETION_NAMES,
    COMPLETION_SHELLS,
    HELP_NAMES,
    VERSION_NAME,
    CommandLine,
)
from xlarun.cli.options import ENV_SEPARATOR, OPTIONS, OPTIONS_BY_DEST, XLARUN, Option
from xlarun.contract import LAUNCHED_MARKER
from xlarun.exceptions import UsageError
from xlarun.flags import PROGRAM, flag
from xlarun.host.devices import HOST_ROOT_VARIABLE

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


def parse_with_click(options: list[str], script: str | None, script_args: list[str]) -> CommandLine | None:
    """What click makes of a split command line; None where it answered ``--help``, ``--version`` or a
    completion instead. A refusal is a :class:`UsageError` in click's words; Ctrl-C while click prints
    is a KeyboardInterrupt, as anywhere else before a launch."""
    click_args = options + (["--", script, *script_args] if script is not None else [])
    try:
        parsed = _build_command().main(
            args=click_args, prog_name=PROGRAM, complete_var=COMPLETE_VARIABLE, standalone_mode=False
        )
    except click.UsageError as error:
        raise UsageError(error.format_message()) from None
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
    return parsed if isinstance(parsed, CommandLine) else None


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
