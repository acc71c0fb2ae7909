"""The ``--rdzv-conf`` keys that mean something, each with its default and meaning, stated once.

:data:`SETTINGS` is the one table: the rendezvous reads its defaults from it
(:func:`default_seconds`, :mod:`xlarun.rendezvous.store`), ``--help`` lists it (:func:`help_text`),
and the manual's table is held to it by a test (:func:`markdown_table`). A key not listed is read
by neither xlarun nor torch's handler: it is ignored, as torchrun ignores it. What torchrun checks
of a value, per backend, is :data:`xlarun.planning.rules.RDZV_CONF_READ`.

A number of seconds given to a key is bounded as every duration a user gives
(:class:`xlarun.durations.Seconds`: finite, above 0, at most 7 days): :func:`read_seconds` reads it
so, for the rendezvous and for the checks made before anything starts.

Usage::

    heartbeat = default_seconds("heartbeat_timeout")      # 5.0
    read_seconds("read_timeout", "inf")                   # raises UsageError naming --rdzv-conf read_timeout
"""

from __future__ import annotations

from collections.abc import Mapping

from xlarun.durations import Seconds
from xlarun.exceptions import InvalidValue, UsageError
from xlarun.flags import flag
from xlarun.structs import Struct

STATIC = "static"
C10D = "c10d"


class RdzvSetting(Struct, frozen=True):
    """One ``--rdzv-conf`` key: its default, what it means, and the backends that read it."""

    key: str
    meaning: str
    backends: tuple[str, ...]
    seconds: float | None = None
    """The default, where the value is a number of seconds."""
    default_text: str = ""
    """The default in words, where it is no number of seconds."""

    @property
    def default(self) -> str:
        return f"{self.seconds:g} s" if self.seconds is not None else self.default_text


SETTINGS: tuple[RdzvSetting, ...] = (
    RdzvSetting(
        "join_timeout",
        "how long the nodes have to join (under static, timeout gives the default)",
        (STATIC, C10D),
        seconds=600.0,
    ),
    RdzvSetting(
        "last_call_timeout",
        "how long the rendezvous waits for more nodes once the minimum joined",
        (C10D,),
        seconds=30.0,
    ),
    RdzvSetting(
        "close_timeout", "how long a node that leaves waits for the others to leave", (STATIC, C10D), seconds=30.0
    ),
    RdzvSetting(
        "heartbeat_timeout",
        "how long a node may go without a heartbeat before it counts as lost",
        (STATIC, C10D),
        seconds=5.0,
    ),
    RdzvSetting(
        "read_timeout",
        "how long a store call, a heartbeat among them, may go unanswered (torchrun: 60 s)",
        (STATIC, C10D),
        seconds=30.0,
    ),
    RdzvSetting(
        "timeout", "the static join's timeout, torchrun's name for join_timeout there", (STATIC,), seconds=600.0
    ),
    RdzvSetting("keep_alive_interval", "how often torch's c10d handler sends a keep-alive", (C10D,), seconds=5.0),
    RdzvSetting(
        "keep_alive_max_attempt",
        "keep-alives missed before torch's c10d handler drops a node",
        (C10D,),
        default_text="3",
    ),
    RdzvSetting(
        "is_host",
        "true: this node serves the store; false: it never does; unset: the node on the endpoint's host does",
        (C10D,),
        default_text="unset",
    ),
    RdzvSetting(
        "token",
        "the job's shared secret: a node with another one is refused",
        (STATIC, C10D),
        default_text="XLARUN_RDZV_TOKEN or none",
    ),
)

SETTINGS_BY_KEY: Mapping[str, RdzvSetting] = {setting.key: setting for setting in SETTINGS}


def default_seconds(key: str) -> float:
    """The default of a key whose value is a number of seconds."""
    seconds = SETTINGS_BY_KEY[key].seconds
    if seconds is None:
        raise KeyError(f"--rdzv-conf {key} is no number of seconds")
    return seconds


SECONDS = Seconds()
"""What a key whose value is a number of seconds takes."""


def seconds_keys(backend: str) -> tuple[str, ...]:
    """The keys ``backend`` reads as a number of seconds."""
    return tuple(setting.key for setting in SETTINGS if setting.seconds is not None and backend in setting.backends)


def read_seconds(key: str, text: str, source: str = flag("rdzv_conf")) -> float:
    """The seconds ``--rdzv-conf key=text`` gives; a UsageError naming the key and ``source`` (the flag, or
    the flag and the variable that stood in for it) where :data:`SECONDS` refuses them."""
    try:
        return SECONDS(text)
    except InvalidValue as refusal:
        detail = f" ({refusal})" if str(refusal) else ""
        raise UsageError(f"{source} {key}={text!r} is invalid{detail}: {SECONDS.allowed}") from None


def help_text() -> str:
    """``--rdzv-conf``'s help: every key with its default, and the backend where only one reads it."""
    items = [
        f"{setting.key} ({setting.default}{'' if len(setting.backends) > 1 else ', ' + setting.backends[0]}): "
        f"{setting.meaning}"
        for setting in SETTINGS
    ]
    return "Rendezvous settings: " + "; ".join(items) + ". Other keys are ignored."


def markdown_table() -> str:
    """The manual's table of the keys, one row a key."""
    rows = ["| Key | Default | Meaning | Backends |", "| --- | --- | --- | --- |"]
    rows += [
        f"| `{setting.key}` | {setting.default} | {setting.meaning} | {', '.join(setting.backends)} |"
        for setting in SETTINGS
    ]
    return "\n".join(rows)
