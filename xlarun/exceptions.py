"""The two ways a launch ends before any worker ran: bad input and a launcher fault."""


class UsageError(Exception):
    """Bad flags, values or environment: reported as one line, exit code 2, nothing started."""

    exit_code = 2


class PlanError(UsageError):
    """A request the host, the device or the installed packages cannot serve.

    Raised below the command line, so its text speaks of devices, runtimes and counts, not
    of flags; the command line layer may put the flag and its value in front of it.
    """


class LaunchError(Exception):
    """The launcher itself could not do its part (e.g. a rendezvous failed): one line, exit code 1."""

    exit_code = 1


class InvalidValue(ValueError):
    """A value parser's refusal; the optional text says why, beyond what the flag accepts."""
