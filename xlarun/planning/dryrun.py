"""The dry run: this node's whole plan as one JSON document, and the stand-ins it plans with.

A dry run meets no other node and starts nothing, so what only a real rendezvous or start
decides (a c10d node rank, a port the kernel picks, ``--standalone``'s run id) gets a
stand-in value, and a second stand-in shows which values would differ: those read
:data:`DECIDED_AT_RENDEZVOUS`. Both the real run and the dry run classify the launch by
:attr:`LaunchConfig.topology <xlarun.config.LaunchConfig.topology>`.

Usage::

    document = plan_document(config, device, environ, notices=notices)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter, methodcaller
from typing import Any

from xlarun import structs
from xlarun.config import LaunchConfig, Topology
from xlarun.host.holders import busy_device_holders
from xlarun.host.ports import host_port
from xlarun.planning.device import DevicePlan, stand_in_node_address, stand_in_ports, with_slice_stand_ins
from xlarun.planning.environment import PASSED_THROUGH, worker_variables
from xlarun.ranks import NodeAssignment
from xlarun.runtimes.torchtpu import ADDRESSES
from xlarun.structs import Struct

DECIDED_AT_RENDEZVOUS = "<decided at rendezvous>"
"""What a dry run shows in place of a value only a real rendezvous decides."""

REDACTED = "<redacted>"
"""What the plan shows in place of the value of a variable whose name looks secret (:func:`looks_secret`)."""

SECRET_ENDINGS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "CREDENTIALS",
    "APIKEY",
    "ACCESSKEY",
    "PRIVATEKEY",
    "SECRETKEY",
)
"""A word of a variable's name (split at ``_``, ``-`` and ``.``, any case) that ends so looks secret, alone or
run together with what qualifies it: ``HF_TOKEN``, ``AWS_SESSIONTOKEN``, ``PGPASSWORD``, ``OPENAI_APIKEY``,
``awsSessionToken``, but not ``TOKENIZERS_PARALLELISM``."""

SECRET_WORDS = ("KEY", "PAT", "AUTH")
"""Words that look secret only standing alone (``AWS_SECRET_ACCESS_KEY``, ``GITHUB_PAT``, ``AUTH``): at the
end of a longer word they are mostly ordinary (``HOTKEY``, ``MONKEY_PATCH``, ``OAUTH_CLIENT_ID``).

A plan is printed, pasted and logged, so the value of a variable with such a word is never shown, even where
(as Kubeflow Trainer's token) it is the path of a file that holds the secret."""


def looks_secret(name: str) -> bool:
    """Whether a variable's value is kept out of every plan: a word of its name is one of
    :data:`SECRET_WORDS` or ends with one of :data:`SECRET_ENDINGS`."""
    words = re.split(r"[_.-]", name.upper())
    return any(word in SECRET_WORDS or word.endswith(SECRET_ENDINGS) for word in words)


def shown_value(name: str, value: str) -> str:
    """A variable's value as the plan prints it: :data:`REDACTED` where its name looks secret."""
    return REDACTED if looks_secret(name) else value


class NodePlan(Struct, frozen=True):
    """This node as a dry run knows it, without meeting any other node.

    ``node`` is the assignment the plan shows. Where the real run's rendezvous decides a
    value (a c10d node rank, a port the kernel picks), ``node`` holds a stand-in and
    ``alternative`` another stand-in: every value that differs between the two is decided
    at rendezvous, and the plan marks it so instead of showing a guess. ``endpoint`` is where
    the node meets the others, or a lone static node's ``--rdzv-endpoint``, its workers' store
    (``""`` where there is neither); ``assumed`` says what the plan
    takes for granted about the other nodes.
    """

    node: NodeAssignment
    alternative: NodeAssignment | None = None
    endpoint: str = ""
    assumed: tuple[str, ...] = ()


def plan_node(config: LaunchConfig, device: DevicePlan) -> NodePlan:
    """This node as the rendezvous of its topology would place it, for a dry run.

    A dry run meets no other node, so what only a real rendezvous decides gets a stand-in
    value, and :attr:`NodePlan.alternative` another one, which the plan marks wherever it
    shows: c10d's node ranks, world size and workers' store (node rank 0's agent serves it on
    a port the kernel picks), the free port and fresh run id ``--standalone`` takes at start, and
    what TorchTPU's address list takes from either (:func:`with_slice_stand_ins`).
    """
    plan = plan_node_placement(config, device)
    node, other = plan.node, plan.alternative or plan.node
    assumed = plan.assumed
    if device.plans_slice_addresses and config.topology in (Topology.STATIC, Topology.C10D):
        assumed += (
            f"{ADDRESSES} assumes every node's address is as long as {stand_in_node_address(config)}; "
            "the rendezvous learns the real ones",
        )
    return structs.replace(
        plan,
        node=with_slice_stand_ins(node, config, device),
        alternative=with_slice_stand_ins(other, config, device, variant=1),
        assumed=assumed,
    )


def plan_node_placement(config: LaunchConfig, device: DevicePlan) -> NodePlan:
    """:func:`plan_node`'s ranks, world size and store, before TorchTPU's stand-ins."""
    nproc = config.nproc_per_node
    port, other_port = stand_in_ports(device)
    topology = config.topology
    if topology is Topology.STANDALONE:
        # On the endpoint's host (localhost under --standalone), whose port is picked at start; so is
        # --standalone's run id.
        node = NodeAssignment.single_node(config.rdzv_id, nproc, config.store_address()[0], port)
        run_id = f"{node.run_id}-other" if config.standalone else node.run_id
        return NodePlan(node, structs.replace(node, master_port=other_port, run_id=run_id))
    if topology is Topology.LONE_NODE:
        host, store_port = config.store_address()
        return NodePlan(
            NodeAssignment.single_node(config.rdzv_id, nproc, host, store_port),
            endpoint=host_port(host, store_port) if config.rdzv_endpoint else "",
        )
    if topology is Topology.STATIC:
        # Node 0's agent serves the job's store, at the endpoint when one is given; the workers'
        # first attempt uses it as torchrun's agent store.
        host, store_port = config.store_address()
        node = NodeAssignment.single_node(
            config.rdzv_id, nproc, host, store_port, node_rank=config.node_rank, nnodes=config.max_nodes
        )
        return NodePlan(
            structs.replace(node, agent_store=True),
            endpoint=host_port(host, store_port),
            assumed=(
                f"ranks and world size assume every node runs as many workers as this one "
                f"({nproc}); the rendezvous adds up the nodes' real counts",
            ),
        )
    host, store_port = config.store_address()
    node = NodeAssignment(
        run_id=config.rdzv_id,
        node_rank=0,
        nnodes=config.min_nodes,
        local_world_size=nproc,
        rank_offset=0,
        world_size=config.min_nodes * nproc,
        master_addr=host,
        master_port=port,
        agent_store=True,
    )
    other = structs.replace(node, master_addr=f"{host}-other", master_port=other_port)
    if config.max_nodes > 1:
        other = structs.replace(
            other,
            node_rank=1,
            rank_offset=nproc,
            world_size=node.world_size + 1,
            nnodes=node.nnodes + (config.min_nodes != config.max_nodes),
        )
    return NodePlan(node, other, endpoint=host_port(host, store_port))


def plan_document(
    config: LaunchConfig,
    device: DevicePlan,
    environ: Mapping[str, str],
    notices: Sequence[str] = (),
    files: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The dry run's JSON for this node (:func:`dry_run_document`), with who holds the device files now,
    and the files the run would write (:func:`files_written`, and ``files``: more of them, by option)."""
    log_dir = config.log_dir or "<log_dir>"

    def error_file_for(run_id: str, local_rank: int) -> str:
        return os.path.join(log_dir, f"{run_id}_<random>", "attempt_0", str(local_rank), "error.json")

    document = dry_run_document(config, plan_node(config, device), device, environ, error_file_for, notices)
    document["device_holders"] = [holder.as_dict() for holder in busy_device_holders(device.device, environ)]
    document["files"] = {**files_written(config), **(files or {})}
    return document


def files_written(config: LaunchConfig) -> dict[str, str | None]:
    """The files the run writes besides its logs, by the option that names them (None: not given):
    the summary file at the end, the event log (``-``: stderr) as it goes."""
    return {"summary_file": config.summary_file, "event_log": config.event_log}


def dry_run_document(
    config: LaunchConfig,
    planned: NodePlan,
    device: DevicePlan,
    environ: Mapping[str, str],
    error_file_for: Callable[[str, int], str],
    notices: Sequence[str] = (),
) -> dict[str, Any]:
    """The dry run's JSON: the whole plan for this node, nothing started.

    Values decided at rendezvous read :data:`DECIDED_AT_RENDEZVOUS`, and
    ``decided_at_rendezvous`` names them (plan keys and worker variables). ``passed_through`` holds
    the launcher's variables of :data:`~xlarun.planning.environment.PASSED_THROUGH` that every worker
    inherits unchanged; every value whose name looks secret reads :data:`REDACTED`. ``notices`` are
    the lines the real run prints before starting; ``assumed`` says what the plan took for
    granted about a machine it cannot see. ``env_bytes`` is the size of the largest worker's
    added environment (``KEY=value`` strings with their terminators, as ``exec`` counts
    them): it stays the same at any world size but for the digits of ranks and sizes.
    """
    node, other = planned.node, planned.alternative or planned.node

    def variables(assignment: NodeAssignment, local_rank: int) -> dict[str, str]:
        return worker_variables(
            config, assignment, local_rank, device, environ, error_file_for(assignment.run_id, local_rank)
        )

    envs = [variables(node, local_rank) for local_rank in range(node.local_world_size)]
    undecided_variables = sorted(
        {
            name
            for local_rank, env in enumerate(envs)
            for name, value in variables(other, local_rank).items()
            if env[name] != value
        }
    )

    def shown(value_of: Callable[[NodeAssignment], Any]) -> Any:
        """The value the plan shows: the stand-in's, unless the rendezvous decides it."""
        value = value_of(node)
        return value if value_of(other) == value else DECIDED_AT_RENDEZVOUS

    placement = {
        key: shown(attrgetter(key)) for key in ("run_id", "node_rank", "world_size", "master_addr", "master_port")
    }
    workers = [
        {
            "local_rank": local_rank,
            "rank": shown(methodcaller("global_rank", local_rank)),
            "argv": config.command.argv(local_rank),
            "env": {
                name: DECIDED_AT_RENDEZVOUS if name in undecided_variables else shown_value(name, value)
                for name, value in env.items()
            },
        }
        for local_rank, env in enumerate(envs)
    ]
    return {
        "run_id": placement["run_id"],
        "device": device.device,
        "runtime": device.runtime,
        "node_rank": placement["node_rank"],
        "nnodes": [config.min_nodes, config.max_nodes],
        "nproc_per_node": node.local_world_size,
        "world_size": placement["world_size"],
        "master_addr": placement["master_addr"],
        "master_port": placement["master_port"],
        "rdzv_backend": config.rdzv_backend,
        "follows_torchrun": ".".join(map(str, config.torchrun)),
        "rdzv_endpoint": planned.endpoint,
        "decided_at_rendezvous": [key for key, value in placement.items() if value == DECIDED_AT_RENDEZVOUS]
        + undecided_variables,
        "notices": list(notices),
        "assumed": [*device.assumed, *planned.assumed],
        "env_bytes": max(environment_bytes(env) for env in envs),
        "passed_through": {name: shown_value(name, environ[name]) for name in PASSED_THROUGH if name in environ},
        "workers": workers,
    }


def environment_bytes(variables: Mapping[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) + 2 for key, value in variables.items())
