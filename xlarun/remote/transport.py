"""How the launcher reaches a host: the argv of the system's OpenSSH client, or of a user's ``--rsh`` template.

The remote command is short and holds nothing secret (:func:`remote_command`): the agent reads
everything else from its standard input. ssh runs it without a terminal (``-T``): a pty would
merge the remote stderr into stdout and add ``\\r`` to every line, and a remote program's end is
noticed through its standard input closing (:mod:`xlarun.remote.agent`), not through SIGHUP.
``BatchMode`` makes a host that would ask for a password fail at once, in one line of ssh's
stderr, instead of waiting on a prompt nobody sees; the keepalives end a dead connection within
``ServerAliveInterval * ServerAliveCountMax`` seconds (ssh then exits 255).

Everything users configure for ssh applies as it does for ``ssh HOST``: ``~/.ssh/config`` (or
``--ssh-config``), agents, ``ProxyJump``, certificates.
"""

from __future__ import annotations

import shlex

from xlarun.flags import AGENT_FLAG

SSH = "ssh"

SSH_OPTIONS = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=10",
)
"""No terminal, no prompt, a dead connection noticed within 15 s, an unreachable host within 10 s."""

PLACEHOLDERS = ("{host}", "{index}", "{command}")
"""What an ``--rsh`` template's words may hold; ``{command}`` is required."""


def remote_command(remote_python: str) -> str:
    """The command the transport runs on a host, as one shell word list: the agent, nothing else."""
    return shlex.join([remote_python, "-m", "xlarun", AGENT_FLAG])


def transport_argv(
    host: str, index: int, command: str, ssh_config: str | None = None, rsh_template: str | None = None
) -> list[str]:
    """The argv that runs ``command`` on ``host``.

    With ``rsh_template`` (``gcloud compute tpus tpu-vm ssh pod --worker={index} --command {command}``,
    ``kubectl exec -i {host} -- sh -c {command}``): the template split as a shell would split it, and
    the placeholders replaced within each word, so ``{command}`` stays one argument. Without: ssh.
    """
    if rsh_template is not None:
        return [
            word.replace("{host}", host).replace("{index}", str(index)).replace("{command}", command)
            for word in shlex.split(rsh_template)
        ]
    config = ["-F", ssh_config] if ssh_config else []
    # "--" ends ssh's options: a host named like an option is a host.
    return [SSH, *SSH_OPTIONS, *config, "--", host, command]


def with_own_log(argv: list[str], path: str) -> list[str]:
    """``argv`` with ssh's own messages (its errors, a connection's end) written to ``path`` (``ssh -E``),
    apart from the stderr it shares with the remote command, so that the launcher can say which host they
    are about; another transport's argv unchanged."""
    return [SSH, "-E", path, *argv[1:]] if argv[:1] == [SSH] else argv


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot be an ``--rsh`` template, or None."""
    try:
        words = shlex.split(template)
    except ValueError as error:
        return f"does not split as a shell would split it ({error})"
    if not words:
        return "is empty"
    if not any("{command}" in word for word in words):
        return "has no {command}: the agent's command must go somewhere"
    return None
