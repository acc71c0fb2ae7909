"""From the command line's values to a running (or planned) launch.

The glue between the layers: cluster detection fills in what the scheduler knows, the
options are read from their table, the device layer plans workers and XLA variables, the
configuration is checked, a rendezvous is chosen, and the agent runs, or a dry run
prints the plan.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

from xlarun.agent import Agent, say
from xlarun.config import LaunchConfig, build_config, require_script
from xlarun.deviceplan import DevicePlan, DeviceRequest, check_device_plan, count_workers, plan_device
from xlarun.exceptions import PlanError, UsageError
from xlarun.options import DEFAULT_MASTER_PORT, flag, read_options
from xlarun.plan import dry_run_document, omp_threads_default
from xlarun.ports import free_port, taken_here
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import FixedRendezvous, Rendezvous


@dataclass(frozen=True)
class PreparedLaunch:
    """A launch checked and planned, before any port is probed or process started."""

    config: LaunchConfig
    device: DevicePlan
    notices: tuple[str, ...]
    """Lines to print before the workers start (the user's variables kept over planned ones)."""


def prepare_launch(given: Mapping[str, Optional[str]], script: Optional[str], script_args: tuple[str, ...],
                   environ: Mapping[str, str]) -> PreparedLaunch:
    """Read the options, plan the device and the workers, and check the whole plan.

    Pure but for reading the host's device files and the installed packages' metadata:
    every refusal of bad input happens here, as a :class:`UsageError`.
    """
    require_script(script)
    values = read_options(given, environ)
    if values["cluster"] != "none":
        values = read_options(apply_cluster(values["cluster"], given, environ), environ)
    dry_run = values["dry_run"]
    request = DeviceRequest(device=values["device"], runtime=values["runtime"], spmd=values["spmd"],
                            virtual_devices=values["virtual_devices"], coordinator_port=values["coordinator_port"])
    device = plan_device(request, environ, nnodes=values["nnodes"][1], dry_run=dry_run)
    try:
        nproc = count_workers(values["nproc_per_node"], device, environ, dry_run=dry_run)
    except PlanError as error:
        raise values.refuse("nproc_per_node", str(error)) from None
    config = build_config(values, script, script_args, environ, sys.executable, nproc_per_node=nproc)
    notices = check_device_plan(device, probe_node(config))
    return PreparedLaunch(config, device, tuple(notices))


def launch_from_command_line(given: Mapping[str, Optional[str]], script: Optional[str],
                             script_args: tuple[str, ...], environ: Mapping[str, str]) -> int:
    """Run the launch the command line describes (or print its plan); returns the exit code."""
    # Workers get the environment as it was when the launcher started, whatever it sets for itself.
    environ = dict(environ)
    prepared = prepare_launch(given, script, script_args, environ)
    config, device, nproc = prepared.config, prepared.device, prepared.config.nproc_per_node
    rendezvous = choose_rendezvous(config, environ)
    if config.dry_run:
        return print_plan(config, device, rendezvous, environ)
    check_command(config)
    for notice in prepared.notices:
        say(notice)
    if device.explicit and device.device == "cpu" and nproc > 1:
        say(f"warning: {nproc} CPU processes: PJRT's CPU client has no cross-process collectives, so each "
            f"XLA process runs alone; use {flag('spmd')} {flag('virtual_devices')} N, or the gloo backend")
    if omp_threads_default(nproc, environ) is not None:
        say(f"OMP_NUM_THREADS=1 for each of the {nproc} workers (torchrun's default with several "
            "workers per node); set OMP_NUM_THREADS yourself to choose another value")
    return Agent(config, device, rendezvous, environ).run()


def apply_cluster(kind: str, given: Mapping[str, Optional[str]],
                  environ: Mapping[str, str]) -> dict[str, Optional[str]]:
    """Fill in what a scheduler (Slurm, Kubernetes, ...) says about the job; explicit flags win."""
    from xlarun.cluster import detect_cluster

    merged = dict(given)
    settings = detect_cluster(kind, environ)
    if settings is None:
        return merged
    derived = {
        "nnodes": str(settings.nnodes),
        "node_rank": str(settings.node_rank),
        "master_addr": settings.resolve_master_addr(given.get("master_addr")),
        "master_port": None if settings.master_port is None else str(settings.master_port),
        "rdzv_id": settings.run_id,
        "nproc_per_node": None if settings.nproc_per_node is None else str(settings.nproc_per_node),
    }
    for name, value in derived.items():
        if value is not None and merged.get(name) is None:
            merged[name] = value
    return merged


def probe_node(config: LaunchConfig) -> NodeAssignment:
    """This node as the flags place it, for checking the device plan before any rendezvous.

    A master port the launcher has yet to pick (0) is planned as the default one: the
    device rules only need some port to derive the coordinator's from.
    """
    return NodeAssignment.single_node(config.rdzv_id, config.nproc_per_node, config.master_addr,
                                      config.master_port or DEFAULT_MASTER_PORT,
                                      node_rank=min(config.node_rank, config.max_nodes - 1),
                                      nnodes=config.max_nodes)


def choose_rendezvous(config: LaunchConfig, environ: Mapping[str, str]) -> Rendezvous:
    if config.standalone:
        return FixedRendezvous(config.rdzv_id, "localhost", free_port())
    if config.dry_run:
        # A plan needs no other node: ranks as the flags give them.
        return FixedRendezvous(config.rdzv_id, config.master_addr, config.master_port,
                               node_rank=config.node_rank, nnodes=config.max_nodes)
    if config.max_nodes == 1 and config.rdzv_backend == "static":
        if taken_here(config.master_addr, config.master_port):
            raise UsageError(f"master port {config.master_port} on {config.master_addr} is already in use: pick "
                             f"another with {flag('master_port')} PORT, or use {flag('standalone')} for a free one")
        return FixedRendezvous(config.rdzv_id, config.master_addr, config.master_port)
    from xlarun.rendezvous.distributed import connect

    return connect(config, environ)


def check_command(config: LaunchConfig) -> None:
    command = config.command
    if command.no_python:
        if shutil.which(command.script) is None:
            raise UsageError(f"command not found: {command.script} ({flag('no_python')} runs it directly; "
                             "give a path or a program on PATH)")
    elif not command.module and not os.path.exists(command.script):
        raise UsageError(f"training script not found: {command.script}")


def print_plan(config: LaunchConfig, device: DevicePlan, rendezvous: Rendezvous, environ: Mapping[str, str]) -> int:
    node = rendezvous.assign(0, config.nproc_per_node)
    run_dir = os.path.join(config.log_dir or "<log_dir>", f"{node.run_id}_<random>")
    document = dry_run_document(config, node, device, environ,
                                lambda local_rank: os.path.join(run_dir, "attempt_0", str(local_rank), "error.json"))
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
