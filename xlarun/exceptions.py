"""The two ways a launch ends before any worker ran: bad input and a launcher fault."""


class UsageError(Exception):
    """Bad flags, values or environment: reported as one line, exit code 2, nothing started."""

    exit_code = 2


class LaunchError(Exception):
    """The launcher itself could not do its part (e.g. a rendezvous failed): one line, exit code 1."""

    exit_code = 1
