"""How torch_xla releases differ where xlarun's translations depend on them, as data.

Each fact below was read from the release's own Python set-up code (``runtime.py``,
``_internal/{pjrt,rendezvous,tpu,neuron}.py``, ``experimental/plugins.py``, the Neuron part
of ``__init__.py``); ``tests/launch/test_release_matrix.py`` runs that code, taken from each
release's wheel, on the environments xlarun plans. A release is ``(major, minor)``: patch
releases do not change this code.

Usage::

    xla_init_break((2, 5), "neuron", spmd=False, local_processes=1)   # why xla:// fails there, or None

``release_of(installed_version("torch_xla"))`` gives the installed release (the newest supported
where none is installed), read from the package metadata without importing torch_xla. Beside
:mod:`xlarun.exceptions`, this module imports nothing of xlarun, so the package checks
(:mod:`xlarun.planning.packages`) and the worker can read it cheaply.
"""

from __future__ import annotations

import os
import re
import sys

from xlarun.exceptions import PlanError
from xlarun.structs import Struct

Release = tuple[int, int]

SUPPORTED: tuple[Release, ...] = ((2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6), (2, 7), (2, 8), (2, 9))
"""The PJRT releases xlarun plans for; each is in the release matrix test. Older ones run XRT."""

NEWEST: Release = SUPPORTED[-1]
"""The release a plan assumes where no torch_xla is installed (a dry run for another machine)."""

FIRST_WITHOUT_XRT: Release = (2, 1)
"""The first release without XRT: older ones run XRT only."""

XLA_INIT_PINS_ONE_LOCAL_PROCESS: Release = (2, 4)
"""From this release, ``xla://`` makes a lone local process a one-chip world
(``initialize_singleprocess``). Before it, ``initialize_multiprocess(0, 1)`` sets the TPU
topology of the whole slice with one chip per process, which waits forever for processes
that are never started."""

NEURON_IMPORT_CONFIGURES: Release = (2, 5)
"""From this release ``import torch_xla`` configures a Neuron worker
(``configure_pjrt_environment``): it gives the process the NeuronCore of its local rank
(``NEURON_RT_VISIBLE_CORES``) unless ``XLA_USE_SPMD=1`` is already set. Before it only the
``xla://`` set-up picks the core, and it also overwrites the process index."""

XPU_FIRST_RELEASE: Release = (2, 4)
"""The first release with the XPU plugin (``torch_xla._internal.xpu``); before it ``PJRT_DEVICE=XPU``
names no device."""

TPU_GENERATION_FIRST_RELEASE: dict[int, tuple[str, Release]] = {7: ("TPU7x", (2, 9))}
"""A TPU generation's name and the first release whose ``tpu.version()`` parses its accelerator
type: the pattern ``^v(\\d)`` before 2.9 cannot read ``tpu7x-8``, so every TPU set-up step raises."""


class XlaInitBreak(Struct, frozen=True):
    """A case where torch_xla's ``xla://`` set-up misconfigures a worker that xlarun started.

    ``releases`` is the first and last release affected; ``local_processes`` is ``"one"``
    (``LOCAL_WORLD_SIZE=1``) or ``"any"``; ``spmd`` None applies with and without SPMD.
    ``devices`` None applies to every device.
    """

    devices: tuple[str, ...] | None
    releases: tuple[Release, Release]
    local_processes: str
    spmd: bool | None
    reason: str

    def applies(self, release: Release, device: str, spmd: bool, local_processes: int) -> bool:
        return (
            self.releases[0] <= release <= self.releases[1]
            and (self.devices is None or device in self.devices)
            and (self.local_processes == "any" or local_processes == 1)
            and (self.spmd is None or self.spmd == spmd)
        )


XLA_INIT_BREAKS: tuple[XlaInitBreak, ...] = (
    XlaInitBreak(
        None, ((2, 1), (2, 1)), "any", True, "its rendezvous returns the device ordinal as the rank even under SPMD"
    ),
    XlaInitBreak(
        ("neuron",),
        ((2, 1), (2, 4)),
        "any",
        None,
        "initialize_env sets NEURON_PJRT_PROCESS_INDEX to the local rank, so each node takes the "
        "first node's process indices",
    ),
    XlaInitBreak(
        ("neuron",),
        ((2, 4), (2, 6)),
        "one",
        None,
        "the Neuron plugin has no configure_single_process (NotImplementedError)",
    ),
    XlaInitBreak(
        ("xpu",), ((2, 4), NEWEST), "one", None, "the XPU plugin has no configure_single_process (NotImplementedError)"
    ),
)
"""Where :func:`xlarun.init_process_group` joins with ``env://`` instead of ``xla://``."""


def xla_init_break(release: Release, device: str, *, spmd: bool, local_processes: int) -> XlaInitBreak | None:
    """The reason ``xla://`` would misconfigure this worker on ``release``, or None where it works."""
    return next((case for case in XLA_INIT_BREAKS if case.applies(release, device, spmd, local_processes)), None)


_LEADING_MAJOR_MINOR = r"^(\d+)\.(\d+)"


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (e.g. ``"2.9.0+cpu"``), or None."""
    found = installed_dist_info(distribution)
    return None if found is None else found[1]


def installed_dist_info(distribution: str) -> tuple[str, str] | None:
    """The ``<name>-<version>.dist-info`` folder of ``distribution`` and its version, or None.

    The first such folder on ``sys.path``, as the import system would find the package; names
    compare as packaging normalises them.
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
                return os.path.join(entry or ".", name), version
    return None


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def major_minor(version: str) -> tuple[int, int]:
    """``(X, Y)`` of a version string such as ``2.9.0``, ``2.1.0+libtpu`` or ``2.10.0a0+git1``."""
    match = re.match(_LEADING_MAJOR_MINOR, version)
    if not match:
        raise PlanError(f"cannot read a version number from {version!r}: expected X.Y[.Z...]")
    return int(match.group(1)), int(match.group(2))


def release_of(torch_xla_version: str | None) -> Release:
    """The release ``(X, Y)`` of a torch_xla version; the newest supported where none is installed
    (a dry run plans for another machine)."""
    return NEWEST if torch_xla_version is None else major_minor(torch_xla_version)
