"""Worker-side set-up of the legacy XRT runtime (torch_xla older than 2.1).

XRT makes every worker a task of one full-mesh cluster and wants two lists with
one entry per worker: ``XRT_WORKERS`` (each task's gRPC address) and
``XRT_DEVICE_MAP`` (each task's device). Passed through the environment they grow
with the world until Linux refuses to start the worker (one variable may not
exceed 128 KiB). So the launcher hands each worker only its own ``XRT_*`` values,
and the workers build the lists themselves, before the runtime starts, by
exchanging addresses through a store.

Where the store lives: at ``MASTER_ADDR:MASTER_PORT``, the one address every
worker already has. Without an agent store, rank 0 serves it in multi-tenant mode,
so the ``env://`` store of ``torch.distributed.init_process_group`` in the same
process shares the server instead of colliding with it. With an agent store
(``TORCHELASTIC_USE_AGENT_STORE=True``) every worker is a client of the
launcher's store. ``XRT_MESH_SERVICE_ADDRESS`` is not used for this: XRT's own
mesh service binds that port in the ordinal-0 worker once the runtime starts.

Exchange cost: each worker writes its address once and reads one joined list;
rank 0 alone reads every address, so the store sees O(world) operations.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

from xlarun.contract import XRT_DEVICE_KINDS, XRT_TASK_JOB
from xlarun.host.ports import address_facing, free_port, host_port
from xlarun.runtimes.releases import FIRST_WITHOUT_XRT, installed_version, major_minor

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    import torch.distributed

KEY_PREFIX = "xlarun/xrt"
JOINED_WORKERS_KEY = "workers"

# Kept for the life of the worker: on rank 0 the store object owns the server
# that every other worker, and later the process group, talks to.
_exchange_store: torch.distributed.Store | None = None


def format_xrt_workers(addresses: Sequence[str]) -> str:
    """``XRT_WORKERS`` from the ``host:port`` gRPC address of each rank, in rank order."""
    return "|".join(f"{XRT_TASK_JOB}:{rank};grpc://{address}" for rank, address in enumerate(addresses))


def format_xrt_device_map(world_size: int, device: str) -> str:
    """``XRT_DEVICE_MAP`` for one device per task, as torch_xla 1.13 and 2.0 spell it.

    Task ``i`` owns ``<device>:<i>``, its first local XLA device:
    ``GPU:0;/job:localservice/replica:0/task:0/device:XLA_GPU:0|GPU:1;...``.
    """
    kind = device.upper()
    if kind not in XRT_DEVICE_KINDS.values():
        raise ValueError(
            f"XRT device map is built for {' and '.join(XRT_DEVICE_KINDS.values())} workers, not {device!r}"
        )
    return "|".join(
        f"{kind}:{task};/job:{XRT_TASK_JOB}/replica:0/task:{task}/device:XLA_{kind}:0" for task in range(world_size)
    )


def device_kind(multiprocessing_device: str) -> str:
    """The kind part of ``XRT_MULTI_PROCESSING_DEVICE`` (``GPU:3`` -> ``GPU``)."""
    return multiprocessing_device.split(":", 1)[0].upper()


def exchange_xrt_topology(
    store: torch.distributed.Store, rank: int, world_size: int, host: str, port: int, device: str
) -> dict[str, str]:
    """Publish this worker's gRPC address and return ``XRT_WORKERS`` and ``XRT_DEVICE_MAP``.

    Every rank of the world must call this with the same store, ``world_size`` and
    ``device``; each call blocks until all ranks have published (the store's
    timeout bounds the wait). All ranks return identical lists.
    """
    store.set(_address_key(rank), host_port(host, port))
    if rank == 0:
        addresses = [store.get(_address_key(peer)).decode() for peer in range(world_size)]
        store.set(JOINED_WORKERS_KEY, format_xrt_workers(addresses))
    workers = store.get(JOINED_WORKERS_KEY).decode()
    return {"XRT_WORKERS": workers, "XRT_DEVICE_MAP": format_xrt_device_map(world_size, device)}


def torch_xla_has_xrt() -> bool:
    """Whether the installed torch_xla still has the XRT runtime (removed in 2.1).

    Reads package metadata only, so neither torch nor torch_xla is imported.
    """
    version = installed_version("torch_xla")
    return version is not None and major_minor(version) < FIRST_WITHOUT_XRT


def needs_xrt_lists(environ: MutableMapping[str, str]) -> bool:
    """Whether this worker runs XRT on a device described by the lists, and lacks one of them.

    The launcher marks an XRT worker with ``XRT_MULTI_PROCESSING_DEVICE``. Lists the
    user set are kept (see :func:`configure_xrt_worker`).
    """
    mp_device = environ.get("XRT_MULTI_PROCESSING_DEVICE")
    if mp_device is None or device_kind(mp_device) not in XRT_DEVICE_KINDS.values():
        return False
    return "XRT_WORKERS" not in environ or "XRT_DEVICE_MAP" not in environ


def configure_xrt_worker(environ: MutableMapping[str, str] | None = None) -> torch.distributed.Store:
    """Build ``XRT_WORKERS`` and ``XRT_DEVICE_MAP`` for this worker and set them in ``environ``.

    Call before anything starts the XLA runtime. Reads torchrun's variables
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_RESTART_COUNT``) and
    ``XRT_MULTI_PROCESSING_DEVICE``. A list already in ``environ`` is kept. The
    worker's gRPC server gets a free port on the address this host uses to reach
    ``MASTER_ADDR``. Returns the store at ``MASTER_ADDR:MASTER_PORT``, fit to hand to
    ``torch.distributed.init_process_group(store=...)``.
    """
    global _exchange_store
    if environ is None:
        environ = os.environ
    master_addr = environ["MASTER_ADDR"]
    master_port = int(environ["MASTER_PORT"])
    rank = int(environ["RANK"])
    world_size = int(environ["WORLD_SIZE"])
    store = _open_store(
        master_addr,
        master_port,
        rank,
        world_size,
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )
    _exchange_store = store

    import torch.distributed as dist

    host = address_facing(master_addr, master_port)
    lists = exchange_xrt_topology(
        dist.PrefixStore(KEY_PREFIX, store),
        rank,
        world_size,
        host,
        free_port(host),
        device_kind(environ["XRT_MULTI_PROCESSING_DEVICE"]),
    )
    for name, value in lists.items():
        environ.setdefault(name, value)
    return store


def _open_store(
    master_addr: str, master_port: int, rank: int, world_size: int, *, agent_store: bool, restart_count: int
) -> torch.distributed.Store:
    import torch.distributed as dist

    if agent_store:
        # The launcher's store outlives restarts: the attempt prefix keeps this
        # attempt's keys apart from a failed one's, as torch's own clients do.
        client = dist.TCPStore(master_addr, master_port, world_size, is_master=False)
        return dist.PrefixStore(f"/worker/attempt_{restart_count}", client)
    return dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, multi_tenant=True)


def _address_key(rank: int) -> str:
    return f"address/{rank}"
