"""From the options read to the whole plan of one node's launch: :func:`plan_launch`, the one call the
command line and :func:`xlarun.launch` make, a real run and a dry run alike.

Its steps: what a scheduler says of the job (:mod:`~xlarun.planning.cluster`), the device and its
runtime (:mod:`~xlarun.planning.device`), the worker count, the rules between flags into one
:class:`~xlarun.config.LaunchConfig` (:mod:`~xlarun.planning.rules`), then the checks of the whole plan
against this node as the flags place it. Nothing here starts a process or probes a port; nothing of the
dry run's own (:mod:`~xlarun.planning.dryrun`) is on the way.

Usage::

    plan = plan_launch(read_options(given, environ), "train.py", ("--epochs", "3"), environ)
    plan.config, plan.device, plan.notices
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from xlarun.config import LaunchConfig, NprocRequest
from xlarun.exceptions import PlanError
from xlarun.planning.device import (
    DevicePlan,
    DeviceRequest,
    check_device_plan,
    check_slice_seating,
    count_workers,
    cpu_split_world,
    plan_device,
    probe_node,
)
from xlarun.planning.environment import check_virtual_local_rank, omp_threads_default
from xlarun.planning.packages import followed_torchrun
from xlarun.planning.rules import OptionValues, build_config, require_script
from xlarun.runtimes import CompileCache
from xlarun.structs import Struct


class LaunchPlan(Struct, frozen=True):
    """A launch checked and planned, before any port is probed or process started: what a real run runs
    and a dry run prints."""

    config: LaunchConfig
    device: DevicePlan
    notices: tuple[str, ...]
    """Lines to print before the workers start (the user's variables kept over planned ones, ...);
    a dry run prints them too."""
    split_world: str | None = None
    """Why XLA collectives cannot join these CPU processes (:func:`cpu_split_world`), or None."""
    event_log_handler: str = "null"
    """``--event-log-handler``: ``console`` retells the run as torchrun's events on stderr."""
    metrics_textfile: str | None = None
    """``--metrics-textfile``: where the run's state is kept for node_exporter, if anywhere."""


def plan_launch(
    values: OptionValues, script: str | None, script_args: tuple[str, ...], environ: Mapping[str, str]
) -> LaunchPlan:
    """Plan the device and the workers of one node from the options read
    (:func:`xlarun.cli.options.read_options`), and check the whole plan.

    Pure but for reading the host's device files and the installed packages' metadata:
    every refusal of bad input happens here, as a :class:`UsageError`.
    """
    script = require_script(script)
    user_environ = environ
    if values["cluster"] != "none":
        values, cluster_environ = apply_cluster(values, environ)
        # What the cluster says of the device (a TPU VM's slice) plans it where the environment is silent.
        environ = {**cluster_environ, **environ}
    dry_run = values["dry_run"]
    request = DeviceRequest(
        device=values["device"],
        runtime=values["runtime"],
        spmd=values["spmd"],
        virtual_devices=values["virtual_devices"],
        coordinator_port=values["coordinator_port"],
        compile_cache=(
            CompileCache(values["compile_cache"], values["compile_cache_writers"]) if values["compile_cache"] else None
        ),
    )
    device = plan_device(
        request,
        environ,
        nnodes=values["nnodes"][1],
        nproc=values["nproc_per_node"],
        dry_run=dry_run,
        user_environ=user_environ,
    )
    try:
        nproc = count_workers(values["nproc_per_node"], device, environ)
    except PlanError as error:
        raise values.refuse("nproc_per_node", str(error)) from None
    config = build_config(
        values, script, script_args, environ, sys.executable, nproc_per_node=nproc, torchrun=followed_torchrun()
    )
    check_slice_seating(device, config.topology, config.max_nodes)
    probe = probe_node(config, device)
    if config.virtual_local_rank:
        check_virtual_local_rank(device, probe)  # refused before the guard or a rendezvous starts
    notices = [*device.notices, *check_device_plan(device, probe)]
    split = cpu_split_world(device, nproc, config.max_nodes)
    # Only an XLA run on CPU is told before it starts: where the device was merely detected, the job may
    # not use XLA at all (every plain gloo job on a host that happens to have torch_xla would be warned).
    # A run that then fails on the split is told after the report, whichever way the device was chosen.
    if split is not None and (request.device == "cpu" or environ.get("PJRT_DEVICE") == "CPU"):
        notices.append(f"warning: {split}")
    if omp_threads_default(nproc, environ) is not None:
        notices.append(
            f"OMP_NUM_THREADS=1 for each of the {nproc} workers (torchrun's default with several "
            "workers per node); set OMP_NUM_THREADS yourself to choose another value"
        )
    return LaunchPlan(
        config,
        device,
        tuple(notices),
        split,
        event_log_handler=values["event_log_handler"],
        metrics_textfile=values["metrics_textfile"],
    )


def apply_cluster(values: OptionValues, environ: Mapping[str, str]) -> tuple[OptionValues, Mapping[str, str]]:
    """Put in what a scheduler (Slurm, Kubernetes, ...) says about the job, each value naming the
    variable it was read from; explicit flags win, and the scheduler wins over ``PET_*`` variables.

    Also returns what it says of the device, as variables to plan with (a TPU VM's slice shape and
    worker number, :attr:`~xlarun.planning.cluster.ClusterSettings.device_environ`).
    """
    from xlarun.planning.cluster import detect_cluster

    settings = detect_cluster(values["cluster"], environ)
    if settings is None:
        return values, {}
    settings.resolve_master_addr(values.given("master_addr"))  # refused where no one says where node 0 runs
    nnodes, nproc = settings.nnodes, settings.nproc_per_node
    # Each option a field stands in for: the field, its value as the flag spells it, and as the option holds it.
    fields = {
        "nnodes": ("nnodes", nnodes, (nnodes, nnodes)),
        "node_rank": ("node_rank", settings.node_rank, settings.node_rank),
        "master_addr": ("master_addr", settings.master_addr, settings.master_addr),
        "master_port": ("master_port", settings.master_port, settings.master_port),
        "rdzv_id": ("run_id", settings.run_id, settings.run_id),
        "nproc_per_node": ("nproc_per_node", nproc, None if nproc is None else NprocRequest(count=nproc)),
    }
    said = {
        dest: (value, str(spelt), settings.read_from[name])
        for dest, (name, spelt, value) in fields.items()
        if value is not None
    }
    return values.with_scheduler(settings.kind, said), settings.device_environ
