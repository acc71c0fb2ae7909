"""Every flag xlarun takes, one row each: spellings, value parser, default, help, owner.

The command-line parser (:mod:`xlarun.cli`), ``--help``, the ``PET_*`` fallbacks, the
value checks and the ``--dry-run`` plan's ``options`` all read :data:`OPTIONS`; adding a
flag is adding a row. A row's parser turns the text into its value or raises
:class:`InvalidValue`; :func:`read_options` words that as one line naming the flag,
where the value came from and what :attr:`Option.allowed` says, so each check is worded
once, here.

Usage::

    values = read_options({"nproc_per_node": "2"}, os.environ)
    values["nproc_per_node"]          # NprocRequest(count=2, word=None)
    values.source("master_port")      # "--master-port" or "--master-port (from PET_MASTER_PORT)"
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from xlarun.devices import DEVICES
from xlarun.exceptions import UsageError
from xlarun.packages import RUNTIMES

TORCHRUN = "torchrun"
XLARUN = "xlarun"

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
START_METHODS = ("spawn", "fork", "forkserver")
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
NPROC_WORDS = ("auto", "cpu", "gpu")
LOGS_SPECS = ("default",)
CLUSTER_KINDS = ("none", "auto", "slurm", "k8s", "gke-tpu", "mpi")

DEFAULT_MASTER_PORT = 29500

STDOUT = 1
STDERR = 2


class InvalidValue(ValueError):
    """A parser's refusal; the optional text says why, beyond the row's ``allowed``."""


@dataclass(frozen=True)
class NprocRequest:
    """``--nproc-per-node`` as given: a count, or one of :data:`NPROC_WORDS` resolved later."""

    count: Optional[int] = None
    word: Optional[str] = None

    def __str__(self) -> str:
        return str(self.count) if self.word is None else self.word


@dataclass(frozen=True)
class StreamSpec:
    """Which of a worker's streams (``STDOUT | STDERR`` bits) a redirect or tee applies to."""

    default: int = 0
    per_rank: Optional[Mapping[int, int]] = None

    def for_rank(self, local_rank: int) -> int:
        if self.per_rank is not None:
            return self.per_rank.get(local_rank, 0)
        return self.default


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidValue() from None


def parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) not in (1, 2):
        raise InvalidValue('not in "MIN:MAX" format')
    low, high = _integer(parts[0]), _integer(parts[-1])
    if not 0 < low <= high:
        raise InvalidValue("needs 0 < MIN <= MAX")
    return low, high


def parse_nproc(text: str) -> NprocRequest:
    if text in NPROC_WORDS:
        return NprocRequest(word=text)
    count = _integer(text)
    if count < 1:
        raise InvalidValue("needs at least 1")
    return NprocRequest(count=count)


def parse_non_negative_int(text: str) -> int:
    number = _integer(text)
    if number < 0:
        raise InvalidValue("negative")
    return number


def parse_positive_int(text: str) -> int:
    number = _integer(text)
    if number < 1:
        raise InvalidValue()
    return number


def parse_port(text: str) -> int:
    port = _integer(text)
    if not 0 <= port <= 65535:
        raise InvalidValue("out of range")
    return port


def parse_nonzero_port(text: str) -> int:
    port = parse_port(text)
    if port == 0:
        raise InvalidValue()
    return port


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidValue() from None


def parse_positive_float(text: str) -> float:
    number = _number(text)
    if not number > 0:
        raise InvalidValue("must be positive")
    return number


def parse_seconds(text: str) -> float:
    seconds = _number(text)
    if not 0 <= seconds < math.inf:
        raise InvalidValue()
    return seconds


_STREAM_VALUE = re.compile(r"^[0-3]$")
_STREAM_MAPPING = re.compile(r"^\d+:[0-3](,\d+:[0-3])*$")


def parse_stream_spec(text: str) -> StreamSpec:
    """torchrun's ``-r``/``-t`` format: ``0``–``3`` for every rank, or ``0:1,1:2`` per local rank."""
    if _STREAM_VALUE.match(text):
        return StreamSpec(default=int(text))
    if _STREAM_MAPPING.match(text):
        pairs = (item.split(":") for item in text.split(","))
        return StreamSpec(per_rank={int(rank): int(bits) for rank, bits in pairs})
    raise InvalidValue()


def parse_rank_set(text: str) -> Optional[frozenset[int]]:
    if not text:
        return None
    ranks = frozenset(_integer(item) for item in text.split(","))
    if any(rank < 0 for rank in ranks):
        raise InvalidValue("negative rank")
    return ranks


def parse_rdzv_conf(text: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidValue(f"{item!r} is not key=value")
        conf[key.strip()] = value.strip()
    return conf


def split_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` with IPv6 hosts in brackets, as torchrun's rendezvous parses it."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise InvalidValue("empty endpoint")
    if endpoint.startswith("["):
        host, bracket, rest = endpoint[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidValue("an IPv6 host needs the form [addr]:port")
        port_text = rest[1:]
    else:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if not host:
        raise InvalidValue("no host")
    port = parse_port(port_text) if port_text else default_port
    return host, port


def parse_endpoint(text: str) -> str:
    """The endpoint as given once it parses; the rendezvous splits it with its own default port."""
    if text:
        split_endpoint(text, 0)
    return text


def parse_summary_file(path: str) -> str:
    """Catch a path that can never take the summary before the run, not after it."""
    if not path or os.path.isdir(path):
        raise InvalidValue("a directory" if path else "empty")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InvalidValue(f"{parent} is not a directory")
    return path


def choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise InvalidValue()
        return text

    return parse


def text(value: str) -> str:
    return value


def one_of(choices: tuple[str, ...]) -> str:
    return "expected one of " + ", ".join(choices)


STREAMS_ALLOWED = "expected 0-3, or LOCAL_RANK:0-3 pairs like 0:1,1:2"


@dataclass(frozen=True)
class Option:
    """One flag. ``parse`` is None for a switch (no value; ``PET_<NAME>`` is then 0 or 1)."""

    spellings: tuple[str, ...]
    help: str
    parse: Optional[Callable[[str], Any]] = None
    default: Optional[str] = None
    allowed: str = ""
    owner: str = TORCHRUN
    variable: Optional[str] = None
    """The environment variable that stands in for the flag when it is not given:
    ``PET_<NAME>`` for torchrun's flags, as torchrun reads them; named per row for xlarun's."""

    @property
    def dest(self) -> str:
        """argparse's dest: the first long spelling without dashes, ``-`` turned into ``_``."""
        long_name = next(name for name in self.spellings if name.startswith("--"))
        return long_name[2:].replace("-", "_")

    @property
    def takes_value(self) -> bool:
        return self.parse is not None

    @property
    def display_name(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def environment_variable(self) -> Optional[str]:
        return "PET_" + self.dest.upper() if self.owner == TORCHRUN else self.variable


def _torchrun(spellings: tuple[str, ...], help_text: str, parse: Optional[Callable[[str], Any]] = None,
              default: Optional[str] = None, allowed: str = "") -> Option:
    return Option(spellings, help_text, parse, default, allowed)


def _xlarun(spellings: tuple[str, ...], help_text: str, parse: Optional[Callable[[str], Any]] = None,
            default: Optional[str] = None, allowed: str = "", variable: Optional[str] = None) -> Option:
    return Option(spellings, help_text, parse, default, allowed, XLARUN, variable)


OPTIONS: tuple[Option, ...] = (
    # torchrun 2.9's flags, in the order its --help lists them.
    _torchrun(("--nnodes",), "Number of nodes, N or MIN:MAX.", parse_nnodes, "1:1",
              "expected N or MIN:MAX with 0 < MIN <= MAX"),
    _torchrun(("--nproc-per-node", "--nproc_per_node"), "Workers per node: N, auto, cpu or gpu.", parse_nproc, "1",
              "expected a positive integer, auto, cpu or gpu"),
    _torchrun(("--rdzv-backend", "--rdzv_backend"), "Rendezvous backend: static or c10d.", choice(RDZV_BACKENDS),
              "static", one_of(RDZV_BACKENDS)),
    _torchrun(("--rdzv-endpoint", "--rdzv_endpoint"), "Rendezvous endpoint, host[:port].", parse_endpoint, "",
              "expected host[:port], IPv6 as [addr]:port"),
    _torchrun(("--rdzv-id", "--rdzv_id"), "Job id shared by all nodes.", text, "none"),
    _torchrun(("--rdzv-conf", "--rdzv_conf"), "Rendezvous options, key=value,...", parse_rdzv_conf, "",
              "expected key=value[,key=value...]"),
    _torchrun(("--standalone",), "Single node on a free port with a fresh run id."),
    _torchrun(("--max-restarts", "--max_restarts"), "Group restarts before failing.", parse_non_negative_int, "0",
              "expected a non-negative integer"),
    _torchrun(("--monitor-interval", "--monitor_interval"), "Accepted for compatibility: exits are seen at once.",
              parse_positive_float, "0.1", "expected a positive number of seconds"),
    _torchrun(("--start-method", "--start_method"), "spawn, fork or forkserver (accepted; workers are processes).",
              choice(START_METHODS), "spawn", one_of(START_METHODS)),
    _torchrun(("--event-log-handler", "--event_log_handler"), "Accepted for compatibility.", text, "null"),
    _torchrun(("--role",), "Worker role name (ROLE_NAME, log prefix).", text, "default"),
    _torchrun(("-m", "--module"), "Run the script as a module: python -u -m."),
    _torchrun(("--no-python", "--no_python"), "Execute the script directly, without python."),
    _torchrun(("--run-path", "--run_path"), "Run the script with runpy.run_path."),
    _torchrun(("--log-dir", "--log_dir"), "Base directory for worker logs.", text),
    _torchrun(("-r", "--redirects"), "Redirect streams to files: 0-3 or LOCAL_RANK:0-3,...", parse_stream_spec,
              "0", STREAMS_ALLOWED),
    _torchrun(("-t", "--tee"), "Tee streams to files and console: 0-3 or LOCAL_RANK:0-3,...", parse_stream_spec,
              "0", STREAMS_ALLOWED),
    _torchrun(("--local-ranks-filter", "--local_ranks_filter"), "Local ranks shown on the console, e.g. 0,1.",
              parse_rank_set, "", "expected a comma-separated list of local ranks, e.g. 0,1,2"),
    _torchrun(("--node-rank", "--node_rank"), "This node's rank (static rendezvous).", parse_non_negative_int, "0",
              "expected a non-negative integer"),
    _torchrun(("--master-addr", "--master_addr"), "Address of node 0 (static rendezvous).", text, "127.0.0.1"),
    _torchrun(("--master-port", "--master_port"), "Port of node 0's store (static rendezvous).", parse_port,
              str(DEFAULT_MASTER_PORT), "expected a port number 0..65535"),
    _torchrun(("--local-addr", "--local_addr"), "This node's address.", text),
    _torchrun(("--logs-specs", "--logs_specs"), "Logs specs; only 'default'.", choice(LOGS_SPECS),
              allowed="xlarun has only 'default'"),
    _torchrun(("--numa-binding", "--numa_binding"), "node, socket, exclusive or core-complex (accepted).",
              choice(NUMA_BINDINGS), allowed=one_of(NUMA_BINDINGS)),
    # xlarun's own.
    _xlarun(("--dry-run", "--dry_run"), "Print the launch plan as JSON and start nothing."),
    _xlarun(("--kill-timeout", "--kill_timeout"), "Seconds between SIGTERM and SIGKILL at teardown (default 30).",
            parse_seconds, "30", "expected a number of seconds >= 0"),
    _xlarun(("--summary-file", "--summary_file"), "Write a JSON record of the run to this path.",
            parse_summary_file, allowed="give a path to the JSON file to write"),
    _xlarun(("--device",), "auto, tpu, neuron, cuda, cpu or xpu (env XLARUN_DEVICE).", choice(DEVICES), "auto",
            one_of(DEVICES), variable="XLARUN_DEVICE"),
    _xlarun(("--runtime",), "auto, pjrt or xrt.", choice(RUNTIMES), "auto", one_of(RUNTIMES)),
    _xlarun(("--spmd",), "One process per node that sees every local device."),
    _xlarun(("--virtual-devices", "--virtual_devices"), "CPU devices per process (CPU_NUM_DEVICES).",
            parse_positive_int, allowed="expected a positive integer"),
    _xlarun(("--coordinator-port", "--coordinator_port"), "Port of the XLA coordinator (default: a fixed rule).",
            parse_nonzero_port, allowed="expected a port number 1..65535"),
    _xlarun(("--cluster",), "none, auto, slurm, k8s, gke-tpu or mpi (env XLARUN_CLUSTER).", choice(CLUSTER_KINDS),
            "none", one_of(CLUSTER_KINDS), variable="XLARUN_CLUSTER"),
)

OPTIONS_BY_DEST: Mapping[str, Option] = {option.dest: option for option in OPTIONS}


def flag(dest: str) -> str:
    """How messages name an option: its long spelling with dashes (``--nproc-per-node``)."""
    return OPTIONS_BY_DEST[dest].display_name


class OptionValues(Mapping[str, Any]):
    """Every option's parsed value by dest (``None`` for a value-less option not given).

    A switch is ``True`` or ``False``. ``raw(dest)`` is the text the value came from and
    ``source(dest)`` names where: the flag, or the flag and the variable that stood in.
    """

    def __init__(self, values: dict[str, Any], raw: dict[str, Optional[str]], sources: dict[str, str]):
        self._values, self._raw, self._sources = values, raw, sources

    def __getitem__(self, dest: str) -> Any:
        return self._values[dest]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def raw(self, dest: str) -> Optional[str]:
        return self._raw[dest]

    def source(self, dest: str) -> str:
        return self._sources[dest]

    def given_or_default(self, dest: str) -> Any:
        """The value, or the row's default where the text given was empty (``--role ''``)."""
        return self._values[dest] or OPTIONS_BY_DEST[dest].default

    def refuse(self, dest: str, reason: str) -> UsageError:
        """A one-line error about the value of ``dest``: ``--flag='value' <reason>``."""
        return UsageError(f"{self.source(dest)}={self.raw(dest)!r} {reason}")


def read_options(given: Mapping[str, Optional[str]], environ: Mapping[str, str]) -> OptionValues:
    """Parse every option: the command line's text, else its variable, else its default.

    ``given`` maps dests to the text the command line gave (``"1"`` for a switch).
    Raises :class:`UsageError` for the first value its row refuses.
    """
    values: dict[str, Any] = {}
    raws: dict[str, Optional[str]] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        dest = option.dest
        raw, source = given.get(dest), option.display_name
        variable = option.environment_variable
        if raw is None and variable is not None and variable in environ:
            raw, source = environ[variable], f"{source} (from {variable})"
        if raw is None:
            raw = option.default
        raws[dest], sources[dest] = raw, source
        if not option.takes_value:
            values[dest] = _switch(raw, source)
        elif raw is None:
            values[dest] = None
        else:
            values[dest] = _parse(option, raw, source)
    return OptionValues(values, raws, sources)


def _switch(raw: Optional[str], source: str) -> bool:
    if raw is None:
        return False
    try:
        return int(raw) != 0
    except ValueError:
        raise UsageError(f"{source} must be 0 or 1, got {raw!r}") from None


def _parse(option: Option, raw: str, source: str) -> Any:
    assert option.parse is not None
    try:
        return option.parse(raw)
    except InvalidValue as refusal:
        detail = f" ({refusal})" if str(refusal) else ""
        raise UsageError(f"{source}={raw!r} is invalid{detail}: {option.allowed}") from None
