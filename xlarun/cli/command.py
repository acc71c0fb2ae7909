"""The ``xlarun`` command: torchrun's flags, parsed as torchrun parses them, and xlarun's own.

Parsing follows argparse's rules where torchrun's users rely on them: both spellings of
each long flag, unique prefixes (``--nproc_per_n=2``), ``PET_*`` defaults, and every
argument after the training script passed to it untouched. Errors are one line on
stderr and exit code 2; nothing is started. A launch's options are read here, from the option
table; ``--help``, ``--version``, the shell completion and the refusals only click words are the
click command's (:mod:`xlarun.cli.click_command`), which only they load.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from xlarun.cli.options import ENV_SEPARATOR, OPTIONS, stacks_request, verb_request
from xlarun.console import flush_consoles, say
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import AGENT_FLAG, DETACHED_RUN_FLAG
from xlarun.structs import Struct

HELP_NAMES = ("-h", "--help")
VERSION_NAME = "--version"
COMPLETION_NAMES = ("--print-completion", "--print_completion")
COMPLETION_SHELLS = ("bash", "zsh", "tcsh")
"""torchrun's shells (2.14, through shtab); bash and zsh come from click, tcsh from :func:`~xlarun.cli.click_command.tcsh_completion`."""
COMPLETE_VARIABLE = "_XLARUN_COMPLETE"
"""The variable through which click's completion scripts ask the command for completions."""


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


class CommandLine(Struct, frozen=True):
    """What the command line says: option texts by dest (``"1"`` for a switch), script, its arguments."""

    given: dict[str, str | None]
    script: str | None
    script_args: tuple[str, ...]


def parse_command_line(args: Sequence[str]) -> CommandLine | None:
    """Parse as torchrun's argparse would; None when ``--help`` or ``--version`` was answered instead.

    Raises :class:`UsageError` with one line for anything the parser refuses.
    """
    options, script, script_args = split_command_line(args)
    given = None if os.environ.get(COMPLETE_VARIABLE) else given_by_dest(options)
    if given is not None:
        return CommandLine(given, script, tuple(script_args))
    from xlarun.cli.click_command import parse_with_click

    return parse_with_click(options, script, script_args)


def given_by_dest(options: Sequence[str]) -> dict[str, str | None] | None:
    """The texts of split options by dest, as click reads them (``"1"`` for a switch, the last of a flag
    given twice, a repeatable flag's values joined with :data:`ENV_SEPARATOR`); None where only click
    answers: ``--help``, ``--version``, ``--print-completion``, a switch given a value, short switches
    run together."""
    spelled = {name: option for option in OPTIONS for name in option.spellings}
    given: dict[str, str | None] = {}
    repeated: dict[str, list[str]] = {}
    tokens = iter(options)
    for token in tokens:
        name, equals, value = token.partition("=") if token.startswith("--") else (token[:2], "", token[2:])
        option = spelled.get(name)
        if option is None:
            return None
        if not option.takes_value:
            if equals or value:
                return None
            given[option.dest] = "1"
            continue
        if not equals and not value:
            value = next(tokens)  # split_command_line made sure there is one
        if option.repeatable:
            repeated.setdefault(option.dest, []).append(value)
            value = ENV_SEPARATOR.join(repeated[option.dest])
        given[option.dest] = value
    return given


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: exits with the run's code (see the exit code table in docs/results.md)."""
    from xlarun.launching.node import launch_from_command_line

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
            from xlarun.launching.detach import record_start, take_started_announcer

            record, args = args[1], args[2:]
            record_start(record)
            on_started = take_started_announcer(os.environ)
        wanted, launcher = stacks_request(args)
        if wanted:
            from xlarun.launching.stacks import print_stacks

            finish(print_stacks(launcher))
        verb = verb_request(args)
        if verb is not None:
            from xlarun.launching.detach import run_verb

            finish(run_verb(verb, os.environ))
        command_line = parse_command_line(args)
        code = (
            0
            if command_line is None
            else launch_from_command_line(
                command_line.given,
                command_line.script,
                command_line.script_args,
                os.environ,
                detached=record is not None,
                on_started=on_started,
            )
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
    except KeyboardInterrupt:  # Ctrl-C outside a launch's own signal handling (a slow gcloud, a device probe)
        say("interrupted (SIGINT)")
        code = 130
    except Exception as error:
        if os.environ.get("XLARUN_DEBUG"):
            raise
        say(f"internal error: {type(error).__name__}: {error} (set XLARUN_DEBUG=1 for the traceback)")
        code = 1
    if record is not None:
        from xlarun.launching.detach import record_end

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
