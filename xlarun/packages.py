"""What the installed packages allow, read from their metadata without importing them.

Importing torch costs the launcher most of its start-up time, so versions come from
the installed ``*.dist-info`` folders only (not even ``importlib.metadata``, whose import
alone costs a launch about 10 ms). Every check takes the version lookup as a parameter so
callers (and tests) can plan for packages this Python does not have.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, Optional

from xlarun.exceptions import PlanError

RUNTIMES = ("auto", "pjrt", "xrt")

VersionLookup = Callable[[str], Optional[str]]
"""Maps a distribution name to its installed version string, or None when absent."""

FIRST_WITHOUT_XRT = (2, 1)
FIRST_WITH_CUDA_NAME = (2, 2)
FIRST_WITHOUT_CUDA = (2, 9)

_LEADING_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (e.g. ``"2.9.0+cpu"``), or None.

    Reads the first ``<name>-<version>.dist-info`` folder on ``sys.path``, as the import
    system would find the package; names compare as packaging normalises them.
    """
    wanted = _normalised(distribution)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            project, _, version = name[: -len(".dist-info")].partition("-")
            if version and _normalised(project) == wanted:
                return version
    return None


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def major_minor(version: str) -> tuple[int, int]:
    """``(X, Y)`` of a version string such as ``2.9.0``, ``2.1.0+libtpu`` or ``2.10.0a0+git1``."""
    match = _LEADING_MAJOR_MINOR.match(version)
    if not match:
        raise PlanError(f"cannot read a version number from {version!r}: expected X.Y[.Z...]")
    return int(match.group(1)), int(match.group(2))


def resolve_runtime(requested: str, torch_xla_version: str | None) -> str:
    """Turn the requested runtime into ``"pjrt"`` or ``"xrt"``.

    ``auto`` is XRT only for a torch_xla older than 2.1 (2.1 deleted XRT); with no
    torch_xla installed (a dry run, or CPU without XLA) it plans for PJRT.
    """
    if requested != "auto":
        return requested
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
              version_of: VersionLookup = installed_version) -> None:
    """Refuse, before anything starts, a plan the installed packages cannot run.

    ``device`` and ``runtime`` are already resolved, and :class:`xlarun.runtimes.XlaOptions`
    has checked that they fit together. Raises :class:`PlanError` with
    one line naming the conflict and what would work.
    """
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
    if device == "neuron" and version_of("libneuronxla") is None:
        raise PlanError("device neuron needs the AWS Neuron SDK's libneuronxla package, "
                         "which is not installed in this Python")
