"""Which XLA device a host has and how many local units (processes) it offers.

Everything here reads files under a root directory (``/`` on a real host, a fake
tree in tests, see :func:`host_root`) and never imports torch or torch_xla, so the
launcher can decide before any worker exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from xlarun.exceptions import PlanError

DEVICES = ("auto", "tpu", "neuron", "cuda", "cpu", "xpu")
"""The devices a user may ask for. Every name but ``auto`` is also a resolved device."""

HOST_ROOT_VARIABLE = "XLARUN_HOST_ROOT"

_PJRT_NAMES = {"tpu": "TPU", "neuron": "NEURON", "cuda": "CUDA", "cpu": "CPU", "xpu": "XPU"}

# torch_xla 2.0 and 2.1 spelled XLA:GPU as PJRT_DEVICE=GPU; it is the same device.
_FROM_PJRT_NAME = {**{pjrt: device for device, pjrt in _PJRT_NAMES.items()}, "GPU": "cuda"}

GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICE_GENERATIONS: Mapping[str, int | None] = {
    "0x0027": 3,  # v2 and v3 share an id; torch_xla treats both alike
    "0x005e": 4,
    "0x0063": 5,  # v5e
    "0x006f": 6,  # v6e
    "0x0076": 7,  # TPU7x
    "0x0056": None,  # ids torch_xla counts as TPU chips without naming a generation
    "0x0062": None,
}
"""PCI device ids of Google's vendor id that are TPU chips, as torch_xla 2.9 counts them.

The vendor id alone is not enough: a GCE VM's gVNIC network card is also 0x1ae0.
"""

NEURON_CORES_PER_DEVICE = 2
"""NeuronCores per Neuron device on trn1, trn1n and inf2."""

NEURON_CORES_PER_DEVICE_TRN2 = 4
"""Logical NeuronCores per trn2 device with the runtime's default of two physical cores
per logical core (``NEURON_LOGICAL_NC_CONFIG=2``); give the worker count explicitly
when running trn2 with one physical core per logical core."""

NEURON_DEVICE_NAME = r"^neuron\d+$"
NVIDIA_DEVICE_NAME = r"^nvidia\d+$"

DEVICE_FILES: Mapping[str, tuple[tuple[str, str], ...]] = {
    # A VFIO group node per chip; /dev/vfio/vfio is the container node every VFIO user shares.
    "tpu": (("dev", r"^accel\d+$"), ("dev/vfio", r"^(noiommu-)?\d+$")),
    "neuron": (("dev", NEURON_DEVICE_NAME),),
    # One node per GPU; nvidiactl, nvidia-uvm and nvidia-modeset are opened by every CUDA program.
    "cuda": (("dev", NVIDIA_DEVICE_NAME),),
}
"""Per device: (directory under the host root, pattern of the device files' names in it)."""


def host_root(environ: Mapping[str, str]) -> str:
    """The directory under which this host's ``/sys``, ``/dev`` and ``/proc`` are read.

    ``/`` unless ``XLARUN_HOST_ROOT`` names another tree (a fake host for tests).
    """
    return environ.get(HOST_ROOT_VARIABLE) or "/"


METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
"""Where Google's own clients (google-auth) find the metadata server when set (``host[:port]``)."""
DMI_PRODUCT_NAME = "sys/class/dmi/id/product_name"


def has_metadata_server(environ: Mapping[str, str]) -> bool:
    """Whether this host has a GCE metadata server: ``GCE_METADATA_HOST`` names one, or the firmware
    says the host is a Google Compute Engine VM (every TPU VM and GKE node is one), by DMI's product
    name as google-auth reads it. One small read: no request is made."""
    if environ.get(METADATA_HOST_VARIABLE):
        return True
    try:
        with open(os.path.join(host_root(environ), DMI_PRODUCT_NAME)) as product:
            return product.read(256).startswith("Google")
    except OSError:
        return False


def pjrt_device_name(device: str) -> str:
    """``PJRT_DEVICE``'s spelling of a resolved device (``"tpu"`` -> ``"TPU"``)."""
    return _PJRT_NAMES[device]


def resolve_device(requested: str, environ: Mapping[str, str], root: str = "/") -> str:
    """Turn the requested device into a concrete device name.

    ``auto`` follows ``PJRT_DEVICE`` when the user set it (torch_xla would obey it
    too); otherwise the first accelerator this host has, in torch_xla's own probe
    order (TPU, then Neuron) followed by NVIDIA GPUs, and CPU when there is none.
    """
    if requested != "auto":
        return requested
    pjrt_device = environ.get("PJRT_DEVICE")
    if pjrt_device:
        # torch_xla reads only the part before '_' (e.g. "TPU_LEGACY" is TPU).
        kind = pjrt_device.split("_")[0].upper()
        if kind not in _FROM_PJRT_NAME:
            raise PlanError(
                f"PJRT_DEVICE={pjrt_device} is not a device xlarun knows: "
                f"use one of {', '.join(_PJRT_NAMES.values())}, or unset it"
            )
        return _FROM_PJRT_NAME[kind]
    if tpu_chip_count(root):
        return "tpu"
    if neuron_device_count(root):
        return "neuron"
    if nvidia_gpu_count(root):
        return "cuda"
    return "cpu"


def local_unit_count(device: str, root: str = "/") -> int | None:
    """How many workers the worker count ``auto`` starts on this host for ``device``.

    One per TPU chip, per NeuronCore, or per NVIDIA GPU; 0 when the host has none of
    that device (the caller decides, e.g. ask for a number). ``None`` for cpu and xpu:
    the caller then applies torchrun's own rule.
    """
    if device == "tpu":
        return tpu_chip_count(root)
    if device == "neuron":
        return neuron_core_count(root)
    if device == "cuda":
        return nvidia_gpu_count(root)
    return None


def _read_stripped(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def list_dir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _under(root: str, *parts: str) -> str:
    return os.path.join(root, *parts)


def device_files(device: str, root: str = "/") -> set[str]:
    """The device files of ``device`` that exist on this host, as fd links name them.

    Empty for a device without files to hold (cpu, xpu) and on a host without the device:
    then nothing needs scanning.
    """
    found: set[str] = set()
    for directory, pattern in DEVICE_FILES.get(device, ()):
        path = os.path.join(root, directory)
        for name in list_dir(path):
            if re.match(pattern, name):
                # fd links show the path the file was opened by, with symlinks resolved.
                found.add(os.path.realpath(os.path.join(path, name)))
    return found


def tpu_chip_device_ids(root: str = "/") -> list[str]:
    """PCI device ids of the TPU chips attached to this host, one per chip."""
    pci_devices = _under(root, "sys", "bus", "pci", "devices")
    ids = []
    for entry in list_dir(pci_devices):
        if _read_stripped(os.path.join(pci_devices, entry, "vendor")) != GOOGLE_PCI_VENDOR:
            continue
        device_id = _read_stripped(os.path.join(pci_devices, entry, "device"))
        if device_id is not None and device_id in TPU_PCI_DEVICE_GENERATIONS:
            ids.append(device_id)
    return ids


def tpu_chip_count(root: str = "/") -> int:
    return len(tpu_chip_device_ids(root))


def tpu_generation(root: str = "/") -> int | None:
    """The TPU generation of this host's chips (4 for v4, 7 for TPU7x), or None if unknown."""
    generations = {TPU_PCI_DEVICE_GENERATIONS[device_id] for device_id in tpu_chip_device_ids(root)}
    return generations.pop() if len(generations) == 1 else None


def tpu_chip_id(root: str = "/") -> str | None:
    """The PCI device id of this host's TPU chips (``0x005e`` for v4), or None without chips of one kind.

    Finer than :func:`tpu_generation`: v5p (``0x0062``) and v5e (``0x0063``) are both generation 5
    but differ in TorchTPU's topologies.
    """
    ids = set(tpu_chip_device_ids(root))
    return ids.pop() if len(ids) == 1 else None


def neuron_device_count(root: str = "/") -> int:
    """Neuron devices, counted as the ``/dev/neuron<N>`` nodes the Neuron driver creates."""
    return sum(1 for name in list_dir(_under(root, "dev")) if re.match(NEURON_DEVICE_NAME, name))


def neuron_core_count(root: str = "/") -> int:
    """NeuronCores on this host: devices times cores per device.

    Cores per device follow the instance family named in
    ``/sys/devices/virtual/dmi/id/product_name`` (what the Neuron tooling reads):
    trn2 exposes :data:`NEURON_CORES_PER_DEVICE_TRN2` logical cores per device, every
    other Neuron instance torch_xla runs on (trn1, trn1n, inf2) two.
    """
    devices = neuron_device_count(root)
    product = _read_stripped(_under(root, "sys", "devices", "virtual", "dmi", "id", "product_name")) or ""
    per_device = NEURON_CORES_PER_DEVICE_TRN2 if product.startswith("trn2") else NEURON_CORES_PER_DEVICE
    return devices * per_device


def nvidia_gpu_count(root: str = "/") -> int:
    """NVIDIA GPUs: the driver's ``/proc/driver/nvidia/gpus`` entries, else ``/dev/nvidia<N>`` nodes."""
    from_proc = len(list_dir(_under(root, "proc", "driver", "nvidia", "gpus")))
    if from_proc:
        return from_proc
    return sum(1 for name in list_dir(_under(root, "dev")) if re.match(NVIDIA_DEVICE_NAME, name))
