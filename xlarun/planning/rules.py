"""The rules between flags: parsed options turned into one validated :class:`LaunchConfig`.

:mod:`xlarun.cli.options` parses each flag on its own; :func:`build_config` applies the rules
that tie several flags together (standalone with a node count, a node rank within the node
count, ...), each worded once, in terms of the flags. Planning reads the options through
:class:`OptionValues`, what it needs of them, which the command line's values
(:class:`xlarun.cli.options.OptionValues`) provide.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from xlarun.config import TORCH_FALSE_WORDS, TORCH_TRUE_WORDS, LaunchConfig, WorkerCommand, endpoint_parts
from xlarun.exceptions import UsageError
from xlarun.flags import flag
from xlarun.planning.packages import LONE_NODE_ON_A_FREE_PORT, Release
from xlarun.rdzv_conf import read_seconds, seconds_keys

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any, Protocol
else:
    Protocol = object  # the protocols below only type; at run time they are plain classes


class OptionValues(Protocol):
    """Every option's value by its ``dest``, and where each came from (the flag, its variable, the scheduler)."""

    def __getitem__(self, dest: str) -> Any: ...

    def raw(self, dest: str) -> str | None:
        """The text the value came from."""

    def source(self, dest: str) -> str:
        """``--master-port``, or ``--master-port (from PET_MASTER_PORT)`` where a variable stood in."""

    def stated(self, dest: str) -> str:
        """The value as its source said it: ``--nnodes=2 (from --cluster slurm: SLURM_NNODES)``."""

    def is_set(self, dest: str) -> bool:
        """Set by the command line, a variable or the scheduler, rather than left to its default."""

    def given(self, dest: str) -> str | None:
        """The text the command line gave, or None."""

    def given_or_default(self, dest: str) -> Any:
        """The value, or the default where the text given was empty."""

    def refuse(self, dest: str, reason: str) -> UsageError:
        """A one-line error about the value of ``dest``."""

    def with_scheduler(self, kind: str, said: Mapping[str, tuple[Any, str, str]]) -> OptionValues:
        """These values with the scheduler's in place of those the command line did not give."""


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _is_positive_integer(text: str) -> bool:
    return _is_integer(text) and int(text) > 0


def _is_torch_bool(text: str) -> bool:
    return text.lower() in TORCH_TRUE_WORDS + TORCH_FALSE_WORDS


_SECONDS = (_is_positive_integer, "a positive whole number of seconds")
RDZV_CONF_READ: Mapping[str, Mapping[str, tuple[Callable[[str], bool], str]]] = {
    "static": {"timeout": (_is_integer, "a whole number of seconds")},
    "c10d": {
        "join_timeout": _SECONDS,
        "last_call_timeout": _SECONDS,
        "close_timeout": _SECONDS,
        "heartbeat_timeout": _SECONDS,
        "read_timeout": _SECONDS,
        "keep_alive_interval": (_is_integer, "a whole number of seconds"),
        "keep_alive_max_attempt": (_is_integer, "a whole number"),
        "is_host": (_is_torch_bool, "true or false"),
    },
}
"""The rendezvous options torchrun 2.9 reads per backend, with what it accepts: static's handler
reads only ``timeout`` (``int()``), c10d's handler and store only the keys listed. A key the
chosen backend does not read is ignored, however it is spelt, as torchrun ignores it (xlarun's
own ``token`` and, under static with several nodes, ``join_timeout``, ``heartbeat_timeout``,
``close_timeout`` and ``read_timeout`` are checked where the rendezvous reads them)."""


# Fields whose value is the option's parsed value, unchanged.
_TAKEN_AS_PARSED = (
    "rdzv_conf",
    "max_restarts",
    "local_addr",
    "log_dir",
    "redirects",
    "tee",
    "local_ranks_filter",
    "shutdown_timeout",
    "signals_to_handle",
    "virtual_local_rank",
    "summary_file",
    "event_log",
    "dry_run",
    "allow_busy_device",
    "hang_timeout",
    "preemption_signal",
)


_NOT_IN_A_RUN_ID = "[/\x00-\x1f\x7f-\x9f]"
"""What a run id may not hold: it names the run's log directory inside ``--log-dir``
(``<run_id>_<random>``), so no ``/``, and it is printed and written to files, so no NUL or other
control character (a newline would forge lines)."""


def random_run_id() -> str:
    """A random UUID's text, torchrun's ``--standalone`` run id (``str(uuid.uuid4())``), made without loading ``uuid``,
    which loads ``platform``: together about a fifth of an interpreter start."""
    number = int.from_bytes(os.urandom(16), "big")
    number = number & ~(0xF000 << 64) | 0x4000 << 64  # version 4: random
    number = number & ~(0xC000 << 48) | 0x8000 << 48  # the variant RFC 4122 defines
    text = f"{number:032x}"
    return "-".join((text[:8], text[8:12], text[12:16], text[16:20], text[20:]))


def check_run_id(values: OptionValues, run_id: str) -> None:
    """Refuse a run id that would put the logs outside ``--log-dir`` or break the lines that name it."""
    if re.search(_NOT_IN_A_RUN_ID, run_id) or run_id in (".", ".."):
        raise values.refuse(
            "rdzv_id",
            f"cannot be a run id: it names the run's log directory inside "
            f"{flag('log_dir')}, so it may hold no '/' or control character "
            "and may not be '.' or '..'",
        )


def check_visible_devices(values: OptionValues, environ: Mapping[str, str], nproc_per_node: int) -> None:
    """Under ``--virtual-local-rank`` each worker takes its local rank's entry of the launcher's
    ``CUDA_VISIBLE_DEVICES``: refuse a list too short for the workers before any starts (torchrun
    raises at start)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if values["virtual_local_rank"] and visible is not None and len(visible.split(",")) < nproc_per_node:
        raise UsageError(
            f"{flag('virtual_local_rank')} gives each worker its local rank's entry of "
            f"CUDA_VISIBLE_DEVICES={visible!r}, which has too few for {nproc_per_node} workers: "
            "list one device per worker, or start fewer"
        )


def require_script(script: str | None) -> str:
    if not script:
        raise UsageError("the following arguments are required: training_script (the script or command to run)")
    return script


def check_rdzv_conf(values: OptionValues, backend: str, several_nodes: bool) -> None:
    """Refuse a value the chosen backend would refuse, as torchrun would, and a number of seconds out of
    bounds (:func:`xlarun.rdzv_conf.read_seconds`) where xlarun's rendezvous reads it: under c10d, and
    under static with several nodes. Other keys pass unread. A refusal names where the keys came from
    (``--rdzv-conf``, or ``--rdzv-conf (from PET_RDZV_CONF)``)."""
    conf, source = values["rdzv_conf"], values.source("rdzv_conf")
    for key, (accepts, expected) in RDZV_CONF_READ[backend].items():
        if key in conf and not accepts(conf[key]):
            raise UsageError(
                f"{source} {key}={conf[key]!r} is invalid: the {backend} rendezvous reads it as {expected}"
            )
    if backend == "c10d" or several_nodes:
        for key in seconds_keys(backend):
            if key in conf:
                read_seconds(key, conf[key], source)


def check_store_port(values: OptionValues, config: LaunchConfig) -> None:
    """Refuse a store port that no launcher but its server could find.

    torchrun's static rendezvous reads the store's port from the endpoint, and refuses one that
    names none ("port is missing in endpoint"). A store at port 0 takes a free port when served,
    which only the launcher serving it learns: torchrun's nodes each serve one of their own and
    wait out the join timeout. On one node serving it, the port is picked at start, as
    ``--standalone`` does.
    """
    if config.rdzv_backend == "static" and config.rdzv_endpoint and endpoint_parts(config.rdzv_endpoint)[1] is None:
        raise values.refuse(
            "rdzv_endpoint",
            f"names no port: the static rendezvous serves its store at the "
            f"endpoint's port; give HOST:PORT, or {flag('master_addr')} and "
            f"{flag('master_port')} instead",
        )
    if config.standalone or config.store_address()[1] != 0:
        return
    given = "rdzv_endpoint" if config.rdzv_endpoint else "master_port"
    if config.max_nodes > 1:
        raise values.refuse(
            given,
            f"has port 0: the node serving the store picks a free port at start, which "
            f"the other nodes of {values.stated('nnodes')} cannot know; name the port",
        )
    if config.rdzv_backend == "c10d" and config.rdzv_conf.get("is_host", "").lower() in TORCH_FALSE_WORDS:
        raise values.refuse(
            given,
            f"has port 0: the launcher serving the store picks a free port at start, and "
            f"{flag('rdzv_conf')} is_host={config.rdzv_conf['is_host']} says this one "
            "does not serve it; name the port, or let this launcher serve it",
        )


def lone_node_on_a_free_port(values: OptionValues, torchrun: Release) -> bool:
    """torchrun 2.12's rule: a lone static node given neither a master port nor an endpoint runs as
    ``--standalone`` does (:data:`~xlarun.planning.packages.LONE_NODE_ON_A_FREE_PORT`)."""
    return (
        torchrun >= LONE_NODE_ON_A_FREE_PORT
        and values["nnodes"][1] == 1
        and values["rdzv_backend"] == "static"
        and not values["rdzv_endpoint"]
        and not values.is_set("master_port")
    )


def build_config(
    values: OptionValues,
    script: str,
    script_args: tuple[str, ...],
    environ: Mapping[str, str],
    python: str,
    nproc_per_node: int,
    torchrun: Release,
) -> LaunchConfig:
    """Check the rules between flags and build the launch configuration (``script`` as
    :func:`require_script` let it through)."""
    module, no_python, run_path = values["module"], values["no_python"], values["run_path"]
    if module and no_python:
        raise UsageError(
            f"Don't use both the '{flag('no_python')}' flag and the '{flag('module')}' flag at the same time."
        )
    if run_path and (module or no_python):
        raise UsageError(
            f"{flag('run_path')} runs a Python file: it cannot be combined with {flag('module')} or {flag('no_python')}"
        )
    command = WorkerCommand(
        script=script,
        args=script_args,
        module=module,
        no_python=no_python,
        run_path=run_path,
        python=environ.get("PYTHON_EXEC") or python,
    )

    min_nodes, max_nodes = values["nnodes"]
    standalone = values["standalone"]
    rdzv_backend, rdzv_endpoint, rdzv_id = (
        values["rdzv_backend"],
        values["rdzv_endpoint"],
        values.given_or_default("rdzv_id"),
    )
    if standalone and max_nodes > 1:
        raise UsageError(f"{flag('standalone')} runs a single node, but {values.stated('nnodes')}: drop one of them")
    if standalone or lone_node_on_a_free_port(values, torchrun):
        standalone = True
        rdzv_backend, rdzv_endpoint, rdzv_id = "c10d", "localhost:0", random_run_id()
    check_run_id(values, rdzv_id)
    if rdzv_backend in ("etcd", "etcd-v2"):
        raise UsageError(f"{flag('rdzv_backend')}={rdzv_backend} is not supported by xlarun: use static or c10d")
    check_rdzv_conf(values, rdzv_backend, max_nodes > 1)
    check_visible_devices(values, environ, nproc_per_node)
    node_rank = values["node_rank"]
    if rdzv_backend == "static":
        if node_rank >= max_nodes:
            raise UsageError(
                f"{values.stated('node_rank')} is out of range: with {values.stated('nnodes')} "
                f"it must be 0..{max_nodes - 1}"
            )
        if min_nodes != max_nodes:
            raise UsageError(
                f"{values.stated('nnodes')}: a range needs {flag('rdzv_backend')}=c10d; "
                "static rendezvous takes a fixed node count"
            )

    config = LaunchConfig(
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
        standalone=standalone,
        torchrun=torchrun,
        role=values.given_or_default("role"),
        # torchrun's precedence: an empty template, given or not, leaves it to the variable.
        log_line_prefix_template=values["log_line_prefix_template"]
        or environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        duplicate_stdout_filters=values["duplicate_stdout_filters"] or (),
        duplicate_stderr_filters=values["duplicate_stderr_filters"] or (),
        **{name: values[name] for name in _TAKEN_AS_PARSED},
    )
    check_store_port(values, config)
    return config


HOST_SOURCES = ("hosts", "hostfile", "tpu_pod")
"""The flags that each name a multi-host job's hosts; one at most."""
HOSTS_ONLY = ("ssh_config", "rsh", "env", "env_file", "remote_python", "remote_cwd", "host_timeout")
"""Flags that mean something only where the launcher reaches other hosts."""
HOSTS_DECIDE = ("nnodes", "node_rank", "cluster", "standalone", "rdzv_backend", "rdzv_endpoint")
"""What a host list decides itself: one node a host, node 0 on the first, a static rendezvous."""


def check_hosts(values: OptionValues) -> bool:
    """Refuse flags that make no sense with (or without) a host list; True where the job spans hosts."""
    named = [dest for dest in HOST_SOURCES if values.is_set(dest)]
    if len(named) > 1:
        raise UsageError(f"{values.source(named[0])} and {values.source(named[1])} both name the hosts: give one")
    if not named:
        stray = next((dest for dest in (*HOSTS_ONLY, "tpu_zone") if values.is_set(dest)), None)
        if stray is not None:
            raise UsageError(
                f"{values.source(stray)} is for a job on several hosts: give {flag('hosts')}, "
                f"{flag('hostfile')} or {flag('tpu_pod')} too"
            )
        return False
    source = values.source(named[0])
    clash = next((dest for dest in HOSTS_DECIDE if values.is_set(dest)), None)
    if clash is not None:
        raise UsageError(
            f"{values.stated(clash)} cannot go with {source}: the host list makes one node a host, "
            "node 0 on the first, in a static rendezvous"
        )
    if values.is_set("tpu_zone") and not values.is_set("tpu_pod"):
        raise UsageError(f"{values.source('tpu_zone')} is the zone of {flag('tpu_pod')}: give that too")
    if values.is_set("tpu_pod") and values.is_set("rsh"):
        raise UsageError(
            f"{values.source('rsh')} cannot go with {source}: the pod's workers are reached through gcloud"
        )
    return True
