"""Worker-side helpers: join the process group without silently splitting the world.

Everything under :mod:`xlarun.worker` runs inside the workers; the launcher runs none
of it. Importing it imports neither torch nor torch_xla; the functions that need them
import them when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xlarun.contract import LAUNCHED_MARKER, SPMD_MARKER
from xlarun.host.devices import resolve_device
from xlarun.runtimes.releases import installed_version, release_of, xla_init_break
from xlarun.worker import xrt

TORCH_VIEW = "torch.distributed"
RUNTIME_VIEW = "the XLA runtime"


class SplitWorldError(RuntimeError):
    """The process group or the XLA runtime sees a different world than the launcher started."""


def is_launched() -> bool:
    """True when this process is a worker started by xlarun."""
    return os.environ.get(LAUNCHED_MARKER) == "1"


def init_process_group(backend: str = "xla", **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` for XLA workers, checked against the launcher.

    - Registers torch_xla's ``xla`` backend and its ``xla://`` init method.
    - Under SPMD (launched with xlarun's SPMD option, ``XLA_USE_SPMD=1`` or
      ``torch_xla.runtime.use_spmd()``) the ``xla`` backend is replaced by ``gloo``,
      torch_xla's documented form, since the ``xla`` backend refuses SPMD. A process
      launched for SPMD whose program has not switched SPMD on yet gets
      ``torch_xla.runtime.use_spmd()`` here: torch_xla 2.1 and later deprecate the variable.
    - Without ``init_method`` or ``store`` in ``kwargs``: ``xla://`` for the ``xla``
      backend and under SPMD (ranks from the XLA runtime), ``env://`` for any other
      backend (ranks from the launcher). Where the installed release's ``xla://`` set-up
      misconfigures this device (:data:`xlarun.runtimes.releases.XLA_INIT_BREAKS`), ``env://``
      instead: the launcher's variables already configure the runtime.
    - Under XRT (torch_xla older than 2.1, launched with ``XRT_*`` variables) it first
      builds ``XRT_WORKERS`` and ``XRT_DEVICE_MAP`` through the store at
      ``MASTER_ADDR:MASTER_PORT`` and, without ``init_method`` or ``store``, joins
      the group through that same store.

    When ``RANK`` and ``WORLD_SIZE`` are set, the rank and world size that
    ``torch.distributed`` and, where it numbers the workers, the XLA runtime report
    must equal them; otherwise :class:`SplitWorldError` names the cause. Under SPMD
    the expected world is one process per node. Other ``kwargs`` go to
    ``torch.distributed.init_process_group`` unchanged.
    """
    environ = os.environ
    import torch.distributed as dist

    xrt_store = None
    if xrt.torch_xla_has_xrt() and xrt.needs_xrt_lists(environ):
        xrt_store = xrt.configure_xrt_worker(environ)

    import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" and "xla://"

    # torch_xla's own test (runtime.is_spmd) reads this flag; use_spmd() sets it.
    spmd = environ.get("XLA_USE_SPMD", "0").lower() in ("1", "true")
    if environ.get(SPMD_MARKER) == "1" and not spmd:
        import torch_xla.runtime as xr

        xr.use_spmd()
        spmd = True
    if spmd and backend == "xla":
        backend = "gloo"
    if "init_method" not in kwargs and "store" not in kwargs:
        if xrt_store is not None:
            kwargs.update(store=xrt_store, rank=int(environ["RANK"]), world_size=int(environ["WORLD_SIZE"]))
        else:
            kwargs["init_method"] = default_init_method(backend, spmd, environ)
    runtime_numbers_workers = backend == "xla" or spmd or kwargs.get("init_method") == "xla://"

    expected = _launcher_numbers(environ)
    device = _runtime_device(environ)
    if expected is not None and runtime_numbers_workers and device == "CPU":
        # The CPU client needs no topology from the rendezvous, so it can be asked
        # before one; afterwards would be too late: every process would believe
        # it is rank 0 and try to serve the store on MASTER_PORT.
        message = describe_split(*expected, {RUNTIME_VIEW: _runtime_process_view()}, device, spmd)
        if message is not None:
            raise SplitWorldError(message)

    dist.init_process_group(backend, **kwargs)
    if expected is None:
        return
    views = {TORCH_VIEW: (dist.get_rank(), dist.get_world_size())}
    if runtime_numbers_workers:
        views[RUNTIME_VIEW] = _runtime_view(spmd)
    message = describe_split(*expected, views, device, spmd)
    if message is not None:
        dist.destroy_process_group()
        raise SplitWorldError(message)


def default_init_method(backend: str, spmd: bool, environ: Mapping[str, str]) -> str:
    """``xla://`` where the XLA runtime numbers the workers (the ``xla`` backend, SPMD), unless
    the installed release's ``xla://`` set-up breaks this device there; ``env://`` otherwise."""
    if backend != "xla" and not spmd:
        return "env://"
    release = release_of(installed_version("torch_xla"))
    device = resolve_device("auto", {"PJRT_DEVICE": environ.get("PJRT_DEVICE") or "CPU"})
    local_processes = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    broken = xla_init_break(release, device, spmd=spmd, local_processes=local_processes)
    return "env://" if broken is not None else "xla://"


def describe_split(
    rank: int, world_size: int, views: Mapping[str, tuple[int, int]], device: str | None, spmd: bool
) -> str | None:
    """Why the ``(rank, world size)`` of some view differs from the launcher's, or None.

    ``views`` maps a name (``torch.distributed``, ``the XLA runtime``) to what it reports.
    """
    # Loaded only to word a refusal: a worker that starts well never reads the option table.
    from xlarun.flags import flag

    for name, (seen_rank, seen_world) in views.items():
        if (seen_rank, seen_world) == (rank, world_size):
            continue
        if device == "CPU" and name == RUNTIME_VIEW and seen_world == 1 and world_size > 1:
            return (
                f"PJRT's CPU client has no cross-process collectives: each of the {world_size} "
                f"processes would train alone as rank 0 of 1; use {flag('spmd')} {flag('virtual_devices')} K "
                f"(one process, K devices) or the gloo backend with CPU tensors"
            )
        cause = (
            f"the launcher set RANK={rank} WORLD_SIZE={world_size} but {name} reports rank {seen_rank} of {seen_world}"
        )
        if spmd:
            return (
                f"{cause}: under SPMD each node runs one process that sees all its devices; launch with {flag('spmd')}"
            )
        return (
            f"{cause}: the workers do not form one XLA world; check that PJRT_DEVICE and the "
            f"device's topology variables are those the launcher set"
        )
    return None


def _launcher_numbers(environ: Mapping[str, str]) -> tuple[int, int] | None:
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    return int(environ["RANK"]), int(environ["WORLD_SIZE"])


def _runtime_device(environ: Mapping[str, str]) -> str | None:
    """The PJRT device kind (``CPU``, ``TPU``, ...), as torch_xla reads ``PJRT_DEVICE``."""
    pjrt_device = environ.get("PJRT_DEVICE")
    return pjrt_device.split("_")[0].upper() if pjrt_device else None


def _runtime_process_view() -> tuple[int, int]:
    import torch_xla.runtime as xr

    return xr.process_index(), xr.process_count()


def _runtime_view(spmd: bool) -> tuple[int, int]:
    """Rank and world size as the XLA runtime numbers them: processes under SPMD, devices otherwise."""
    try:
        import torch_xla.runtime as xr
    except ImportError:
        # torch_xla before 2.1 keeps these in xla_model.
        import torch_xla.core.xla_model as xm

        # Names of torch_xla 2.0 and older, absent from the release these annotations are checked against.
        return xm.get_ordinal(), xm.xrt_world_size()  # type: ignore[attr-defined]
    if spmd:
        return xr.process_index(), xr.process_count()
    return xr.global_ordinal(), xr.world_size()
