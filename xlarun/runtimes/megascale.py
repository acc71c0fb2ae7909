"""MegaScale: the settings that join several TPU slices into one job ("multislice"), for torch_xla on
TPU and TorchTPU alike.

Facts (``../shared/reference/hosts-notebooks-events.md`` §8; torch_tpu 0.2.0's
``_internal/distributed/device_mesh.py``, read from the wheel; nothing here ran on a TPU):

- libtpu starts the MegaScale client once ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_SLICE_ID`` and
  ``MEGASCALE_NUM_SLICES`` are set, and sets its ``--megascale_port`` to ``MEGASCALE_PORT``.
- "Give the coordinator address a port, e.g. <MASTER_ADDR>:8080, since libtpu otherwise appends each
  process's own MEGASCALE_PORT": a coordinator without a port is refused, since the processes of a
  job would not agree on where it listens. Where no coordinator is given at all, node 0 (slice 0's
  worker 0, the master) is it, at ``MEGASCALE_PORT`` where given, else :data:`DEFAULT_PORT`, the port
  of torch_tpu's message.
- Every process must get the same settings: torch_tpu raises "Check that every task gets the same
  MegaScale settings" when only some ranks report a ``slice_index``, and without the client every
  slice numbers its devices from zero ("Duplicate pjrt device ids"). Only the slice id differs, by slice.
- ``SKIP_MEGASCALE_PJRT_CLIENT`` must not be set at launch ("do not set it at launch, TorchTPU sets it
  itself after creating its client"); set, no slice reports its index.
- A slice's own hosts count its workers from 0 (GKE's ``TPU_WORKER_ID``, a TPU VM's
  ``agent-worker-number``): across the job, node rank = slice id × hosts per slice + worker number
  (:func:`node_rank`), so every slice has as many hosts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from xlarun.exceptions import PlanError
from xlarun.host.ports import host_port
from xlarun.structs import Struct

NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
PORT = "MEGASCALE_PORT"
SKIP_CLIENT = "SKIP_MEGASCALE_PJRT_CLIENT"
NAMES = (NUM_SLICES, SLICE_ID, COORDINATOR, PORT)
"""The variables that carry a job's MegaScale settings, as GKE, KubeRay and a TPU VM's ``tpu-env`` give them."""

DEFAULT_PORT = 8080
"""The coordinator's port where nothing gives one: torch_tpu's message ("e.g. <MASTER_ADDR>:8080")."""

MAX_SLICES = 65536
"""The most slices a job is planned with: more than the chips of the largest multislice run told of
(50,000+ TPU v5e chips, Google Cloud, November 2023), each of whose slices had many. A count past it is a
typo or a wrong variable, and planning with it would give node ranks no job has."""

_HOST_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9_])?"
"""A host name or an IPv4 address, as a coordinator names its host: letters, digits, ``.``, ``-``, ``_``."""


class MegaScale(Struct, frozen=True):
    """A multislice job's settings: ``slices`` above 1, this host's ``slice_id`` below it, the
    ``coordinator`` as given (``host:port``) or None, and ``port`` (``MEGASCALE_PORT``) as given or None."""

    slices: int
    slice_id: int
    coordinator: str | None = None
    port: int | None = None

    @property
    def coordinator_host(self) -> str | None:
        """The coordinator's host, which is node 0's: slice 0's worker 0."""
        return None if self.coordinator is None else split_port(self.coordinator)[0]

    def coordinator_address(self, master_addr: str) -> str:
        """The coordinator as given, else node 0's address with ``MEGASCALE_PORT`` or :data:`DEFAULT_PORT`."""
        if self.coordinator is not None:
            return self.coordinator
        return host_port(master_addr, DEFAULT_PORT if self.port is None else self.port)

    def variables(self, master_addr: str) -> dict[str, str]:
        """What every worker of this slice gets; only the slice id differs between slices."""
        variables = {
            COORDINATOR: self.coordinator_address(master_addr),
            NUM_SLICES: str(self.slices),
            SLICE_ID: str(self.slice_id),
        }
        if self.port is not None:
            variables[PORT] = str(self.port)
        return variables


def node_rank(settings: MegaScale, worker: int, hosts_per_slice: int) -> int:
    """A host's node rank across the job: slice id × hosts per slice + its number within its slice."""
    return settings.slice_id * hosts_per_slice + worker


def split_port(address: str) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) as host and port; the port None where there is none (``host``, ``fe80::1``)."""
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit() or not host or (":" in host and not host.startswith("[")):
        return address, None
    return host.strip("[]"), int(port)


def read_megascale(environ: Mapping[str, str]) -> MegaScale | None:
    """The job's MegaScale settings in ``environ``; None for one slice (``MEGASCALE_NUM_SLICES`` unset or 1).

    Refuses (:class:`PlanError`) a slice count or slice id that is not a whole number, a slice count of 0
    or over :data:`MAX_SLICES`, a slice id outside ``0..slices-1`` (the count unset is one slice, so a slice
    id above 0 without it would take slice 0's node ranks), a coordinator that names no host or has no
    port, a ``MEGASCALE_PORT`` that is not a TCP port, and ``SKIP_MEGASCALE_PJRT_CLIENT`` set.
    """
    given_slices = _whole_number(environ, NUM_SLICES)
    if given_slices == 0:
        raise PlanError(f"{NUM_SLICES}=0 is no slice count: a job has one slice or more")
    if given_slices is not None and given_slices > MAX_SLICES:
        raise PlanError(
            f"{NUM_SLICES}={given_slices} is more slices than any job has (at most {MAX_SLICES}): "
            "give every host the job's number of slices"
        )
    slices = 1 if given_slices is None else given_slices
    slice_id = _whole_number(environ, SLICE_ID)
    if given_slices is None and slice_id:
        raise PlanError(
            f"{SLICE_ID}={slice_id} is set without {NUM_SLICES}, so this host's slice would take slice "
            f"0's node ranks: give every host of the job {NUM_SLICES}, the number of slices"
        )
    if slice_id is not None and slice_id >= slices:
        raise PlanError(
            f"{SLICE_ID}={slice_id} is outside the job's slices: it numbers this host's slice among "
            f"the {NUM_SLICES}={slices} slices of the job, 0 to {slices - 1}"
        )
    if slices == 1:
        return None
    if environ.get(SKIP_CLIENT):
        raise PlanError(
            f"{SKIP_CLIENT} is set, so libtpu would install no MegaScale client and no slice of "
            f"the {slices} would report its index (TorchTPU sets it itself after creating its "
            f"client): unset it"
        )
    if slice_id is None:
        raise PlanError(
            f"{SLICE_ID} is unset: it numbers this host's slice among the {NUM_SLICES}={slices} "
            f"slices of the job, 0 to {slices - 1}"
        )
    port = _whole_number(environ, PORT)
    if port is not None and not 1 <= port <= 65535:
        raise PlanError(f"{PORT}={port} is not a TCP port (1-65535)")
    coordinator = environ.get(COORDINATOR, "").strip() or None
    if coordinator is not None:
        host, coordinator_port = split_port(coordinator)
        if not _names_a_host(host):
            raise PlanError(
                f"{COORDINATOR}={coordinator!r} names no host: give the coordinator's host name or "
                f"address and its port, e.g. {host_port('coordinator', DEFAULT_PORT)}"
            )
        if coordinator_port is not None and not 1 <= coordinator_port <= 65535:
            raise PlanError(f"{COORDINATOR}={coordinator!r} has port {coordinator_port}, not a TCP port (1-65535)")
        if coordinator_port is None:
            raise PlanError(
                f"{COORDINATOR}={coordinator!r} has no port, so each process would append its own "
                f"MEGASCALE_PORT and the slices would not agree where the coordinator listens: "
                f"give it one, e.g. {host_port(host, DEFAULT_PORT)}"
            )
    return MegaScale(slices=slices, slice_id=slice_id, coordinator=coordinator, port=port)


def _names_a_host(host: str) -> bool:
    """Whether ``host`` is a host name or an IP address (IPv6 without its brackets)."""
    if re.fullmatch(_HOST_NAME, host):
        return True
    import ipaddress  # only for what is no host name: an IPv6 address

    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _whole_number(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text.lstrip("0")) > 18:
        raise PlanError(f"{name}={environ[name]!r} is not a whole number")
    return int(text)
