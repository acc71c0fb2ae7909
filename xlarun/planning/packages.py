"""What the installed packages allow, read from their metadata without importing them.

Importing torch costs the launcher most of its start-up time, so versions come from
the installed ``*.dist-info`` folders only (not even ``importlib.metadata``, whose import
alone costs a launch about 10 ms). Every check takes the version lookup as a parameter so
callers (and tests) can plan for packages this Python does not have.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from xlarun.exceptions import PlanError
from xlarun.runtimes import NATIVE_RUNTIMES
from xlarun.runtimes.releases import (
    FIRST_WITHOUT_XRT,
    SUPPORTED,
    TPU_GENERATION_FIRST_RELEASE,
    XPU_FIRST_RELEASE,
    Release,
    installed_version,
    major_minor,
)

RUNTIMES = ("auto", "pjrt", "xrt", *NATIVE_RUNTIMES)

NATIVE_DISTRIBUTIONS: Mapping[str, str] = {"torchtpu": "torch_tpu", "torchneuron": "torch-neuronx"}
"""The package of each device's own backend. AWS names the native TorchNeuron ``torch-neuronx``, like its
legacy PyTorch/XLA library, which needs torch_xla: without torch_xla it is the native one."""

VersionLookup = Callable[[str], str | None]
"""Maps a distribution name to its installed version string, or None when absent."""

FIRST_WITH_CUDA_NAME = (2, 2)
FIRST_WITHOUT_CUDA = (2, 9)

LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
"""The packages that carry libtpu (``torch_xla[tpu]`` installs ``libtpu``); a ``+libtpu`` build of
torch_xla bundles its own."""

def supported_releases_text() -> str:
    """The supported releases in words, for refusals."""
    return (f"{_version_text(SUPPORTED[0])} to {_version_text(SUPPORTED[-1])} under PJRT, "
            f"or {_version_text((FIRST_WITHOUT_XRT[0], FIRST_WITHOUT_XRT[1] - 1))} and older under XRT")


def resolve_runtime(requested: str, torch_xla_version: str | None, device: str = "cpu", spmd: bool = False,
                    version_of: VersionLookup = installed_version) -> str:
    """Turn the requested runtime into one of :data:`RUNTIMES` but ``auto``.

    ``auto`` is XRT only for a torch_xla older than 2.1 (2.1 deleted XRT). With no torch_xla
    installed it is the device's own backend where that is installed (:data:`NATIVE_DISTRIBUTIONS`:
    TorchTPU on tpu, TorchNeuron on neuron) and SPMD, torch_xla's, was not asked for; else PJRT (a
    dry run for another machine, or CPU without XLA).
    """
    if requested != "auto":
        return requested
    if torch_xla_version is None and not spmd:
        return next((runtime for runtime, native_device in NATIVE_RUNTIMES.items()
                     if native_device == device and version_of(NATIVE_DISTRIBUTIONS[runtime]) is not None), "pjrt")
    if torch_xla_version is not None and major_minor(torch_xla_version) < FIRST_WITHOUT_XRT:
        return "xrt"
    return "pjrt"


def needs_torch_xla(device: str, spmd: bool = False, virtual_devices: int | None = None) -> bool:
    """Whether workers for this plan cannot run without torch_xla.

    Plain CPU workers may be ordinary torch programs (gloo), as under torchrun; only
    SPMD or virtual CPU devices make XLA necessary there.
    """
    return device != "cpu" or spmd or virtual_devices is not None


def _version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def preflight(device: str, runtime: str, *, spmd: bool = False, virtual_devices: int | None = None,
              tpu_library_path: str | None = None, tpu_generation: int | None = None,
              version_of: VersionLookup = installed_version) -> None:
    """Refuse, before anything starts, a plan the installed packages cannot run.

    ``device`` and ``runtime`` are already resolved, and :class:`xlarun.runtimes.XlaOptions`
    has checked that they fit together. ``tpu_library_path`` is ``TPU_LIBRARY_PATH``, where
    torch_xla finds a libtpu that no package installed; ``tpu_generation`` is the host's TPU
    generation when known. Raises :class:`PlanError` with one line naming the conflict and
    what would work.
    """
    if runtime in NATIVE_RUNTIMES:
        preflight_native(runtime, tpu_library_path, version_of)
        return
    torch_xla_version = version_of("torch_xla")
    if torch_xla_version is None:
        if needs_torch_xla(device, spmd, virtual_devices) or runtime == "xrt":
            raise PlanError(f"device {device}{' under SPMD' if spmd else ''} needs torch_xla, "
                             "which is not installed in this Python")
        return
    xla = major_minor(torch_xla_version)

    torch_version = version_of("torch")
    if torch_version is None:
        raise PlanError(f"torch_xla {torch_xla_version} needs torch {_version_text(xla)}, "
                         "which is not installed in this Python")
    if major_minor(torch_version) != xla:
        raise PlanError(f"torch_xla {torch_xla_version} needs torch {_version_text(xla)}.x, "
                         f"but torch {torch_version} is installed: install matching releases")

    if xla > SUPPORTED[-1] and needs_torch_xla(device, spmd, virtual_devices):
        raise PlanError(f"torch_xla {torch_xla_version} is newer than the releases xlarun's device settings "
                        f"are checked against ({supported_releases_text()}): install one of those")
    if runtime == "xrt" and xla >= FIRST_WITHOUT_XRT:
        raise PlanError(f"the XRT runtime needs torch_xla 2.0 or older (2.1 removed XRT), "
                        f"but torch_xla {torch_xla_version} is installed: use the PJRT runtime")
    if device == "cuda":
        if xla >= FIRST_WITHOUT_CUDA:
            raise PlanError(f"device cuda needs torch_xla 2.2 to 2.8: torch_xla {torch_xla_version} "
                             "has no CUDA support (removed in 2.9)")
        if runtime == "pjrt" and xla < FIRST_WITH_CUDA_NAME:
            raise PlanError(f"device cuda under PJRT needs torch_xla 2.2 to 2.8, but torch_xla "
                            f"{torch_xla_version} is installed: upgrade, or use the XRT runtime with 2.0 or older")
    if (device == "tpu" and runtime == "pjrt" and not tpu_library_path and "libtpu" not in torch_xla_version
            and all(version_of(name) is None for name in LIBTPU_DISTRIBUTIONS)):
        raise PlanError(f"device tpu needs libtpu, which is not installed in this Python: "
                        f"pip install 'torch_xla[tpu]=={torch_xla_version}', or set TPU_LIBRARY_PATH")
    if device == "xpu" and xla < XPU_FIRST_RELEASE:
        raise PlanError(f"device xpu needs torch_xla {_version_text(XPU_FIRST_RELEASE)} or newer (its PJRT plugin "
                        f"came in that release), but torch_xla {torch_xla_version} is installed")
    generation = TPU_GENERATION_FIRST_RELEASE.get(tpu_generation or 0)
    if device == "tpu" and generation is not None and xla < generation[1]:
        name, first = generation
        raise PlanError(f"{name} chips need torch_xla {_version_text(first)} or newer (older releases cannot read "
                        f"their accelerator type), but torch_xla {torch_xla_version} is installed")
    if device == "neuron" and version_of("libneuronxla") is None:
        raise PlanError("device neuron needs the AWS Neuron SDK's libneuronxla package, "
                         "which is not installed in this Python")


def preflight_native(runtime: str, tpu_library_path: str | None, version_of: VersionLookup) -> None:
    """Refuse a native runtime (:data:`NATIVE_DISTRIBUTIONS`) whose package is missing, or mixed with torch_xla.

    TorchTPU loads libtpu from ``TPU_LIBRARY_PATH`` inside ``import torch`` and aborts the process
    (a fatal CHECK) where the path names no library, so a path that names no file is refused here.
    """
    distribution = NATIVE_DISTRIBUTIONS[runtime]
    version = version_of(distribution)
    if version is None:
        raise PlanError(f"the {runtime} runtime needs {distribution}, which is not installed in this Python")
    torch_xla_version = version_of("torch_xla")
    if runtime == "torchneuron" and torch_xla_version is not None:
        raise PlanError(f"torch-neuronx {version} beside torch_xla {torch_xla_version} is AWS's PyTorch/XLA "
                        "library, not the native TorchNeuron, and the two must not be mixed: use the pjrt "
                        "runtime, or install TorchNeuron where torch_xla is not")
    if runtime == "torchtpu" and tpu_library_path and not os.path.isfile(tpu_library_path):
        raise PlanError(f"TPU_LIBRARY_PATH={tpu_library_path} is not a file: torch_tpu loads libtpu from it at "
                        "import torch and aborts every worker where it cannot; unset it or name libtpu.so")


NEWEST_TORCHRUN: Release = (2, 15)
"""The newest torchrun xlarun follows, and the one it follows where no torch is installed."""

LONE_NODE_ON_A_FREE_PORT: Release = (2, 12)
"""From this torch on, torchrun runs a lone node given neither ``--master-port`` (nor ``PET_MASTER_PORT``)
nor an endpoint as ``--standalone``: c10d on ``localhost:0``, a free port, a fresh run id (``run.py``'s
``run``). Before it, such a node takes MASTER_PORT 29500."""


def followed_torchrun(version_of: VersionLookup = installed_version) -> Release:
    """The torchrun whose behaviour xlarun follows where releases differ: the installed torch's, else the newest."""
    version = version_of("torch")
    return NEWEST_TORCHRUN if version is None else min(major_minor(version), NEWEST_TORCHRUN)
