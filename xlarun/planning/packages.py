"""What the installed packages allow, read from their metadata without importing them.

Importing torch costs the launcher most of its start-up time, so versions come from
the installed ``*.dist-info`` folders only (not even ``importlib.metadata``, whose import
alone costs a launch about 10 ms). Every check takes the version lookup as a parameter so
callers (and tests) can plan for packages this Python does not have.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from xlarun.exceptions import PlanError
from xlarun.runtimes import NATIVE_RUNTIMES
from xlarun.runtimes.releases import (
    FIRST_WITHOUT_XRT,
    SUPPORTED,
    TPU_GENERATION_FIRST_RELEASE,
    XPU_FIRST_RELEASE,
    Release,
    installed_dist_info,
    installed_version,
    major_minor,
)

RUNTIMES = ("auto", "pjrt", "xrt", *NATIVE_RUNTIMES)

NATIVE_DISTRIBUTIONS: Mapping[str, str] = {"torchtpu": "torch_tpu", "torchneuron": "torch-neuronx"}
"""The package of each device's own backend. AWS names the native TorchNeuron ``torch-neuronx``, like its
legacy PyTorch/XLA library, which needs torch_xla: without torch_xla it is the native one."""

VersionLookup = Callable[[str], str | None]
"""Maps a distribution name to its installed version string, or None when absent."""

TorchRequirementLookup = Callable[[str], str | None]
"""Maps a distribution name to the torch versions its metadata requires (a specifier such as ``==2.13.*``),
or None where it names none."""

FIRST_WITH_CUDA_NAME = (2, 2)
FIRST_WITHOUT_CUDA = (2, 9)

LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
"""The packages that carry libtpu (``torch_xla[tpu]`` installs ``libtpu``); a ``+libtpu`` build of
torch_xla bundles its own."""


def device_backend_packages() -> list[str]:
    """The installed packages that give torch a device backend when it is imported: their ``torch.backends``
    entry points (torch_tpu's ``torch_tpu._loader:load``), which torch's autoload loads. Read from the
    packages' metadata, without importing torch. Only a ``--nproc-per-node`` word that names no device asks, so
    ``importlib.metadata`` is imported here, not on every launch's path."""
    from importlib.metadata import entry_points

    return [entry.name for entry in entry_points(group="torch.backends")]


def supported_releases_text() -> str:
    """The supported releases in words, for refusals."""
    return (
        f"{_version_text(SUPPORTED[0])} to {_version_text(SUPPORTED[-1])} under PJRT, "
        f"or {_version_text((FIRST_WITHOUT_XRT[0], FIRST_WITHOUT_XRT[1] - 1))} and older under XRT"
    )


def resolve_runtime(
    requested: str,
    torch_xla_version: str | None,
    device: str = "cpu",
    spmd: bool = False,
    version_of: VersionLookup = installed_version,
) -> str:
    """Turn the requested runtime into one of :data:`RUNTIMES` but ``auto``.

    ``auto`` is XRT only for a torch_xla older than 2.1 (2.1 deleted XRT). With no torch_xla
    installed it is the device's own backend where that is installed (:data:`NATIVE_DISTRIBUTIONS`:
    TorchTPU on tpu, TorchNeuron on neuron) and SPMD, torch_xla's, was not asked for; else PJRT (a
    dry run for another machine, or CPU without XLA).
    """
    if requested != "auto":
        return requested
    if torch_xla_version is None and not spmd:
        return next(
            (
                runtime
                for runtime, native_device in NATIVE_RUNTIMES.items()
                if native_device == device and version_of(NATIVE_DISTRIBUTIONS[runtime]) is not None
            ),
            "pjrt",
        )
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


_REQUIREMENT = r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?$"
"""A ``Requires-Dist`` value: the name, any extras, the specifier (bare or in parentheses), any marker."""


def installed_torch_requirement(distribution: str) -> str | None:
    """The torch versions the installed ``distribution`` requires, from its dist-info ``METADATA``
    (``Requires-Dist: torch==2.13.*`` gives ``==2.13.*``); None where it names torch nowhere outside an extra."""
    found = installed_dist_info(distribution)
    if found is None:
        return None
    try:
        with open(os.path.join(found[0], "METADATA"), encoding="utf-8") as metadata:
            headers = metadata.read().split("\n\n", 1)[0]  # the description follows the first blank line
    except (OSError, UnicodeDecodeError):
        return None
    for line in headers.splitlines():
        key, _, value = line.partition(":")
        match = re.match(_REQUIREMENT, value) if key.strip().lower() == "requires-dist" else None
        if match and match.group(1).lower() == "torch" and "extra" not in (match.group(3) or ""):
            return match.group(2).replace(" ", "") or None
    return None


_CLAUSE = r"^(~=|===|==|!=|<=|>=|<|>)(.+)$"


def satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets every comma-separated clause of a PEP 440 ``specifier`` (``==2.13.*``,
    ``>=2.13,<2.15``, ``~=2.14.0``), comparing release numbers; a local label (``+cpu``) never counts."""
    release = _release(version)
    for clause in filter(None, specifier.split(",")):
        match = re.match(_CLAUSE, clause.strip())
        if match is None:
            raise PlanError(f"cannot read the version requirement {specifier!r}")
        operator, target = match.groups()
        if target.endswith(".*") and operator in ("==", "!="):
            prefix = _release(target[:-2])
            if (release[: len(prefix)] == prefix) != (operator == "=="):
                return False
            continue
        wanted = _release(target)
        width = max(len(release), len(wanted))
        have, want = release + (0,) * (width - len(release)), wanted + (0,) * (width - len(wanted))
        meets = {
            "==": have == want,
            "===": have == want,
            "!=": have != want,
            "<=": have <= want,
            ">=": have >= want,
            "<": have < want,
            ">": have > want,
            "~=": have >= want and release[: len(wanted) - 1] == wanted[:-1],
        }[operator]
        if not meets:
            return False
    return True


def _release(version: str) -> tuple[int, ...]:
    """The release numbers a version string opens with (``2.13.0a0+git1`` gives ``(2, 13, 0)``)."""
    numbers = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    if numbers is None:
        raise PlanError(f"cannot read a version number from {version!r}: expected X.Y[.Z...]")
    return tuple(int(part) for part in numbers.group(1).split("."))


def require_torch(package: str, wanted: str, pairs: Callable[[str], bool], version_of: VersionLookup) -> None:
    """Refuse a torch that ``package`` (its name and version, in words) does not pair with.

    ``wanted`` says in words which torch it needs; ``pairs`` tells whether an installed torch version is one.
    """
    torch_version = version_of("torch")
    if torch_version is None:
        raise PlanError(f"{package} needs {wanted}, which is not installed in this Python")
    if not pairs(torch_version):
        raise PlanError(f"{package} needs {wanted}, but torch {torch_version} is installed: install matching releases")


def preflight(
    device: str,
    runtime: str,
    *,
    spmd: bool = False,
    virtual_devices: int | None = None,
    tpu_library_path: str | None = None,
    tpu_generation: int | None = None,
    version_of: VersionLookup = installed_version,
    torch_requirement_of: TorchRequirementLookup = installed_torch_requirement,
) -> None:
    """Refuse, before anything starts, a plan the installed packages cannot run.

    ``device`` and ``runtime`` are already resolved, and :class:`xlarun.runtimes.XlaOptions`
    has checked that they fit together. ``tpu_library_path`` is ``TPU_LIBRARY_PATH``, where
    torch_xla finds a libtpu that no package installed; ``tpu_generation`` is the host's TPU
    generation when known. Raises :class:`PlanError` with one line naming the conflict and
    what would work.
    """
    if runtime in NATIVE_RUNTIMES:
        preflight_native(runtime, tpu_library_path, version_of, torch_requirement_of)
        return
    torch_xla_version = version_of("torch_xla")
    if torch_xla_version is None:
        if needs_torch_xla(device, spmd, virtual_devices) or runtime == "xrt":
            raise PlanError(
                f"device {device}{' under SPMD' if spmd else ''} needs torch_xla, which is not installed in this Python"
            )
        return
    xla = major_minor(torch_xla_version)

    require_torch(
        f"torch_xla {torch_xla_version}",
        f"torch {_version_text(xla)}.x",
        lambda torch_version: major_minor(torch_version) == xla,
        version_of,
    )

    if xla > SUPPORTED[-1] and needs_torch_xla(device, spmd, virtual_devices):
        raise PlanError(
            f"torch_xla {torch_xla_version} is newer than the releases xlarun's device settings "
            f"are checked against ({supported_releases_text()}): install one of those"
        )
    if runtime == "xrt" and xla >= FIRST_WITHOUT_XRT:
        raise PlanError(
            f"the XRT runtime needs torch_xla 2.0 or older (2.1 removed XRT), "
            f"but torch_xla {torch_xla_version} is installed: use the PJRT runtime"
        )
    if device == "cuda":
        if xla >= FIRST_WITHOUT_CUDA:
            raise PlanError(
                f"device cuda needs torch_xla 2.2 to 2.8: torch_xla {torch_xla_version} "
                "has no CUDA support (removed in 2.9)"
            )
        if runtime == "pjrt" and xla < FIRST_WITH_CUDA_NAME:
            raise PlanError(
                f"device cuda under PJRT needs torch_xla 2.2 to 2.8, but torch_xla "
                f"{torch_xla_version} is installed: upgrade, or use the XRT runtime with 2.0 or older"
            )
    if (
        device == "tpu"
        and runtime == "pjrt"
        and not tpu_library_path
        and "libtpu" not in torch_xla_version
        and all(version_of(name) is None for name in LIBTPU_DISTRIBUTIONS)
    ):
        raise PlanError(
            f"device tpu needs libtpu, which is not installed in this Python: "
            f"pip install 'torch_xla[tpu]=={torch_xla_version}', or set TPU_LIBRARY_PATH"
        )
    if device == "xpu" and xla < XPU_FIRST_RELEASE:
        raise PlanError(
            f"device xpu needs torch_xla {_version_text(XPU_FIRST_RELEASE)} or newer (its PJRT plugin "
            f"came in that release), but torch_xla {torch_xla_version} is installed"
        )
    generation = TPU_GENERATION_FIRST_RELEASE.get(tpu_generation or 0)
    if device == "tpu" and generation is not None and xla < generation[1]:
        name, first = generation
        raise PlanError(
            f"{name} chips need torch_xla {_version_text(first)} or newer (older releases cannot read "
            f"their accelerator type), but torch_xla {torch_xla_version} is installed"
        )
    if device == "neuron" and version_of("libneuronxla") is None:
        raise PlanError(
            "device neuron needs the AWS Neuron SDK's libneuronxla package, which is not installed in this Python"
        )


def preflight_native(
    runtime: str, tpu_library_path: str | None, version_of: VersionLookup, torch_requirement_of: TorchRequirementLookup
) -> None:
    """Refuse a native runtime (:data:`NATIVE_DISTRIBUTIONS`) whose package is missing, pairs with another
    torch, or is mixed with torch_xla.

    Each torch-neuronx release is built for given torch releases (Neuron 2.33's for torch 2.13 and
    2.14) and says which in its metadata's ``Requires-Dist: torch==X.Y.*``: that requirement is the
    check, so a new Neuron release needs no change here. TorchTPU loads libtpu from
    ``TPU_LIBRARY_PATH`` inside ``import torch`` and aborts the process (a fatal CHECK) where the path
    names no library, so a path that names no file is refused here.
    """
    distribution = NATIVE_DISTRIBUTIONS[runtime]
    version = version_of(distribution)
    if version is None:
        raise PlanError(f"the {runtime} runtime needs {distribution}, which is not installed in this Python")
    requirement = torch_requirement_of(distribution)
    if requirement is not None:
        require_torch(
            f"{distribution} {version}",
            f"torch{requirement} (its requirement)",
            lambda torch_version: satisfies(torch_version, requirement),
            version_of,
        )
    torch_xla_version = version_of("torch_xla")
    if runtime == "torchneuron" and torch_xla_version is not None:
        raise PlanError(
            f"torch-neuronx {version} beside torch_xla {torch_xla_version} is AWS's PyTorch/XLA "
            "library, not the native TorchNeuron, and the two must not be mixed: use the pjrt "
            "runtime, or install TorchNeuron where torch_xla is not"
        )
    if runtime == "torchtpu" and tpu_library_path and not os.path.isfile(tpu_library_path):
        raise PlanError(
            f"TPU_LIBRARY_PATH={tpu_library_path} is not a file: torch_tpu loads libtpu from it at "
            "import torch and aborts every worker where it cannot; unset it or name libtpu.so"
        )


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
