"""Every flag xlarun takes, one row each: spellings, value parser, default, help, owner.

The command-line parser (:mod:`xlarun.cli.command`), ``--help``, the ``PET_*`` fallbacks and
the value checks all read :data:`OPTIONS`; adding a flag is adding a row. A row's parser
turns the text into its value or raises :class:`InvalidValue`; :func:`read_options` words
that as one line naming the flag, where the value came from and what :attr:`Option.allowed`
says, so each check is worded once, here.

Usage::

    values = read_options({"nproc_per_node": "2"}, os.environ)
    values["nproc_per_node"]          # NprocRequest(count=2, word=None)
    values.source("master_port")      # "--master-port" or "--master-port (from PET_MASTER_PORT)"

Under ``--cluster`` the scheduler's values take the place of those the command line left out
(:meth:`OptionValues.with_scheduler`), and name it as their source.

The words that ask for something other than a launch are read here too, before the options:
``--stacks [PID]`` (:func:`stacks_request`) and the verbs of runs left running (:data:`VERBS`,
:func:`verb_request`): ``--jobs [--json] [--prune]``, ``--logs ID [--follow]``, ``--attach ID``,
``--stop ID``, ``--wait ID``, ``--status ID [--json]``, an id shortened to any prefix that names one
run. They are options of the one command, so no word of theirs can clash with a training script's name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

from xlarun.config import (
    DEFAULT_C10D_PORT,
    DEFAULT_MASTER_PORT,
    NprocRequest,
    SignalList,
    StreamSpec,
    parse_port,
    parse_signal,
    split_endpoint,
)
from xlarun.durations import Seconds
from xlarun.exceptions import InvalidValue, UsageError
from xlarun.flags import STACKS_NAME, flag
from xlarun.host.devices import DEVICES
from xlarun.planning.device import NPROC_ALLOWED
from xlarun.planning.packages import RUNTIMES
from xlarun.rdzv_conf import help_text as rdzv_conf_help
from xlarun.runtimes import CACHE_WRITERS, COORDINATOR_PORT_SHIFT, UNPRIVILEGED_PORTS, coordinator_port
from xlarun.structs import Struct

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any

TORCHRUN = "torchrun"
XLARUN = "xlarun"

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
START_METHODS = ("spawn", "fork", "forkserver")
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
LOGS_SPECS = ("default",)
CLUSTER_KINDS = ("none", "auto", "slurm", "k8s", "gke-tpu", "tpu-vm", "mpi")
EVENT_LOG_HANDLERS = ("null", "console", "dynamic_rendezvous")
"""torchrun's event handlers (``torch.distributed.elastic.events.handlers``); only ``console`` writes anything."""


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


MAX_WORKERS_PER_NODE = 4194304
"""Linux's ``PID_MAX_LIMIT`` on 64-bit hosts: no host runs more processes, so no node more workers."""


_NPROC_WORD = r"^[a-z][a-z0-9_]*$"
"""A word for the count: ``auto``, ``cpu``, ``gpu``, ``xpu``, ``tpu``, ``neuron``, or what looks like a PrivateUse1
backend's name (``npu``), checked against the installed torch's once the workers are counted
(:func:`xlarun.planning.device.count_workers`)."""


def parse_nproc(text: str) -> NprocRequest:
    if re.match(_NPROC_WORD, text):
        return NprocRequest(word=text)
    count = _integer(text)
    if count < 1:
        raise InvalidValue("needs at least 1")
    if count > MAX_WORKERS_PER_NODE:
        raise InvalidValue(f"over {MAX_WORKERS_PER_NODE}, the most processes a Linux host runs")
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


def parse_nonzero_port(text: str) -> int:
    port = parse_port(text)
    if port == 0:
        raise InvalidValue()
    return port


GRACE_SECONDS = Seconds(zero_allowed=True)
"""A grace before SIGKILL: 0 is SIGKILL at once."""
SECONDS = Seconds()


_STREAM_VALUE = r"^[0-3]$"
_STREAM_MAPPING = r"^\d+:[0-3](,\d+:[0-3])*$"


def parse_stream_spec(text: str) -> StreamSpec:
    """torchrun's ``-r``/``-t`` format: ``0``–``3`` for every rank, or ``0:1,1:2`` per local rank."""
    if re.match(_STREAM_VALUE, text):
        return StreamSpec(default=int(text))
    if re.match(_STREAM_MAPPING, text):
        pairs = (item.split(":") for item in text.split(","))
        return StreamSpec(per_rank={_integer(rank): int(bits) for rank, bits in pairs})
    raise InvalidValue()


def parse_line_filters(text: str) -> tuple[str, ...]:
    """torchrun's ``--duplicate-*-filters``: comma-separated strings, ``,,`` for a comma in one.

    Given at all, even empty, it is a list (``''`` is one empty string, which every line holds),
    as torchrun's parser makes it. A NUL stands in for the escaped comma while splitting: no
    argument or environment value can hold one.
    """
    return tuple(item.replace("\0", ",") for item in text.replace(",,", "\0").split(","))


def parse_rank_set(text: str) -> frozenset[int] | None:
    if not text:
        return None
    ranks = frozenset(_integer(item) for item in text.split(","))
    if any(rank < 0 for rank in ranks):
        raise InvalidValue("negative rank")
    return ranks


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's ``key=value,...``: every item needs a key and a value, both stripped; values are
    checked later, and only where the rendezvous backend reads them (:mod:`xlarun.config`)."""
    conf: dict[str, str] = {}
    if not text.strip():
        return conf
    for item in text.strip().split(","):
        key, _, value = item.partition("=")
        if not key.strip() or not value.strip():
            raise InvalidValue(f"{item!r} is not key=value")
        conf[key.strip()] = value.strip()
    return conf


def parse_host(text: str) -> str:
    """A host name or address: an empty one would leave the workers nowhere to meet."""
    if not text.strip():
        raise InvalidValue("empty")
    return text


def parse_endpoint(text: str) -> str:
    """The endpoint as given once it parses; the rendezvous splits it with its own default port."""
    if text:
        split_endpoint(text, 0)
    return text


def parse_file_to_write(path: str) -> str:
    """Catch a path that can never take what the launcher writes there (the summary, the metrics) before
    the run, not after it.

    Such a file is written through a new file beside it, so the nearest directory
    that exists must let this user create entries (``W_OK`` and ``X_OK``; the missing ones below
    it are made then).
    """
    if not path or os.path.isdir(path):
        raise InvalidValue("a directory" if path else "empty")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InvalidValue(f"{parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidValue(f"{parent} is not writable")
    return path


def parse_metrics_textfile(path: str) -> str:
    """A FIFO or a device node already at ``path`` is written in place (its own permission decides when it
    is opened, as for the event log); anything else is a file written beside the file it is, or that a
    link names, so :func:`parse_file_to_write` checks that file's directory."""
    if path and os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        return path
    parse_file_to_write(os.path.realpath(path) if path else path)
    return path


def parse_event_log(path: str) -> str:
    """``-``, or a path whose directory exists (the file is created, or appended to, at the start)."""
    if path == "-":
        return path
    if not path or os.path.isdir(path):
        raise InvalidValue("a directory" if path else "empty")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidValue(f"{parent} is not a directory")
    return path


def parse_directory(path: str) -> str:
    """A local directory, made absolute: the workers get it whatever directory they start in (whether it
    can be created and written is checked on the node that runs them, before they start)."""
    if not path.strip():
        raise InvalidValue("empty")
    if "://" in path:
        raise InvalidValue("a URL")
    return os.path.abspath(path)


def _host_list(names: list[str]) -> tuple[str, ...]:
    """A job's hosts: at least one, none twice (one host named twice would run two nodes meant for two hosts)."""
    if not names:
        raise InvalidValue("names no host")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidValue(f"names {name} twice")
        seen.add(name)
    return tuple(names)


def parse_hosts(text: str) -> tuple[str, ...]:
    """``h1,h2`` or Slurm's ranges (``tpu-w[0-3]``), read as Slurm reads ``SLURM_JOB_NODELIST``."""
    # The parsers of a job on several hosts load their modules only where such a job is asked for.
    from xlarun.planning.hostlist import expand_hostlist

    try:
        return _host_list(expand_hostlist(text))
    except UsageError as error:
        raise InvalidValue(str(error)) from None


def _read_text(path: str) -> str:
    try:
        # utf-8-sig: a byte order mark (an editor's on Windows) is no part of the first line.
        with open(path, encoding="utf-8-sig") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidValue(f"cannot read it: {getattr(error, 'strerror', None) or error}") from None


def parse_hostfile(path: str) -> tuple[str, ...]:
    """The first word of each line, so MPI's and DeepSpeed's host files (``h1 slots=4``) serve; ``#`` starts a
    comment."""
    lines = (line.partition("#")[0].split() for line in _read_text(path).splitlines())
    return _host_list([words[0] for words in lines if words])


def parse_rsh(template: str) -> str:
    from xlarun.remote.transport import template_problem

    problem = template_problem(template)
    if problem is not None:
        raise InvalidValue(problem)
    return template


ENV_SEPARATOR = "\0"
"""Joins the values of a repeated ``--env`` into one text: no argument can hold a NUL."""


def parse_env(text: str) -> tuple[tuple[str, str], ...]:
    """Every ``--env NAME=VALUE`` given, in order."""
    from xlarun.remote.plan import parse_env_assignment

    try:
        return tuple(parse_env_assignment(item) for item in text.split(ENV_SEPARATOR))
    except ValueError as error:
        raise InvalidValue(str(error)) from None


def parse_env_file(path: str) -> dict[str, str]:
    from xlarun.remote.plan import read_env_file

    try:
        return read_env_file(_read_text(path))
    except ValueError as error:
        raise InvalidValue(str(error)) from None


class Choice:
    """A parser that takes one of ``choices``; shell completion offers them."""

    def __init__(self, choices: tuple[str, ...]):
        self.choices = choices

    def __call__(self, text: str) -> str:
        if text not in self.choices:
            raise InvalidValue()
        return text


choice = Choice


def text(value: str) -> str:
    return value


def one_of(choices: tuple[str, ...]) -> str:
    return "expected one of " + ", ".join(choices)


STREAMS_ALLOWED = "expected 0-3, or LOCAL_RANK:0-3 pairs like 0:1,1:2"


class Option(Struct, frozen=True):
    """One flag. ``parse`` is None for a switch (no value; ``PET_<NAME>`` is then 0 or 1)."""

    spellings: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] | None = None
    default: str | None = None
    allowed: str = ""
    owner: str = TORCHRUN
    variable: str | None = None
    """The environment variable that stands in for the flag when it is not given: for xlarun's
    flags the only one; for torchrun's the one torchrun reads after ``PET_<NAME>``, if any
    (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``)."""
    metavar: str = ""
    """How ``--help`` names the value (``N``, ``PATH``, ``static|c10d``); empty for a switch."""
    shown_default: str | None = None
    """The default as ``--help`` words it where ``default`` alone says too little (empty, or a rule)."""
    repeatable: bool = False
    """Given several times, every value counts (joined with :data:`ENV_SEPARATOR` for the parser)."""

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
        return flag(self.dest)

    @property
    def environment_variables(self) -> tuple[str, ...]:
        """The variables that stand in for the flag, the first one set winning."""
        own = (self.variable,) if self.variable else ()
        return ("PET_" + self.dest.upper(), *own) if self.owner == TORCHRUN else own

    @property
    def choices(self) -> tuple[str, ...]:
        """The values a choice row takes (empty for the others): what shell completion offers."""
        return self.parse.choices if isinstance(self.parse, Choice) else ()


def _torchrun(
    spellings: tuple[str, ...],
    help_text: str,
    parse: Callable[[str], Any] | None = None,
    default: str | None = None,
    allowed: str = "",
    *,
    metavar: str = "",
    shown_default: str | None = None,
    variable: str | None = None,
) -> Option:
    return Option(
        spellings, help_text, parse, default, allowed, variable=variable, metavar=metavar, shown_default=shown_default
    )


def _xlarun(
    spellings: tuple[str, ...],
    help_text: str,
    parse: Callable[[str], Any] | None = None,
    default: str | None = None,
    allowed: str = "",
    variable: str | None = None,
    *,
    metavar: str = "",
    shown_default: str | None = None,
) -> Option:
    return Option(spellings, help_text, parse, default, allowed, XLARUN, variable, metavar, shown_default)


def _choices(choices: tuple[str, ...]) -> str:
    return "|".join(choices)


STREAMS_METAVAR = "0-3|RANK:0-3,..."
FILTERS_HELP = (
    "lines (of the streams --tee shows) holding any of these strings are copied, prefixed, to "
    "attempt_<n>/{file} in the run's log directory; ,, stands for a comma."
)
COORDINATOR_RULE = (
    f"{UNPRIVILEGED_PORTS[0]} + (MASTER_PORT - {UNPRIVILEGED_PORTS[0]} + {COORDINATOR_PORT_SHIFT}) "
    f"mod {UNPRIVILEGED_PORTS[1] - UNPRIVILEGED_PORTS[0] + 1}, "
    f"{coordinator_port(DEFAULT_MASTER_PORT)} for {DEFAULT_MASTER_PORT}"
)


OPTIONS: tuple[Option, ...] = (
    # torchrun's flags (2.9 to 2.15), in the order its --help lists them.
    _torchrun(
        ("--nnodes",),
        "Number of nodes; a range MIN:MAX lets a c10d job start with MIN.",
        parse_nnodes,
        "1:1",
        "expected N or MIN:MAX with 0 < MIN <= MAX",
        metavar="N|MIN:MAX",
    ),
    _torchrun(
        ("--nproc-per-node", "--nproc_per_node"),
        "Workers on this node. auto: one per TPU chip, NeuronCore or GPU of the device (on cpu: the GPUs, "
        "else the CPUs); gpu: the GPUs; cpu: the CPUs; xpu: the XPUs torch.xpu counts; tpu, neuron: what auto "
        "counts on that device; another device backend's name (torch's PrivateUse1): the devices it counts. "
        "Always 1 under --spmd.",
        parse_nproc,
        "1",
        NPROC_ALLOWED,
        metavar="N|auto|gpu|cpu|xpu|tpu|neuron",
    ),
    _torchrun(
        ("--rdzv-backend", "--rdzv_backend"),
        "How nodes meet. static: each node gives --node-rank, node 0 serves the store at --master-addr and "
        "--master-port. c10d: node ranks are assigned at --rdzv-endpoint. etcd is refused.",
        choice(RDZV_BACKENDS),
        "static",
        one_of(RDZV_BACKENDS),
        metavar="static|c10d",
    ),
    _torchrun(
        ("--rdzv-endpoint", "--rdzv_endpoint"),
        f"The c10d store, IPv6 as [addr]:port; the port defaults to {DEFAULT_C10D_PORT}, 0 picks a free one "
        "on a single node. With static it replaces --master-addr and --master-port, and names its port.",
        parse_endpoint,
        "",
        "expected host[:port], IPv6 as [addr]:port",
        metavar="HOST[:PORT]",
        shown_default=f"MASTER_ADDR:{DEFAULT_C10D_PORT} under c10d",
    ),
    _torchrun(
        ("--rdzv-id", "--rdzv_id"),
        "Job id, the same on every node; workers get it as TORCHELASTIC_RUN_ID.",
        text,
        "none",
        metavar="ID",
    ),
    _torchrun(
        ("--rdzv-conf", "--rdzv_conf"),
        rdzv_conf_help(),
        parse_rdzv_conf,
        "",
        "expected key=value[,key=value...]",
        metavar="KEY=VALUE,...",
        shown_default="",
    ),
    _torchrun(
        ("--standalone",), "One node on a free localhost port with a fresh run id; the rendezvous flags are ignored."
    ),
    _torchrun(
        ("--max-restarts", "--max_restarts"),
        "Restart every node's workers together after a failure, up to N times.",
        parse_non_negative_int,
        "0",
        "expected a non-negative integer",
        metavar="N",
    ),
    _torchrun(
        ("--monitor-interval", "--monitor_interval"),
        "Accepted, unused: worker exits are seen as they happen.",
        SECONDS,
        "0.1",
        SECONDS.allowed,
        metavar="SECONDS",
    ),
    _torchrun(
        ("--start-method", "--start_method"),
        "Accepted, unused: workers are always fresh processes.",
        choice(START_METHODS),
        "spawn",
        one_of(START_METHODS),
        metavar=_choices(START_METHODS),
    ),
    _torchrun(
        ("--event-log-handler", "--event_log_handler"),
        "console: torchrun's torchelastic.worker.status.* events on stderr, one JSON line each, with real "
        "timestamps; null and dynamic_rendezvous: none.",
        choice(EVENT_LOG_HANDLERS),
        "null",
        one_of(EVENT_LOG_HANDLERS),
        metavar=_choices(EVENT_LOG_HANDLERS),
    ),
    _torchrun(("--role",), "Worker role: ROLE_NAME and the log prefix.", text, "default", metavar="NAME"),
    _torchrun(("-m", "--module"), "Run the script as a module: python -u -m MODULE."),
    _torchrun(("--no-python", "--no_python"), "Execute the script directly, not with python."),
    _torchrun(("--run-path", "--run_path"), "Run the script with runpy.run_path in a fresh interpreter."),
    _torchrun(
        ("--log-dir", "--log_dir"),
        "Base directory of the workers' logs and error files.",
        text,
        metavar="PATH",
        shown_default="a temporary directory",
    ),
    _torchrun(
        ("-r", "--redirects"),
        "Worker streams to files only: 0 none, 1 stdout, 2 stderr, 3 both; per local rank as 0:3,1:1.",
        parse_stream_spec,
        "0",
        STREAMS_ALLOWED,
        metavar=STREAMS_METAVAR,
    ),
    _torchrun(
        ("-t", "--tee"),
        "Worker streams to files and to the console, prefixed [role local_rank]:; values as --redirects.",
        parse_stream_spec,
        "0",
        STREAMS_ALLOWED,
        metavar=STREAMS_METAVAR,
    ),
    _torchrun(
        ("--log-line-prefix-template", "--log_line_prefix_template"),
        "The prefix of each line --tee shows, with ${role_name}, ${rank}, ${local_rank} and ${hostname} "
        "(this host's short name) substituted. Empty: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else the "
        "default.",
        text,
        "",
        metavar="TEMPLATE",
        shown_default="[${role_name}${local_rank}]:",
    ),
    _torchrun(
        ("--local-ranks-filter", "--local_ranks_filter"),
        "Local ranks shown on the console, e.g. 0,1; the files keep every rank.",
        parse_rank_set,
        "",
        "expected a comma-separated list of local ranks, e.g. 0,1,2",
        metavar="RANK,...",
        shown_default="every rank",
    ),
    _torchrun(
        ("--duplicate-stdout-filters", "--duplicate_stdout_filters"),
        "Stdout " + FILTERS_HELP.format(file="filtered_stdout.log"),
        parse_line_filters,
        metavar="TEXT,...",
        shown_default="no copy",
    ),
    _torchrun(
        ("--duplicate-stderr-filters", "--duplicate_stderr_filters"),
        "Stderr " + FILTERS_HELP.format(file="filtered_stderr.log"),
        parse_line_filters,
        metavar="TEXT,...",
        shown_default="no copy",
    ),
    _torchrun(
        ("--node-rank", "--node_rank"),
        "This node's rank, 0 to nnodes-1 (static).",
        parse_non_negative_int,
        "0",
        "expected a non-negative integer",
        metavar="N",
    ),
    _torchrun(
        ("--master-addr", "--master_addr"),
        "Node 0's address (static): its store listens there; the workers' MASTER_ADDR.",
        parse_host,
        "127.0.0.1",
        "expected a host name or address",
        metavar="HOST",
    ),
    _torchrun(
        ("--master-port", "--master_port"),
        "Port of node 0's store (static); the workers' MASTER_PORT.",
        parse_port,
        str(DEFAULT_MASTER_PORT),
        "expected a port number 0..65535",
        metavar="PORT",
    ),
    _torchrun(
        ("--local-addr", "--local_addr"),
        "This node's address as the others reach it (c10d: where node rank 0 serves the workers' store).",
        text,
        metavar="HOST",
        shown_default="the address that routes to the store",
    ),
    _torchrun(
        ("--logs-specs", "--logs_specs"),
        "Logs specs; only 'default' exists.",
        choice(LOGS_SPECS),
        allowed="xlarun has only 'default'",
        metavar="NAME",
        shown_default="default",
    ),
    _torchrun(
        ("--numa-binding", "--numa_binding"),
        "Validated, not applied: workers are not bound to NUMA nodes.",
        choice(NUMA_BINDINGS),
        allowed=one_of(NUMA_BINDINGS),
        metavar=_choices(NUMA_BINDINGS),
    ),
    _torchrun(
        ("--signals-to-handle", "--signals_to_handle"),
        "Signals the launcher forwards to every worker and then stops them with, exiting 128+N. SIGUSR1 and "
        "SIGUSR2 are always forwarded and the run goes on; Ctrl-Z always suspends the workers. A signal "
        "left out keeps its default action (the orphan guard then kills the workers). SIGKILL, SIGSTOP, "
        "SIGCHLD and SIGCONT are refused.",
        SignalList.parse,
        SignalList().text,
        "expected signal names such as SIGTERM,SIGUSR1",
        metavar="SIGNAL,...",
    ),
    _torchrun(
        ("--shutdown-timeout", "--shutdown_timeout", "--kill-timeout", "--kill_timeout"),
        "Grace between the stop signal and SIGKILL when workers are stopped (--kill-timeout is xlarun's older name).",
        GRACE_SECONDS,
        "30",
        GRACE_SECONDS.allowed,
        metavar="SECONDS",
        variable="TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    ),
    _torchrun(
        ("--virtual-local-rank", "--virtual_local_rank"),
        "Every worker gets LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES (the local rank's "
        "entry of the launcher's list, else the local rank). Refused with several workers per node on tpu, "
        "neuron, cuda and xpu, whose runtimes place each process by its local rank.",
    ),
    # xlarun's own.
    _xlarun(
        ("--dry-run", "--dry_run"),
        "Print the plan as JSON (every worker's argv and environment) and start "
        "nothing; values a rendezvous decides read <decided at rendezvous>.",
    ),
    _xlarun(
        ("--summary-file", "--summary_file"),
        "Write a JSON record of the run for CI: result, exit_code, root_cause, attempts.",
        parse_file_to_write,
        allowed="give a path to the JSON file to write",
        metavar="PATH",
    ),
    _xlarun(
        ("--event-log", "--event_log"),
        "Write the run's events as JSON lines, as they happen (- for stderr): "
        "the launch, each rendezvous, each worker's start and exit, restarts, "
        "lost nodes, hangs, the end. A sink that cannot keep up costs events, "
        "counted as events_dropped in the summary, never the run.",
        parse_event_log,
        allowed="give a path to the file to append to, or - for stderr",
        variable="XLARUN_EVENT_LOG",
        metavar="PATH",
    ),
    _xlarun(
        ("--device",),
        "XLA device, the workers' PJRT_DEVICE. auto: PJRT_DEVICE if set, else this host's TPU "
        "chips, Neuron devices or NVIDIA GPUs, else cpu.",
        choice(DEVICES),
        "auto",
        one_of(DEVICES),
        variable="XLARUN_DEVICE",
        metavar=_choices(DEVICES),
    ),
    _xlarun(
        ("--runtime",),
        "Device runtime. auto: xrt with torch_xla 2.0 or older; without torch_xla, torchtpu "
        "(TorchTPU) on TPU where torch_tpu is installed, torchneuron (TorchNeuron) on Neuron "
        "where torch-neuronx is; else pjrt. xrt needs torch_xla 2.0 or older (2.1 removed it).",
        choice(RUNTIMES),
        "auto",
        one_of(RUNTIMES),
        metavar=_choices(RUNTIMES),
    ),
    _xlarun(
        ("--spmd",),
        "One process per node that sees every local device (FSDPv2); on TPU every chip of the host "
        "is visible to it. The program switches SPMD on with torch_xla.runtime.use_spmd() "
        "(xlarun.init_process_group() calls it); XLA_USE_SPMD=1 is set on Neuron only.",
    ),
    _xlarun(
        ("--virtual-devices", "--virtual_devices"),
        "CPU only: N XLA devices in each process (CPU_NUM_DEVICES).",
        parse_positive_int,
        allowed="expected a positive integer",
        metavar="N",
    ),
    _xlarun(
        ("--coordinator-port", "--coordinator_port"),
        "Port of the XLA coordinator at MASTER_ADDR (Neuron's root communicator, XLA:GPU's coordinator, XRT's mesh).",
        parse_nonzero_port,
        allowed="expected a port number 1..65535",
        metavar="PORT",
        shown_default=COORDINATOR_RULE,
    ),
    _xlarun(
        ("--cluster",),
        "Take the node count, node rank and node 0 from the scheduler (Slurm, Kubeflow, GKE "
        "TPU, Open MPI) or a TPU VM's metadata server (tpu-vm); flags win. auto: whichever "
        "scheduler is present.",
        choice(CLUSTER_KINDS),
        "none",
        one_of(CLUSTER_KINDS),
        variable="XLARUN_CLUSTER",
        metavar=_choices(CLUSTER_KINDS),
    ),
    _xlarun(
        ("--hang-timeout", "--hang_timeout"),
        "Seconds without progress (a line of output the launcher relays, a torch_xla step) and without CPU "
        "use after which the workers count as hung: every rank's Python stack goes to its stacks.txt and the "
        "report, and the run stops with exit code 124 (or restarts). A silent worker that computes is not "
        "hung.",
        SECONDS,
        allowed=SECONDS.allowed,
        variable="XLARUN_HANG_TIMEOUT",
        metavar="SECONDS",
        shown_default="off",
    ),
    _xlarun(
        ("--preemption-signal", "--preemption_signal"),
        "Send this signal to every worker the moment a GCE metadata server says the VM stops (a "
        "preemption, host maintenance), e.g. SIGUSR1 for a handler that saves a checkpoint; the run goes "
        "on until the VM's own SIGTERM. Every notice is said and logged either way.",
        parse_signal,
        allowed="expected a signal name such as SIGUSR1",
        metavar="SIGNAL",
        shown_default="off",
    ),
    _xlarun(
        ("--metrics-textfile", "--metrics_textfile"),
        "Keep the launch's state (up, attempt, restarts, workers running, each worker's exit code and peak "
        "RSS, duration) in this file in Prometheus' text format, replaced whole at each change: for "
        "node_exporter's textfile collector.",
        parse_metrics_textfile,
        allowed="give a path to the .prom file to write",
        variable="XLARUN_METRICS_TEXTFILE",
        metavar="PATH",
    ),
    _xlarun(
        ("--detach",),
        "Check the launch, start it in the background, in a session of its own that a closed terminal "
        "does not end, print its id and return; xlarun --logs, --attach, --status, --wait and --stop "
        "find it by that id (docs/jobs.md).",
    ),
    _xlarun(
        ("--allow-busy-device", "--allow_busy_device"),
        "Start even though other processes hold the device files (a device shared on purpose).",
    ),
    _xlarun(
        ("--compile-cache", "--compile_cache"),
        "Keep what the workers' XLA compiler compiled in this directory, for the next restart or run: "
        "each worker gets its runtime's cache variables (torch_xla's XLA_PERSISTENT_CACHE_PATH, read-only "
        "but for one writer; TorchTPU's, Neuron's, TorchNeuron's), each in a folder of its own. Created "
        "if missing.",
        parse_directory,
        allowed="expected a local directory",
        variable="XLARUN_COMPILE_CACHE",
        metavar="DIR",
    ),
    _xlarun(
        ("--compile-cache-writers", "--compile_cache_writers"),
        "Who writes torch_xla's compile cache. job: global rank 0, every other rank reads (for a DIR the "
        "nodes may share); node: each node's local rank 0 (for a DIR on each node's own disk).",
        choice(CACHE_WRITERS),
        "job",
        one_of(CACHE_WRITERS),
        variable="XLARUN_COMPILE_CACHE_WRITERS",
        metavar=_choices(CACHE_WRITERS),
    ),
    # Every host from one command: the fan-out's own flags (plan.py says what each host is sent).
    _xlarun(
        ("--hosts",),
        "Run the job on these hosts, one node each, node 0 on the first: xlarun starts an agent on "
        "each over ssh, sends it the plan on its standard input, and stops every host when one "
        "fails or on Ctrl-C. Comma-separated, with Slurm's ranges (tpu-w[0-3]).",
        parse_hosts,
        allowed="expected host names separated by commas, each once",
        variable="XLARUN_HOSTS",
        metavar="HOST,...",
    ),
    _xlarun(
        ("--hostfile",),
        "--hosts from a file: the first word of each line (MPI's and DeepSpeed's files with "
        "slots= serve); # starts a comment.",
        parse_hostfile,
        allowed="expected a readable file naming each host once",
        variable="XLARUN_HOSTFILE",
        metavar="PATH",
    ),
    _xlarun(
        ("--ssh-config", "--ssh_config"),
        "The ssh configuration file for the hosts (ssh -F).",
        text,
        variable="XLARUN_SSH_CONFIG",
        metavar="PATH",
        shown_default="ssh's own",
    ),
    _xlarun(
        ("--rsh",),
        "Reach the hosts with this command instead of ssh; {host}, {index} and {command} are "
        "replaced in each word, e.g. 'kubectl exec -i {host} -- sh -c {command}'.",
        parse_rsh,
        allowed="expected a command with {command}, e.g. 'kubectl exec -i {host} -- sh -c {command}'",
        variable="XLARUN_RSH",
        metavar="TEMPLATE",
        shown_default="ssh -T -o BatchMode=yes ...",
    ),
    Option(
        ("--env",),
        "A variable every worker on every host gets, sent in the plan (never on a command line); repeatable.",
        parse_env,
        allowed="expected NAME=VALUE",
        owner=XLARUN,
        metavar="NAME=VALUE",
        repeatable=True,
    ),
    _xlarun(
        ("--env-file", "--env_file"),
        "Variables every worker on every host gets: NAME=VALUE lines, # comments.",
        parse_env_file,
        allowed="expected a readable file of NAME=VALUE lines",
        metavar="PATH",
    ),
    _xlarun(
        ("--remote-python", "--remote_python"),
        "The Python that runs xlarun on each host.",
        text,
        variable="XLARUN_REMOTE_PYTHON",
        metavar="PATH",
        shown_default="this launcher's Python",
    ),
    _xlarun(
        ("--remote-cwd", "--remote_cwd"),
        "The working directory on each host.",
        text,
        variable="XLARUN_REMOTE_CWD",
        metavar="DIR",
        shown_default="this working directory",
    ),
    _xlarun(
        ("--host-timeout", "--host_timeout"),
        "Seconds a host's agent waits for the launcher's heartbeat before "
        "it stops its workers (a frozen launcher, a dead connection).",
        SECONDS,
        "15",
        SECONDS.allowed,
        variable="XLARUN_HOST_TIMEOUT",
        metavar="SECONDS",
    ),
    _xlarun(
        ("--tpu-pod", "--tpu_pod"),
        "Run on every worker of this TPU VM pod slice, or of this TPU7x slice (a managed instance group), "
        "reached through gcloud's ssh.",
        parse_host,
        allowed="expected the TPU's name",
        variable="XLARUN_TPU_POD",
        metavar="NAME",
    ),
    _xlarun(
        ("--tpu-zone", "--tpu_zone"),
        "The pod slice's zone.",
        parse_host,
        allowed="expected a zone",
        variable="XLARUN_TPU_ZONE",
        metavar="ZONE",
        shown_default="gcloud's default zone",
    ),
)

OPTIONS_BY_DEST: Mapping[str, Option] = {option.dest: option for option in OPTIONS}


class Reading(Struct, frozen=True):
    """One option's value and where it came from."""

    value: Any
    text: str | None
    """The text the value was parsed from (None for a value-less option not given); for a value the
    scheduler gave, the value as the flag would spell it."""
    stood_in: str | None = None
    """What stood in for the flag: its variable (``PET_NNODES``) or the scheduler and the variable it
    read (``--cluster slurm: SLURM_NODEID``); None where the command line gave the value or the default holds."""
    defaulted: bool = False


class OptionValues(Mapping[str, "Any"]):  # Any as text: typing is not loaded
    """Every option's parsed value by dest (``None`` for a value-less option not given).

    A switch is ``True`` or ``False``. ``raw(dest)`` is the text the value came from and
    ``source(dest)`` names where: the flag, or the flag and what stood in for it (its variable,
    or the scheduler under ``--cluster``).
    """

    def __init__(self, readings: Mapping[str, Reading]):
        self._readings = dict(readings)

    def __getitem__(self, dest: str) -> Any:
        return self._readings[dest].value

    def __iter__(self) -> Iterator[str]:
        return iter(self._readings)

    def __len__(self) -> int:
        return len(self._readings)

    def raw(self, dest: str) -> str | None:
        return self._readings[dest].text

    def source(self, dest: str) -> str:
        """``--master-port``, or ``--master-port (from PET_MASTER_PORT)`` where a variable stood in."""
        return OPTIONS_BY_DEST[dest].display_name + _standing_in(self._readings[dest].stood_in)

    def stated(self, dest: str) -> str:
        """The value as its source said it: ``--nnodes=2``, ``--nnodes=2 (from --cluster slurm: SLURM_NNODES)``."""
        reading = self._readings[dest]
        return f"{OPTIONS_BY_DEST[dest].display_name}={reading.text}{_standing_in(reading.stood_in)}"

    def is_set(self, dest: str) -> bool:
        """Given on the command line, by its variable or by the scheduler, rather than left to its default."""
        return not self._readings[dest].defaulted

    def given(self, dest: str) -> str | None:
        """The text the command line gave, or None where something else set the value or none did."""
        reading = self._readings[dest]
        return None if reading.defaulted or reading.stood_in is not None else reading.text

    def given_or_default(self, dest: str) -> Any:
        """The value, or the row's default where the text given was empty (``--role ''``)."""
        return self[dest] or OPTIONS_BY_DEST[dest].default

    def refuse(self, dest: str, reason: str) -> UsageError:
        """A one-line error about the value of ``dest``: ``--flag='value' <reason>``."""
        return UsageError(f"{self.source(dest)}={self.raw(dest)!r} {reason}")

    def with_scheduler(self, kind: str, said: Mapping[str, tuple[Any, str, str]]) -> OptionValues:
        """These values with the scheduler's in place of those the command line did not give.

        ``said`` maps dests to what ``--cluster KIND`` found: the value as the option holds it, as the
        flag would spell it, and the variable it was read from. The precedence is torchrun's with
        the scheduler between the two: the flag, then the scheduler, then the ``PET_*`` variable,
        then the default. Nothing is parsed again.
        """
        readings = dict(self._readings)
        for dest, (value, text, variable) in said.items():
            if self.given(dest) is None:
                readings[dest] = Reading(value, text, f"{flag('cluster')} {kind}: {variable}")
        return OptionValues(readings)


def read_options(given: Mapping[str, str | None], environ: Mapping[str, str]) -> OptionValues:
    """Parse every option: the command line's text, else its variable, else its default.

    ``given`` maps dests to the text the command line gave (``"1"`` for a switch).
    Raises :class:`UsageError` for the first value its row refuses.
    """
    readings: dict[str, Reading] = {}
    for option in OPTIONS:
        raw, stood_in = given.get(option.dest), None
        variable = next((name for name in option.environment_variables if name in environ), None)
        if raw is None and variable is not None:
            raw, stood_in = environ[variable], variable
        defaulted = raw is None
        if defaulted:
            raw = option.default
        source = option.display_name + _standing_in(stood_in)
        if not option.takes_value:
            value = _switch(raw, source)
        elif raw is None:
            value = None
        else:
            value = _parse(option, raw, source)
        readings[option.dest] = Reading(value, raw, stood_in, defaulted)
    return OptionValues(readings)


def _standing_in(stood_in: str | None) -> str:
    return "" if stood_in is None else f" (from {stood_in})"


def _switch(raw: str | None, source: str) -> bool:
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


VERBS: Mapping[str, tuple[bool, tuple[str, ...]]] = {
    "--jobs": (False, ("--json", "--prune")),
    "--logs": (True, ("--follow",)),
    "--attach": (True, ()),
    "--stop": (True, ()),
    "--wait": (True, ()),
    "--status": (True, ("--json",)),
}
"""Each verb: whether it takes a run's id, and the switches it takes."""


class VerbRequest(Struct, frozen=True):
    """A verb asked for: the verb (``--logs``), the run's id where it takes one, the switches given."""

    verb: str
    job_id: str | None
    switches: frozenset[str]


def verb_request(args: Sequence[str]) -> VerbRequest | None:
    """The verb the command line asks for (its first word), or None for a launch."""
    if not args:
        return None
    verb, equals, value = args[0].partition("=")
    if verb not in VERBS:
        return None
    takes_id, switches = VERBS[verb]
    given = [value] if equals else []
    chosen: set[str] = set()
    for word in args[1:]:
        if word in switches:
            chosen.add(word)
        elif word.startswith("-") and len(word) > 1:
            allowed = f" (it takes {', '.join(switches)})" if switches else ""
            raise UsageError(f"{verb} does not take {word}{allowed}")
        else:
            given.append(word)
    if not takes_id:
        if given:
            raise UsageError(f"{verb} takes no argument: got {' '.join(given)}")
        return VerbRequest(verb, None, frozenset(chosen))
    if len(given) != 1:
        raise UsageError(
            f"{verb} takes one run id (xlarun --jobs lists them)" + (f": got {' '.join(given)}" if given else "")
        )
    return VerbRequest(verb, given[0], frozenset(chosen))


_PID = r"[0-9]{1,7}"
"""A process id: Linux's are below its PID_MAX_LIMIT, 4194304 (ASCII digits only: ``int()`` takes other
scripts' digits, and refuses more than 4,300 of them)."""


def stacks_request(args: Sequence[str]) -> tuple[bool, int | None]:
    """Whether the command line asks for stacks (``--stacks``, ``--stacks PID``, ``--stacks=PID``), and the PID."""
    if not args or args[0].partition("=")[0] != STACKS_NAME:
        return False, None
    name, equals, value = args[0].partition("=")
    rest = [value] if equals else list(args[1:])
    if len(rest) > 1:
        raise UsageError(f"{STACKS_NAME} takes at most one argument, the launcher's PID: got {' '.join(rest)}")
    if not rest:
        return True, None
    if not re.fullmatch(_PID, rest[0]):
        raise UsageError(f"{STACKS_NAME} {rest[0]}: expected the launcher's process id")
    return True, int(rest[0])
