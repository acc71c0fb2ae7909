"""From the command line's values to a running (or planned) launch.

This is the one place that combines the layers: cluster detection fills in what the
scheduler knows, the configuration is validated, the device layer plans the XLA
variables, a rendezvous is chosen, and the agent runs, or ``--dry-run`` prints the plan.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Mapping, Optional

from xlarun.agent import Agent, say
from xlarun.config import LaunchConfig, build_config, resolve_nproc
from xlarun.exceptions import UsageError
from xlarun.plan import DevicePlan, dry_run_document
from xlarun.ports import ensure_master_port_free, free_port
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import FixedRendezvous, Rendezvous
from xlarun.workerenv import omp_threads_default

OWN_OPTIONS = ("dry_run", "kill_timeout", "summary_file", "device", "runtime", "spmd", "virtual_devices",
               "coordinator_port", "cluster")


def launch_from_command_line(given: Mapping[str, Optional[str]], script: Optional[str],
                             script_args: tuple[str, ...], environ: Mapping[str, str]) -> int:
    # Workers get the environment as it was when the launcher started, whatever it sets for itself.
    environ = dict(environ)
    own = {name: given.get(name) for name in OWN_OPTIONS}
    torchrun_values = {name: value for name, value in given.items() if name not in OWN_OPTIONS}
    torchrun_values = apply_cluster(own.get("cluster") or environ.get("XLARUN_CLUSTER") or "none",
                                    torchrun_values, environ)
    config = build_config(torchrun_values, script, script_args, environ, sys.executable,
                          kill_timeout=own["kill_timeout"], summary_file=own["summary_file"],
                          dry_run=own["dry_run"] is not None)
    device = plan_device(own, config, environ)
    nproc = local_worker_count(config, device, environ)
    check_device_plan(config, device, nproc)
    rendezvous = choose_rendezvous(config, environ)
    if config.dry_run:
        return print_plan(config, device, rendezvous, nproc, environ)
    check_command(config)
    if device.explicit and device.device == "cpu" and nproc > 1:
        say(f"warning: {nproc} CPU processes: PJRT's CPU client has no cross-process collectives, so each "
            "XLA process runs alone; use --spmd --virtual-devices N, or the gloo backend")
    if omp_threads_default(nproc, environ) is not None:
        say(f"OMP_NUM_THREADS=1 for each of the {nproc} workers (torchrun's default with several "
            "workers per node); set OMP_NUM_THREADS yourself to choose another value")
    return Agent(config, device, rendezvous, environ, nproc).run()


def apply_cluster(kind: str, values: dict[str, Optional[str]], environ: Mapping[str, str]) -> dict[str, Optional[str]]:
    """Fill in what a scheduler (Slurm, Kubernetes, ...) says about the job; explicit flags win."""
    if kind == "none":
        return values
    from xlarun.cluster import CLUSTER_KINDS, detect_cluster

    if kind not in CLUSTER_KINDS:
        raise UsageError(f"--cluster={kind!r} is unknown: expected one of {', '.join(CLUSTER_KINDS)}")
    settings = detect_cluster(kind, environ)
    if settings is None:
        return values
    derived = {
        "nnodes": str(settings.nnodes),
        "node_rank": str(settings.node_rank),
        "master_addr": settings.resolve_master_addr(values.get("master_addr")),
        "master_port": None if settings.master_port is None else str(settings.master_port),
        "rdzv_id": settings.run_id,
        "nproc_per_node": None if settings.nproc_per_node is None else str(settings.nproc_per_node),
    }
    merged = dict(values)
    for name, value in derived.items():
        if value is not None and merged.get(name) is None:
            merged[name] = value
    return merged


def plan_device(own: Mapping[str, Optional[str]], config: LaunchConfig, environ: Mapping[str, str]) -> DevicePlan:
    """Resolve device and runtime and build the per-worker XLA variables (see ``xlarun.runtimes``)."""
    from xlarun.devices import DEVICES, host_root, local_unit_count, resolve_device, tpu_generation
    from xlarun.packages import installed_version, preflight, resolve_runtime
    from xlarun.runtimes import XlaOptions, apply_user_precedence, tpu, xla_env

    requested = own.get("device") or environ.get("XLARUN_DEVICE") or "auto"
    if requested not in DEVICES:
        raise UsageError(f"--device={requested!r} is unknown: expected one of {', '.join(DEVICES)}")
    root = host_root(environ)
    device = resolve_device(requested, environ, root)
    runtime_requested = own.get("runtime") or "auto"
    if runtime_requested not in ("auto", "pjrt", "xrt"):
        raise UsageError(f"--runtime={runtime_requested!r} is unknown: expected auto, pjrt or xrt")
    torch_xla_version = installed_version("torch_xla")
    runtime = resolve_runtime(runtime_requested, torch_xla_version)
    if (device == "cuda" and requested == "auto" and "PJRT_DEVICE" not in environ
            and not config.dry_run and not xla_has_cuda(torch_xla_version)):
        # A GPU host running a plain torchrun job (NCCL, gloo) must not be refused for lack of XLA:GPU.
        device = "cpu"
    spmd = own.get("spmd") is not None
    virtual_devices = _positive_int(own.get("virtual_devices"), "--virtual-devices")
    if not config.dry_run:
        preflight(device, runtime, spmd=spmd, virtual_devices=virtual_devices)
    topology = None
    if device == "tpu":
        topology = tpu.topology(environ, local_unit_count("tpu", root), config.max_nodes, tpu_generation(root))
    options = XlaOptions(device=device, runtime=runtime, spmd=spmd, virtual_devices=virtual_devices,
                         coordinator_port=_port(own.get("coordinator_port")), tpu_topology=topology)
    announced: set[str] = set()

    def variables(node, local_rank):  # type: ignore[no-untyped-def]
        planned, notices = apply_user_precedence(xla_env(options, node, local_rank), environ)
        for notice in notices:
            if notice not in announced and not config.dry_run:
                say(notice)
            announced.add(notice)
        return planned

    explicit = requested != "auto" or "PJRT_DEVICE" in environ
    return DevicePlan(device=device, runtime=runtime, variables=variables, spmd=spmd, explicit=explicit)


def local_worker_count(config: LaunchConfig, device: DevicePlan, environ: Mapping[str, str]) -> int:
    """``--nproc-per-node``: a number as given; ``auto`` counts the device's local units.

    Under ``--spmd`` one process sees every local device. ``cpu``/``gpu``, and ``auto``
    without an accelerator, follow torchrun's rule.
    """
    from xlarun.devices import host_root, local_unit_count

    if device.spmd:
        if config.nproc_source not in ("1", "auto"):
            raise UsageError(f"--spmd runs one process per node that sees every local device: "
                             f"drop --nproc-per-node={config.nproc_source} or set it to 1")
        return 1
    if config.nproc_per_node:
        count = config.nproc_per_node
    elif config.nproc_source == "auto" and device.device not in ("cpu", "xpu"):
        count = local_unit_count(device.device, host_root(environ)) or 0
        if not count:
            if not config.dry_run:
                raise UsageError(f"--nproc-per-node=auto found no {device.device} devices on this host: "
                                 "give a number, or pick the device with --device")
            count = resolve_nproc("auto")
    else:
        count = resolve_nproc(config.nproc_source)
    return count


def check_device_plan(config: LaunchConfig, device: DevicePlan, nproc: int) -> None:
    """Translate one worker now, so a plan the device cannot run fails before anything happens.

    The device's rules (chips per host, SPMD, coordinator port) depend only on this node's
    worker count and the flags, not on what a rendezvous later decides.
    """
    if device.variables is None:
        return
    nnodes = config.max_nodes
    probe = NodeAssignment.single_node(config.rdzv_id, nproc, config.master_addr, config.master_port or 29500,
                                       node_rank=min(config.node_rank, nnodes - 1), nnodes=nnodes)
    device.variables(probe, nproc - 1)


def choose_rendezvous(config: LaunchConfig, environ: Mapping[str, str]) -> Rendezvous:
    if config.standalone:
        return FixedRendezvous(config.rdzv_id, "localhost", free_port())
    if config.dry_run:
        # A plan needs no other node: ranks as the flags give them.
        return FixedRendezvous(config.rdzv_id, config.master_addr, config.master_port,
                               node_rank=config.node_rank, nnodes=config.max_nodes)
    if config.max_nodes == 1 and config.rdzv_backend == "static":
        ensure_master_port_free(config.master_addr, config.master_port)
        return FixedRendezvous(config.rdzv_id, config.master_addr, config.master_port)
    from xlarun.rendezvous.distributed import connect

    return connect(config, environ)


def check_command(config: LaunchConfig) -> None:
    command = config.command
    if command.no_python:
        if shutil.which(command.script) is None:
            raise UsageError(f"command not found: {command.script} (--no-python runs it directly; "
                             "give a path or a program on PATH)")
    elif not command.module and not os.path.exists(command.script):
        raise UsageError(f"training script not found: {command.script}")


def print_plan(config: LaunchConfig, device: DevicePlan, rendezvous: Rendezvous, nproc: int,
               environ: Mapping[str, str]) -> int:
    node = rendezvous.assign(0, nproc)
    run_dir = os.path.join(config.log_dir or "<log_dir>", f"{node.run_id}_<random>")
    document = dry_run_document(config, node, device, environ,
                                lambda local_rank: os.path.join(run_dir, "attempt_0", str(local_rank), "error.json"))
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def xla_has_cuda(torch_xla_version: Optional[str]) -> bool:
    """XLA:GPU exists in torch_xla 2.2 to 2.8 only."""
    from xlarun.packages import major_minor

    return torch_xla_version is not None and (2, 2) <= major_minor(torch_xla_version) < (2, 9)


def _positive_int(text: Optional[str], flag: str) -> Optional[int]:
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{flag}={text!r} is invalid: expected a positive integer")
    return int(text)


def _port(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise UsageError(f"--coordinator-port={text!r} is invalid: expected a port number 1..65535")
    return int(text)

