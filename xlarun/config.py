"""Launch configuration: torchrun's flags turned into one validated, immutable value.

``build_config`` takes the raw strings the command line gathered (or ``None`` for a flag
not given), falls back to ``PET_<NAME>`` variables and then to torchrun's defaults, and
checks every value. Each problem raises ``UsageError`` with one line that names the flag,
where the bad value came from, and what is allowed.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, TypeVar

from xlarun.exceptions import UsageError

T = TypeVar("T")

STDOUT = 1
STDERR = 2

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
START_METHODS = ("spawn", "fork", "forkserver")
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
NPROC_WORDS = ("auto", "cpu", "gpu")
DEFAULT_C10D_PORT = 29400

# The PET_ variable for a flag is named after argparse's dest: its first long spelling.
DEFAULTS: dict[str, Optional[str]] = {
    "nnodes": "1:1",
    "nproc_per_node": "1",
    "rdzv_backend": "static",
    "rdzv_endpoint": "",
    "rdzv_id": "none",
    "rdzv_conf": "",
    "standalone": None,
    "max_restarts": "0",
    "monitor_interval": "0.1",
    "start_method": "spawn",
    "event_log_handler": "null",
    "role": "default",
    "module": None,
    "no_python": None,
    "run_path": None,
    "log_dir": None,
    "redirects": "0",
    "tee": "0",
    "local_ranks_filter": "",
    "node_rank": "0",
    "master_addr": "127.0.0.1",
    "master_port": "29500",
    "local_addr": None,
    "logs_specs": None,
    "numa_binding": None,
}


@dataclass(frozen=True)
class StreamSpec:
    """Which of a worker's streams (``STDOUT | STDERR`` bits) a redirect or tee applies to."""

    default: int = 0
    per_rank: Mapping[int, int] = field(default_factory=dict)
    explicit_ranks: bool = False

    def for_rank(self, local_rank: int) -> int:
        if self.explicit_ranks:
            return self.per_rank.get(local_rank, 0)
        return self.default


@dataclass(frozen=True)
class WorkerCommand:
    """The program each worker runs; ``${local_rank}`` in its arguments is substituted per worker."""

    script: str
    args: tuple[str, ...]
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    python: str = ""

    def argv(self, local_rank: int) -> list[str]:
        args = [a.replace("${local_rank}", str(local_rank)) for a in self.args]
        if self.no_python:
            return [self.script, *args]
        if self.run_path:
            return [self.python, "-u", "-c", RUN_PATH_BOOTSTRAP, self.script, *args]
        return [self.python, "-u", *(["-m"] if self.module else []), self.script, *args]


# --run-path runs the script through runpy in a fresh interpreter, as torchrun's child does.
RUN_PATH_BOOTSTRAP = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one launch needs, validated. Field names follow torchrun's flags."""

    command: WorkerCommand
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    nproc_source: str = "1"
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    role: str = "default"
    local_addr: Optional[str] = None
    log_dir: Optional[str] = None
    redirects: StreamSpec = StreamSpec()
    tee: StreamSpec = StreamSpec()
    local_ranks_filter: Optional[frozenset[int]] = None
    log_line_prefix_template: Optional[str] = None
    numa_binding: Optional[str] = None
    kill_timeout: float = 30.0
    summary_file: Optional[str] = None
    dry_run: bool = False


class RawOptions:
    """The command line's values by dest name, with ``PET_*`` fallback and source tracking."""

    def __init__(self, given: Mapping[str, Optional[str]], environ: Mapping[str, str]):
        self._given = given
        self._environ = environ

    def get(self, dest: str) -> tuple[Optional[str], str]:
        """The value for ``dest`` and a phrase naming where it came from (for error lines)."""
        flag = "--" + dest.replace("_", "-")
        value = self._given.get(dest)
        if value is not None:
            return value, flag
        env_name = "PET_" + dest.upper()
        if env_name in self._environ:
            return self._environ[env_name], f"{flag} (from {env_name})"
        return DEFAULTS.get(dest), flag

    def value(self, dest: str) -> Optional[str]:
        return self.get(dest)[0]

    def flag(self, dest: str) -> bool:
        """A boolean flag: given on the command line, or ``PET_<DEST>`` a non-zero integer."""
        value, source = self.get(dest)
        if value is None:
            return False
        try:
            return int(value) != 0
        except ValueError:
            raise UsageError(f"{source} must be 0 or 1, got {value!r}") from None

    def parsed(self, dest: str, parse: Callable[[str], T], allowed: str) -> T:
        """Apply ``parse`` to the value; any ``ValueError`` becomes a one-line ``UsageError``."""
        value, source = self.get(dest)
        try:
            return parse(value if value is not None else "")
        except ValueError as exc:
            detail = f" ({exc})" if str(exc) and "invalid literal" not in str(exc) else ""
            raise UsageError(f"{source}={value!r} is invalid{detail}: {allowed}") from None


def parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) not in (1, 2):
        raise ValueError('not in "MIN:MAX" format')
    low, high = int(parts[0]), int(parts[-1])
    if not 0 < low <= high:
        raise ValueError("needs 0 < MIN <= MAX")
    return low, high


def parse_nproc(text: str) -> str:
    if text in NPROC_WORDS:
        return text
    if int(text) < 1:
        raise ValueError("needs at least 1")
    return text


def parse_non_negative_int(text: str) -> int:
    number = int(text)
    if number < 0:
        raise ValueError("negative")
    return number


def parse_port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError("out of range")
    return port


def parse_positive_float(text: str) -> float:
    number = float(text)
    if not number > 0:
        raise ValueError("must be positive")
    return number


_STREAM_VALUE = re.compile(r"^[0-3]$")
_STREAM_MAPPING = re.compile(r"^\d+:[0-3](,\d+:[0-3])*$")


def parse_stream_spec(text: str) -> StreamSpec:
    """torchrun's ``-r``/``-t`` format: ``0``–``3`` for every rank, or ``0:1,1:2`` per local rank."""
    if _STREAM_VALUE.match(text):
        return StreamSpec(default=int(text))
    if _STREAM_MAPPING.match(text):
        pairs = (item.split(":") for item in text.split(","))
        return StreamSpec(per_rank={int(rank): int(bits) for rank, bits in pairs}, explicit_ranks=True)
    raise ValueError("")


def parse_rank_set(text: str) -> Optional[frozenset[int]]:
    if not text:
        return None
    ranks = frozenset(int(item) for item in text.split(","))
    if any(rank < 0 for rank in ranks):
        raise ValueError("negative rank")
    return ranks


def parse_rdzv_conf(text: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        conf[key.strip()] = value.strip()
    return conf


def parse_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError("")
        return text

    return parse


def split_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` with IPv6 hosts in brackets, as torchrun's rendezvous parses it."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise ValueError("empty endpoint")
    if endpoint.startswith("["):
        host, bracket, rest = endpoint[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("an IPv6 host needs the form [addr]:port")
        port_text = rest[1:]
    else:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if not host:
        raise ValueError("no host")
    port = parse_port(port_text) if port_text else default_port
    return host, port


def resolve_nproc(word: str) -> int:
    """torchrun's rule for ``auto``/``cpu``/``gpu`` on a host without an XLA device.

    ``auto`` counts NVIDIA GPUs where the host shows them and CPUs otherwise; ``gpu``
    needs GPUs. Device-aware counting (TPU chips, Neuron cores) is the caller's job.
    """
    from xlarun.devices import nvidia_gpu_count

    if word.isdigit():
        return int(word)
    cpus = os.cpu_count() or 1
    gpus = nvidia_gpu_count()
    if word == "cpu":
        return cpus
    if word == "gpu":
        if not gpus:
            raise UsageError("--nproc-per-node=gpu but this host has no visible GPU: give a number, cpu or auto")
        return gpus
    return gpus or cpus


def build_config(given: Mapping[str, Optional[str]], script: Optional[str], script_args: tuple[str, ...],
                 environ: Mapping[str, str], python: str, *, kill_timeout: Optional[str] = None,
                 summary_file: Optional[str] = None, dry_run: bool = False) -> LaunchConfig:
    """Validate the command line against torchrun's rules and build the launch configuration."""
    raw = RawOptions(given, environ)
    if not script:
        raise UsageError("the following arguments are required: training_script (the script or command to run)")

    module, no_python, run_path = raw.flag("module"), raw.flag("no_python"), raw.flag("run_path")
    if module and no_python:
        raise UsageError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
    if run_path and (module or no_python):
        raise UsageError("--run-path runs a Python file: it cannot be combined with --module or --no-python")
    command = WorkerCommand(script=script, args=script_args, module=module, no_python=no_python,
                           run_path=run_path, python=environ.get("PYTHON_EXEC") or python)

    min_nodes, max_nodes = raw.parsed("nnodes", parse_nnodes, 'expected N or MIN:MAX with 0 < MIN <= MAX')
    nproc_word = raw.parsed("nproc_per_node", parse_nproc, "expected a positive integer, auto, cpu or gpu")
    standalone = raw.flag("standalone")
    rdzv_backend = raw.parsed("rdzv_backend", parse_choice(RDZV_BACKENDS), "expected one of " + ", ".join(RDZV_BACKENDS))
    rdzv_endpoint = raw.value("rdzv_endpoint") or ""
    rdzv_id = raw.value("rdzv_id") or "none"
    if standalone:
        if max_nodes > 1:
            raise UsageError(f"--standalone runs a single node, but --nnodes={raw.value('nnodes')}: drop one of them")
        rdzv_backend, rdzv_endpoint, rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if rdzv_backend in ("etcd", "etcd-v2"):
        raise UsageError(f"--rdzv-backend={rdzv_backend} is not supported by xlarun: use static or c10d")
    if rdzv_endpoint and not standalone:
        raw.parsed("rdzv_endpoint", lambda text: split_endpoint(text, DEFAULT_C10D_PORT),
                   "expected host[:port], IPv6 as [addr]:port")

    node_rank = raw.parsed("node_rank", parse_non_negative_int, "expected a non-negative integer")
    if rdzv_backend == "static" and not standalone and node_rank >= max_nodes:
        raise UsageError(f"--node-rank={node_rank} is out of range: with --nnodes={raw.value('nnodes')} "
                         f"it must be 0..{max_nodes - 1}")
    if rdzv_backend == "static" and min_nodes != max_nodes:
        raise UsageError(f"--nnodes={raw.value('nnodes')}: a range needs --rdzv-backend=c10d; "
                         "static rendezvous takes a fixed node count")

    logs_specs = raw.value("logs_specs")
    if logs_specs not in (None, "default"):
        raise UsageError(f"--logs-specs={logs_specs!r} is unknown: xlarun has only 'default'")
    numa_binding = raw.value("numa_binding")
    if numa_binding is not None:
        raw.parsed("numa_binding", parse_choice(NUMA_BINDINGS), "expected one of " + ", ".join(NUMA_BINDINGS))

    master_port = raw.parsed("master_port", parse_port, "expected a port number 0..65535")
    master_addr = raw.value("master_addr") or "127.0.0.1"

    return LaunchConfig(
        command=command,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=int(nproc_word) if nproc_word.isdigit() else 0,
        nproc_source=nproc_word,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        rdzv_conf=raw.parsed("rdzv_conf", parse_rdzv_conf, "expected key=value[,key=value...]"),
        standalone=standalone,
        max_restarts=raw.parsed("max_restarts", parse_non_negative_int, "expected a non-negative integer"),
        monitor_interval=raw.parsed("monitor_interval", parse_positive_float, "expected a positive number of seconds"),
        start_method=raw.parsed("start_method", parse_choice(START_METHODS), "expected one of " + ", ".join(START_METHODS)),
        role=raw.value("role") or "default",
        local_addr=raw.value("local_addr"),
        log_dir=raw.value("log_dir"),
        redirects=raw.parsed("redirects", parse_stream_spec, "expected 0-3, or LOCAL_RANK:0-3 pairs like 0:1,1:2"),
        tee=raw.parsed("tee", parse_stream_spec, "expected 0-3, or LOCAL_RANK:0-3 pairs like 0:1,1:2"),
        local_ranks_filter=raw.parsed("local_ranks_filter", parse_rank_set,
                                      "expected a comma-separated list of local ranks, e.g. 0,1,2"),
        log_line_prefix_template=environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        numa_binding=numa_binding,
        kill_timeout=_parse_kill_timeout(kill_timeout),
        summary_file=_check_summary_file(summary_file),
        dry_run=dry_run,
    )


def _parse_kill_timeout(text: Optional[str]) -> float:
    if text is None:
        return 30.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise UsageError(f"--kill-timeout={text!r} is invalid: expected a number of seconds >= 0")
    return seconds


def _check_summary_file(path: Optional[str]) -> Optional[str]:
    """Catch a path that can never take the summary before the run, not after it."""
    if path is None:
        return None
    if not path or os.path.isdir(path):
        raise UsageError(f"--summary-file={path!r} is not a file path: give the JSON file to write")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--summary-file={path!r} cannot be created: {parent} is not a directory")
    return path
