"""Device planning: which device and runtime the workers get, how many, and their XLA variables.

Usage::

    device = plan_device(DeviceRequest("auto", "auto"), environ, nnodes=1, dry_run=False)
    nproc = count_workers(NprocRequest(word="auto"), device, environ, dry_run=False)
    notices = check_device_plan(device, probe_node)   # lines for the caller to print
    device.variables(node, local_rank)                # what one worker gets

Everything is decided from the host's files (:mod:`xlarun.devices`), the installed
packages' metadata (:mod:`xlarun.packages`) and the environment, without importing torch.
The per-runtime translations live in :mod:`xlarun.runtimes`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from xlarun.devices import host_root, local_unit_count, nvidia_gpu_count, resolve_device, tpu_generation
from xlarun.exceptions import PlanError
from xlarun.options import NprocRequest
from xlarun.packages import FIRST_WITH_CUDA_NAME, FIRST_WITHOUT_CUDA, installed_version, major_minor, preflight, \
    resolve_runtime
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import XlaOptions, apply_user_precedence, tpu, xla_env


@dataclass(frozen=True)
class DeviceRequest:
    """The device side of the command line: device, runtime, SPMD and their kin."""

    device: str = "auto"
    runtime: str = "auto"
    spmd: bool = False
    virtual_devices: Optional[int] = None
    coordinator_port: Optional[int] = None


@dataclass(frozen=True)
class DevicePlan:
    """What the device layer decided; the launcher only reports and applies it.

    ``explicit`` says the user chose the device (the device option or ``PJRT_DEVICE``) rather
    than detection. ``user_environ`` is the launcher's environment: a variable the user
    set there is kept instead of the planned one.
    """

    device: str = "cpu"
    runtime: str = "pjrt"
    xla: Optional[XlaOptions] = None
    spmd: bool = False
    explicit: bool = False
    user_environ: Mapping[str, str] = field(default_factory=dict)

    def variables(self, node: NodeAssignment, local_rank: int) -> dict[str, str]:
        """The XLA variables one worker gets, less those the user set."""
        return self.translate(node, local_rank)[0]

    def translate(self, node: NodeAssignment, local_rank: int) -> tuple[dict[str, str], list[str]]:
        """The variables and the notices naming the user's variables kept instead of planned ones."""
        if self.xla is None:
            return {}, []
        return apply_user_precedence(xla_env(self.xla, node, local_rank), self.user_environ)


def plan_device(request: DeviceRequest, environ: Mapping[str, str], *, nnodes: int, dry_run: bool) -> DevicePlan:
    """Resolve device and runtime, check the installed packages can run them, and plan the variables."""
    root = host_root(environ)
    device = resolve_device(request.device, environ, root)
    torch_xla_version = installed_version("torch_xla")
    runtime = resolve_runtime(request.runtime, torch_xla_version)
    if (device == "cuda" and request.device == "auto" and "PJRT_DEVICE" not in environ
            and not dry_run and not xla_has_cuda(torch_xla_version)):
        # A GPU host running a plain torchrun job (NCCL, gloo) must not be refused for lack of XLA:GPU.
        device = "cpu"
    topology = None
    if device == "tpu":
        topology = tpu.topology(environ, local_unit_count("tpu", root), nnodes, tpu_generation(root))
    xla = XlaOptions(device=device, runtime=runtime, spmd=request.spmd, virtual_devices=request.virtual_devices,
                     coordinator_port=request.coordinator_port, tpu_topology=topology)
    if not dry_run:
        preflight(device, runtime, spmd=request.spmd, virtual_devices=request.virtual_devices)
    explicit = request.device != "auto" or "PJRT_DEVICE" in environ
    return DevicePlan(device=device, runtime=runtime, xla=xla, spmd=request.spmd, explicit=explicit,
                      user_environ=dict(environ))


def count_workers(request: NprocRequest, device: DevicePlan, environ: Mapping[str, str], *, dry_run: bool) -> int:
    """This node's worker count: a number as given; ``auto`` counts the device's local units.

    Raises :class:`PlanError` worded as a sentence about the requested count.

    Under SPMD one process sees every local device. ``cpu``/``gpu``, and ``auto``
    without an accelerator, follow torchrun's rule: GPUs where the host shows them,
    else CPUs.
    """
    if device.spmd:
        if request.count not in (None, 1) or request.word not in (None, "auto"):
            raise PlanError("cannot run under SPMD, where one process per node sees every local device: "
                            "drop it or set it to 1")
        return 1
    if request.count is not None:
        return request.count
    if request.word == "auto" and device.device not in ("cpu", "xpu"):
        count = local_unit_count(device.device, host_root(environ))
        if count:
            return count
        if not dry_run:
            raise PlanError(f"found no {device.device} devices on this host: give a number, or pick the device")
    cpus = os.cpu_count() or 1
    gpus = nvidia_gpu_count(host_root(environ))
    if request.word == "cpu":
        return cpus
    if request.word == "gpu" and not gpus:
        raise PlanError("found no visible GPU on this host: give a number, cpu or auto")
    return gpus or cpus


def check_device_plan(device: DevicePlan, probe: NodeAssignment) -> list[str]:
    """Translate the probe's last worker now, so a plan the device cannot run fails before anything starts.

    The device's rules (chips per host, SPMD, coordinator port) depend only on this node's
    worker count and the flags, not on what a rendezvous later decides. Returns the notices
    to print: the user's own variables kept instead of planned ones (the same for every worker).
    """
    return device.translate(probe, probe.local_world_size - 1)[1]


def xla_has_cuda(torch_xla_version: Optional[str]) -> bool:
    """XLA:GPU exists in torch_xla 2.2 to 2.8 only."""
    return (torch_xla_version is not None
            and FIRST_WITH_CUDA_NAME <= major_minor(torch_xla_version) < FIRST_WITHOUT_CUDA)
