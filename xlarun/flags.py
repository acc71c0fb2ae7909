"""How the launcher's messages spell a flag, for the layers below the command line.

A message about a value names the flag that set it (``--nproc-per-node``); the option
table (:mod:`xlarun.cli.options`) owns the flags, and every layer that words a message
imports only this leaf, so none of them loads the table. ``flag(dest)`` is the long
spelling with dashes of the option whose argparse ``dest`` is ``dest``; a unit test checks
that every ``flag('…')`` in the package names a row of the table.
"""


def flag(dest: str) -> str:
    """``flag("nproc_per_node")`` is ``"--nproc-per-node"``."""
    return "--" + dest.replace("_", "-")


STACKS_NAME = "--stacks"
"""The word that makes ``xlarun`` print a running launch's stacks (:mod:`xlarun.launching.stacks`) instead of
launching."""
AGENT_FLAG = "--agent-stdin"
"""The hidden flag that makes ``python -m xlarun`` a host's agent, reading its plan on stdin."""
DETACHED_RUN_FLAG = "--detached-run"
"""The hidden flag that makes ``python -m xlarun`` the launcher of a run ``--detach`` started
(:mod:`xlarun.launching.detach`), followed by its record's directory (never typed by a user)."""
PROGRAM = "xlarun"
"""The command's name, as ``--help``, the shell completion and a run's record spell it."""
