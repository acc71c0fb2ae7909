"""How long a user may ask xlarun to wait: the bounds of every number of seconds given to it.

Flags (``--shutdown-timeout``, ``--hang-timeout``, ...), the variables that stand in for them
and the ``--rdzv-conf`` keys all take their seconds through :class:`Seconds`: a finite number,
above 0 (or 0 where a wait of none means something), at most :data:`MAX_SECONDS`.

Usage::

    grace = Seconds(zero_allowed=True)
    grace("30")         # 30.0
    grace("inf")        # raises InvalidValue("not finite")
    grace.allowed       # "expected a number of seconds from 0 to 604800 (7 days)"
    Seconds()("0")      # raises InvalidValue(): a wait of none is no timeout
"""

from __future__ import annotations

import math

from xlarun.exceptions import InvalidValue
from xlarun.structs import Struct

MAX_DAYS = 7
MAX_SECONDS = MAX_DAYS * 24 * 60 * 60
"""The longest wait a user may ask for: 7 days. Every wait the launcher makes with a given number
of seconds, plus the few seconds it adds, stays within what each clock and wait takes on every
platform: ``poll``'s and ``epoll``'s timeout (a C int of milliseconds, about 24.8 days),
``threading.TIMEOUT_MAX`` (about 49.7 days on Windows), ``datetime.timedelta`` and torch's store
timeouts; and it is longer than any wait a job means."""


class Seconds(Struct, frozen=True):
    """A parser of a number of seconds: finite, above 0 (or 0 too, where ``zero_allowed``), at most
    :data:`MAX_SECONDS`. Raises :class:`InvalidValue` saying what is wrong with the text."""

    zero_allowed: bool = False

    def __call__(self, text: str) -> float:
        try:
            seconds = float(text)
        except ValueError:
            raise InvalidValue() from None
        if not math.isfinite(seconds):
            raise InvalidValue("not finite")
        if seconds > MAX_SECONDS:
            raise InvalidValue(f"over {MAX_DAYS} days")
        if seconds < 0 or (seconds == 0 and not self.zero_allowed):
            raise InvalidValue()
        return seconds

    @property
    def allowed(self) -> str:
        """What the parser takes, as a refusal words it."""
        if self.zero_allowed:
            return f"expected a number of seconds from 0 to {MAX_SECONDS} ({MAX_DAYS} days)"
        return f"expected a positive number of seconds up to {MAX_SECONDS} ({MAX_DAYS} days)"


def format_age(seconds: float) -> str:
    """``45s``, ``3m12s``, ``5h07m``, ``2d04h``: two units at most."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
