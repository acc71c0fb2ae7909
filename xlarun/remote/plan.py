"""What each host of a multi-host job is sent: one :class:`HostPlan` per host, pure data.

The launcher turns ``--hosts h1,h2`` and the user's other flags into one plan per host
(:func:`plan_hosts`); the transport carries it as one JSON line on the remote agent's standard
input (:mod:`xlarun.remote.protocol`), never on a command line: ``/proc/<pid>/cmdline`` is
world-readable on every host, and Linux limits one argument to 128 KiB.

Each host runs xlarun as a node of a static rendezvous: node 0 on the first host serves the store,
and every node gets ``--nnodes N --node-rank i --master-addr <node 0> --master-port P
--rdzv-id RUN``. The launcher is not a member and needs no inbound port.

Workers get the environment they would get from xlarun started on their host, plus the launcher's
variables whose names :func:`allowed_environment` lets through, plus ``--env`` and
``--env-file``; nothing else of the launcher's environment travels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from xlarun.flags import flag
from xlarun.host.devices import HOST_ROOT_VARIABLE
from xlarun.planning.dryrun import shown_value
from xlarun.structs import Struct, asdict, field

ALLOWED_PREFIXES = ("XLARUN_", "PJRT_", "XLA_", "TPU_", "NEURON_", "TORCH_", "PYTHON", "HF_", "WANDB_")
"""The launcher's variables that travel to every host, by name prefix: xlarun's own, the device
runtimes', torch's, Python's, Hugging Face's and Weights & Biases'."""
ALLOWED_NAMES = frozenset({"TRACEPARENT", "TRACESTATE"})
"""The launcher's variables that travel by exact name: the trace context (OpenTelemetry's
environment carriers), so every host's events join the launcher's trace."""

DEFAULT_LINE_PREFIX = "{host}:${{rank}}: "
"""A worker line's prefix where the user gave no ``--log-line-prefix-template``: the host as the user
named it (several hosts may report one host name) and the global rank."""


STAYING_NAMES = frozenset({HOST_ROOT_VARIABLE})
"""xlarun's variables that describe the launcher's own machine (the tree its devices are read from):
each host has its own."""


def allowed_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's variables that travel to the hosts: those of :data:`ALLOWED_PREFIXES` and
    :data:`ALLOWED_NAMES`, less :data:`STAYING_NAMES`. No blanket copy: the launcher's ``PATH``, ``HOME``
    or ``CUDA_VISIBLE_DEVICES`` describe the launcher's machine, not the hosts'."""
    return {
        name: value
        for name, value in environ.items()
        if (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)) and name not in STAYING_NAMES
    }


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a dry run prints it: each value whose name looks secret replaced (the dry run's one rule,
    :func:`xlarun.planning.dryrun.looks_secret`)."""
    return {name: shown_value(name, value) for name, value in env.items()}


def parse_env_assignment(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the value may be empty or hold ``=``); raises ValueError naming what is wrong."""
    name, equals, value = text.partition("=")
    if not equals or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise ValueError(f"{text[:40]!r} is not NAME=VALUE")
    return name, value


def read_env_file(text: str) -> dict[str, str]:
    """An ``--env-file``: one ``NAME=VALUE`` a line, as Docker's ``--env-file`` reads it: blank lines and
    ``#`` comments skipped, no quotes removed, no variables expanded. Raises ValueError with the line number."""
    variables: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            name, value = parse_env_assignment(line)
        except ValueError as error:
            raise ValueError(f"line {number}: {error}") from None
        variables[name] = value
    return variables


class HostPlan(Struct, frozen=True):
    """Everything one host's agent needs, sent as one JSON line on its standard input.

    ``argv`` is xlarun's own argv on that host (options, ``--``, the script and its arguments)
    without ``--master-addr`` and ``--master-port``: node 0's address and store port are settled once every
    host is ready (its address as the others reach it, and a port free on it, are known only there) and
    sent with ``go``; :meth:`node_argv` adds them.
    """

    host: str
    """The host as the user named it (an ssh alias, an address, a pod's worker)."""
    index: int
    """Its position in the host list, 0-based: the ``{index}`` of an ``--rsh`` template."""
    node_rank: int | None
    """Its node rank; None where the host reads it itself (``--cluster tpu-vm``)."""
    nnodes: int
    run_id: str
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    host_timeout: float = 15.0
    version: str = ""
    """The launcher's xlarun version: a host with another one is refused before anything starts."""
    master_addr: str = ""
    """Node 0's address as planned: the first host as named, or the user's ``--master-addr``; empty where the
    hosts read it themselves."""
    master_port: int | None = None
    """The user's ``--master-port``; None: node 0's agent picks a free port on its host (two jobs on the same
    hosts then never meet at one port)."""
    program: str = "script"
    """What the command after ``--`` in ``argv`` is: a Python ``script``, a ``module`` (``--module``) or a
    ``program`` on PATH (``--no-python``); the host looks for it before it reports ready."""
    device: str = "auto"
    """``--device`` as given: each host resolves ``auto`` itself and looks for holders of that device's files."""
    allow_busy_device: bool = False
    """``--allow-busy-device``: the host does not refuse a device that other processes hold."""

    def node_argv(self, master_addr: str, master_port: int | None) -> list[str]:
        """The argv of the node's xlarun with node 0's store at ``master_addr:master_port`` (neither where the
        host reads them itself)."""
        if not master_addr:
            return list(self.argv)
        return [f"{flag('master_addr')}={master_addr}", f"{flag('master_port')}={master_port}", *self.argv]

    def to_json(self) -> str:
        """One line of JSON (no newline inside: every value's newlines are escaped)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str | bytes) -> HostPlan:
        data: dict[str, Any] = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("the plan is not a JSON object")
        data["argv"] = tuple(data["argv"])
        return cls(**data)

    def shown(self) -> dict[str, Any]:
        """The plan as the dry run prints it: values of variables whose names look secret redacted."""
        return {**asdict(self), "env": redacted(self.env)}


def plan_hosts(
    hosts: Sequence[str],
    node_options: Sequence[str],
    command: Sequence[str],
    *,
    run_id: str,
    master_port: int | None,
    cwd: str,
    env: Mapping[str, str],
    host_timeout: float,
    version: str,
    master_addr: str | None = None,
    prefix_given: bool = False,
    streams_given: bool = False,
    cluster_ranks: bool = False,
    program: str = "script",
    device: str = "auto",
    allow_busy_device: bool = False,
) -> list[HostPlan]:
    """One plan per host, node 0 on the first.

    ``node_options`` are the user's options that every node takes unchanged (the fan-out's own
    flags left out); ``command`` is ``[script, *args]``. Where the user chose neither ``--tee`` nor
    ``--redirects`` (``streams_given``), every worker line is shown whole with a prefix
    (:data:`DEFAULT_LINE_PREFIX` unless ``prefix_given``). ``cluster_ranks``: each host reads its
    node rank and node 0 from its TPU VM's metadata (``--cluster tpu-vm``) rather than being told.
    """
    plans = []
    for index, host in enumerate(hosts):
        shown = [] if streams_given else [f"{flag('tee')}=3"]
        if not prefix_given:
            # The template's "$" is its macros' (string.Template): one in the host's name stays a "$".
            prefix = DEFAULT_LINE_PREFIX.format(host=host.replace("$", "$$"))
            shown.append(f"{flag('log_line_prefix_template')}={prefix}")
        if cluster_ranks:
            # The metadata names node 0 but no port: the user's, where given, goes to every host.
            port = [] if master_port is None else [f"{flag('master_port')}={master_port}"]
            node = [f"{flag('cluster')}=tpu-vm", *port, f"{flag('rdzv_id')}={run_id}"]
        else:
            node = [f"{flag('nnodes')}={len(hosts)}", f"{flag('node_rank')}={index}", f"{flag('rdzv_id')}={run_id}"]
        argv = (*node_options, *shown, *node, "--", *command)
        plans.append(
            HostPlan(
                host=host,
                index=index,
                node_rank=None if cluster_ranks else index,
                nnodes=len(hosts),
                run_id=run_id,
                argv=argv,
                cwd=cwd,
                env=dict(env),
                host_timeout=host_timeout,
                version=version,
                master_port=master_port,
                program=program,
                device=device,
                allow_busy_device=allow_busy_device,
                master_addr="" if cluster_ranks else master_addr or hosts[0],
            )
        )
    return plans
