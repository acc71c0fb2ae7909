"""Launch configuration: the parsed options turned into one validated, immutable value.

:mod:`xlarun.options` parses each flag on its own; :func:`build_config` applies the rules
that tie several flags together (standalone with a node count, a node rank within the node
count, ...), each worded once, in terms of the flags.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Mapping, Optional

from xlarun.exceptions import UsageError
from xlarun.options import DEFAULT_MASTER_PORT, OptionValues, StreamSpec, flag

DEFAULT_C10D_PORT = 29400

# run_path runs the script through runpy in a fresh interpreter, as torchrun's child does.
RUN_PATH_BOOTSTRAP = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


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


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one launch needs, validated. Field names follow torchrun's flags.

    ``nproc_per_node`` is the resolved worker count of this node (``auto`` and the other
    words already counted against the planned device).
    """

    command: WorkerCommand
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    standalone: bool = False
    max_restarts: int = 0
    role: str = "default"
    local_addr: Optional[str] = None
    log_dir: Optional[str] = None
    redirects: StreamSpec = StreamSpec()
    tee: StreamSpec = StreamSpec()
    local_ranks_filter: Optional[frozenset[int]] = None
    log_line_prefix_template: Optional[str] = None
    kill_timeout: float = 30.0
    summary_file: Optional[str] = None
    dry_run: bool = False


def require_script(script: Optional[str]) -> str:
    if not script:
        raise UsageError("the following arguments are required: training_script (the script or command to run)")
    return script


def build_config(values: OptionValues, script: Optional[str], script_args: tuple[str, ...],
                 environ: Mapping[str, str], python: str, nproc_per_node: int) -> LaunchConfig:
    """Check the rules between flags and build the launch configuration."""
    script = require_script(script)
    module, no_python, run_path = values["module"], values["no_python"], values["run_path"]
    if module and no_python:
        raise UsageError(f"Don't use both the '{flag('no_python')}' flag and the '{flag('module')}' flag "
                         "at the same time.")
    if run_path and (module or no_python):
        raise UsageError(f"{flag('run_path')} runs a Python file: it cannot be combined with {flag('module')} "
                         f"or {flag('no_python')}")
    command = WorkerCommand(script=script, args=script_args, module=module, no_python=no_python,
                            run_path=run_path, python=environ.get("PYTHON_EXEC") or python)

    min_nodes, max_nodes = values["nnodes"]
    standalone = values["standalone"]
    rdzv_backend, rdzv_endpoint, rdzv_id = (values["rdzv_backend"], values["rdzv_endpoint"],
                                            values.given_or_default("rdzv_id"))
    if standalone:
        if max_nodes > 1:
            raise UsageError(f"{flag('standalone')} runs a single node, but {flag('nnodes')}={values.raw('nnodes')}: "
                             "drop one of them")
        rdzv_backend, rdzv_endpoint, rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if rdzv_backend in ("etcd", "etcd-v2"):
        raise UsageError(f"{flag('rdzv_backend')}={rdzv_backend} is not supported by xlarun: use static or c10d")
    node_rank = values["node_rank"]
    if rdzv_backend == "static":
        if node_rank >= max_nodes:
            raise UsageError(f"{flag('node_rank')}={node_rank} is out of range: with "
                             f"{flag('nnodes')}={values.raw('nnodes')} "
                             f"it must be 0..{max_nodes - 1}")
        if min_nodes != max_nodes:
            raise UsageError(f"{flag('nnodes')}={values.raw('nnodes')}: a range needs {flag('rdzv_backend')}=c10d; "
                             "static rendezvous takes a fixed node count")

    return LaunchConfig(
        command=command,
        nproc_per_node=nproc_per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=node_rank,
        master_addr=values.given_or_default("master_addr"),
        master_port=values["master_port"],
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        rdzv_conf=values["rdzv_conf"],
        standalone=standalone,
        max_restarts=values["max_restarts"],
        role=values.given_or_default("role"),
        local_addr=values["local_addr"],
        log_dir=values["log_dir"],
        redirects=values["redirects"],
        tee=values["tee"],
        local_ranks_filter=values["local_ranks_filter"],
        log_line_prefix_template=environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        kill_timeout=values["kill_timeout"],
        summary_file=values["summary_file"],
        dry_run=values["dry_run"],
    )
