"""A node's place in a multi-node job, read from the variables its cluster set.

Each node runs one xlarun. The scheduler that started it already knows how many
nodes the job has, which one this is and where node 0 lives; detect_cluster reads
that from the environment so that ``srun xlarun`` with cluster ``slurm`` needs no
other flag. Every reader here but ``tpu-vm``'s is a pure function of the mapping it is
given: no process is started (no ``scontrol``) and ``os.environ`` is never read directly,
so the caller decides which environment counts. ``tpu-vm`` asks the VM's metadata server
(:mod:`xlarun.host.metadata`, located by the mapping's ``GCE_METADATA_HOST``).

Kinds, and what each reads:

``slurm``
    Inside a job step (``srun``): ``SLURM_STEP_NUM_NODES`` (else ``SLURM_NNODES``),
    ``SLURM_NODEID`` (the node's index within the step) and the first host of
    ``SLURM_STEP_NODELIST`` as node 0. Outside a step (a batch script or an
    ``salloc`` shell) only a one-node job makes sense: ``SLURM_JOB_NUM_NODES`` (else
    ``SLURM_NNODES``) must be 1 and node 0 is the first host of ``SLURM_JOB_NODELIST``
    (else ``SLURM_NODELIST``). The run id is ``<SLURM_JOB_ID>.<SLURM_STEP_ID>``, the
    name Slurm itself gives a step. The port comes from slurm_master_port. A step that
    runs more than one task on a node (``SLURM_STEP_TASKS_PER_NODE``) is refused:
    those tasks would all claim the same node rank.
``k8s``
    A Kubeflow PyTorchJob with a Master replica. The training operator sets
    ``MASTER_ADDR``/``MASTER_PORT`` on every pod, and ``RANK``/``WORLD_SIZE``, which
    count *pods* (the master is 0, worker i is i+1) in operators without
    ``nprocPerNode``; since ``nprocPerNode`` it multiplies ``WORLD_SIZE`` by the
    processes per pod and adds ``PET_NNODES``, ``PET_NODE_RANK``,
    ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``. The ``PET_``
    values are preferred. ``RANK``, the pod's index in either operator, stands in for
    ``PET_NODE_RANK``; ``WORLD_SIZE`` stands in for ``PET_NNODES`` only when no
    ``PET_NPROC_PER_NODE`` says that it counts processes. On the master pod the
    operator sets the master address to ``localhost``, where a store would be
    unreachable from the workers; node 0 then names itself by ``HOSTNAME`` (its pod
    name, the name of the master's headless Service). An elastic job (``PET_NNODES``
    of the form ``MIN:MAX``) is configured by its ``PET_RDZV_*`` variables instead.
``gke-tpu``
    ``TPU_WORKER_ID`` (node rank) and ``TPU_WORKER_HOSTNAMES`` (comma list: its length
    is the node count, its first entry node 0). A multislice job (``MEGASCALE_NUM_SLICES`` above 1)
    numbers workers within each slice: its ``MEGASCALE_SLICE_ID`` places the slice, so the job has
    slices × hosts per slice nodes, the node rank is slice id × hosts per slice + ``TPU_WORKER_ID``, and
    node 0 is slice 0's worker 0, the host of ``MEGASCALE_COORDINATOR_ADDRESS`` (without one, only slice 0
    knows it: the other slices need the master address). The workers get the MegaScale settings
    (:mod:`xlarun.runtimes.megascale`); the run id is the same on every slice.
``tpu-vm``
    A Cloud TPU VM's metadata server: ``agent-worker-number`` (node rank),
    ``worker-network-endpoints`` (``<name>:<uid>:<ip>`` per host in worker order: the node
    count, and node 0's address) and ``tpu-env`` (``ACCELERATOR_TYPE``, ``HOST_BOUNDS`` and
    ``CHIPS_PER_HOST_BOUNDS``, else torch_xla's ``TPU_PROCESS_BOUNDS`` and
    ``TPU_CHIPS_PER_PROCESS_BOUNDS``; ``TOPOLOGY``). These also plan the device, as GKE's variables
    would (:attr:`ClusterSettings.device_environ`: ``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``,
    ``TPU_ACCELERATOR_TYPE``, ``TPU_HOST_BOUNDS``, ``TPU_CHIPS_PER_HOST_BOUNDS``, ``TPU_TOPOLOGY``), for
    torch_xla and TorchTPU alike; the workers do not get them. A multislice job's ``tpu-env`` (queued
    resources of several slices) also carries ``MEGASCALE_*`` keys: they place the host as under
    ``gke-tpu``, and the workers get them. Never picked by ``auto``, which reads no network.
``mpi``
    Open MPI with one xlarun per node (``mpirun --npernode 1``):
    ``OMPI_COMM_WORLD_SIZE`` nodes, ``OMPI_COMM_WORLD_RANK`` as node rank, the job's
    ``PMIX_NAMESPACE`` (else ``OMPI_MCA_ess_base_jobid``) as run id. Open MPI tells a
    process nothing about where rank 0 runs: the only address in its environment is
    mpirun's own (``OMPI_MCA_orte_hnp_uri``), and mpirun may run on a host that holds
    no rank. So master_addr stays None and the launcher must be given
    the master address; resolve_master_addr says so.

``auto`` picks the innermost launcher whose marker variable is present, in the
order mpi (``OMPI_COMM_WORLD_SIZE``), slurm (``SLURM_JOB_ID``), gke-tpu
(``TPU_WORKER_HOSTNAMES``), k8s (``KUBERNETES_SERVICE_HOST`` with ``PET_NODE_RANK``
or ``MASTER_ADDR``, and not elastic): mpirun may run inside a Slurm allocation,
and TPU pods are Kubernetes pods too. Once a kind is picked its variables must be
complete, as with an explicit kind.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, overload

from xlarun.exceptions import UsageError
from xlarun.flags import flag
from xlarun.host.metadata import MetadataError, instance_attributes
from xlarun.planning.hostlist import MAX_NUMBER_DIGITS, first_host, too_long
from xlarun.runtimes import megascale
from xlarun.structs import Struct, field

# Slurm master ports: 15000-24999, in blocks of 4 so that ports a launcher derives
# as MASTER_PORT+1..+3 stay inside the step's own block. The range stays clear of
# torchrun's defaults (29400, 29500), of the ports XLA runtimes pick themselves
# (8476+, 8547, 62182) and of Linux's ephemeral range (32768 and up).
SLURM_PORT_BASE = 15000
SLURM_PORT_BLOCK = 4
SLURM_PORT_BLOCKS = 2500
# A prime stride puts a job's later steps far from the blocks of neighbouring job ids.
_SLURM_STEP_STRIDE = 97

_DIGITS = r"[0-9]+"
_TPU_ENV_VALUE = r"[A-Za-z0-9][A-Za-z0-9,._-]{0,63}"
"""A ``tpu-env`` value the plan takes: an accelerator type (``v5litepod-16``), bounds (``1,1,2``), a topology."""
_TPU_ENV_ADDRESS = r"[A-Za-z0-9\[][A-Za-z0-9.:_\[\]-]{0,252}"
"""``tpu-env``'s MegaScale coordinator: a host name or address and its port."""
_TASKS_PER_NODE_ITEM = r"([0-9]+)(?:\(x[0-9]+\))?"
_LOOPBACK_NAMES = ("localhost", "::1")


class ClusterSettings(Struct, frozen=True):
    """What the cluster says about this node's place in the job.

    ``master_addr`` is node 0's address as every node reaches it; None (only for
    ``mpi``) means the cluster cannot say and the master address must be given (see
    resolve_master_addr). ``master_port`` None keeps the launcher's default or
    explicit port. ``run_id`` is an id every node of the job shares, or None.
    ``nproc_per_node`` is set only when the cluster states a number of workers per
    node (Kubeflow's ``nprocPerNode``). Explicit flags win over every field.
    ``device_environ`` is what the cluster says of the device, as the variables that would
    say it (``tpu-vm``: the slice's shape, worker number and hosts); the launcher plans with
    them where its environment does not set them, and the workers do not get them.
    ``read_from`` names, by field, where each field that is set was read: a variable
    (``SLURM_STEP_NUM_NODES``), a metadata attribute (``tpu-vm``), or the variables a field is
    computed from (Slurm's port and run id). It is not compared: two readings that agree on
    the node's place are the same settings.
    """

    kind: str
    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None
    run_id: str | None
    nproc_per_node: int | None = None
    device_environ: Mapping[str, str] = field(default_factory=dict)
    read_from: Mapping[str, str] = field(default_factory=dict, compare=False)

    def resolve_master_addr(self, explicit_master_addr: str | None) -> str:
        """Node 0's address: the one given on the command line, else the cluster's.

        Raises UsageError when neither names one (an Open MPI launch given no master address).
        """
        if explicit_master_addr:
            return explicit_master_addr
        if self.master_addr is None:
            raise UsageError(
                f"{flag('cluster')} {self.kind} cannot tell where node 0 runs; pass {flag('master_addr')} with"
                f" the address of the host of rank 0 (the same on every node)"
            )
        return self.master_addr


SchedulerKind = Literal["slurm", "k8s", "gke-tpu", "tpu-vm", "mpi"]
"""The kinds that name one scheduler (:data:`xlarun.cli.options.CLUSTER_KINDS` less ``none`` and ``auto``):
for them :func:`detect_cluster` gives settings or refuses, never None."""


@overload
def detect_cluster(kind: SchedulerKind, environ: Mapping[str, str]) -> ClusterSettings: ...


@overload
def detect_cluster(kind: str, environ: Mapping[str, str]) -> ClusterSettings | None: ...


def detect_cluster(kind: str, environ: Mapping[str, str]) -> ClusterSettings | None:
    """This node's settings from the cluster ``kind`` (one of :data:`xlarun.cli.options.CLUSTER_KINDS`) and
    ``environ``.

    ``none`` gives None; ``auto`` gives the settings of the first kind whose marker
    variable is present, or None. Raises UsageError when the
    chosen kind's variables are missing (all of them are named) or malformed.
    """
    if kind == "none":
        return None
    if kind == "auto":
        for candidate in _AUTO_ORDER:
            if _MARKERS[candidate](environ):
                return _READERS[candidate](environ)
        return None
    return _READERS[kind](environ)


def slurm_master_port(job_id: int, step_id: int) -> int:
    """The master port every node of a Slurm job step computes alike, without talking.

    ``15000 + 4 * ((job_id + 97 * step_id) % 2500)``: a port in 15000-24999 that opens
    a block of 4 owned by the step. Steps 0 of jobs whose ids differ by less than
    2500 never share a block, nor do the first 2500 steps of one job, so jobs that
    share a node do not collide on one port as they do on torchrun's 29500.
    """
    block = (job_id + _SLURM_STEP_STRIDE * step_id) % SLURM_PORT_BLOCKS
    return SLURM_PORT_BASE + SLURM_PORT_BLOCK * block


_SLURM_STEP_ID_NAMES = ("SLURM_STEP_ID", "SLURM_STEPID")


def _read_slurm(environ: Mapping[str, str]) -> ClusterSettings:
    in_step = _present(environ, "SLURM_STEP_NODELIST")
    if in_step:
        node_count_names: Sequence[str] = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
        nodelist_names: Sequence[str] = ("SLURM_STEP_NODELIST",)
        required = [("SLURM_JOB_ID", "SLURM_JOBID"), node_count_names, nodelist_names, ("SLURM_NODEID",)]
    else:
        node_count_names = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        nodelist_names = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
        required = [("SLURM_JOB_ID", "SLURM_JOBID"), node_count_names, nodelist_names]
    _require(environ, "slurm", required, "run xlarun with srun inside a Slurm job")

    job_id_name, job_id = _whole_number(environ, "slurm", ("SLURM_JOB_ID", "SLURM_JOBID"))
    nnodes_name, nnodes = _node_count(environ, "slurm", node_count_names)
    ids = [job_id_name]  # the variables the run id and the master port are computed from
    if not in_step:
        if nnodes > 1:
            raise UsageError(
                f"{flag('cluster')} slurm: this job has {nnodes} nodes but xlarun runs outside a job step,"
                f" on one of them; start one per node with `srun --ntasks-per-node=1 xlarun ...`"
                f" (or use {flag('cluster')} none for a one-node run)"
            )
        node_rank_name, node_rank = nnodes_name, 0  # the job's only node
        step_id = None
    else:
        node_rank_name, node_rank = _whole_number(environ, "slurm", ("SLURM_NODEID",))
        step_id = _optional_int(environ, "slurm", _SLURM_STEP_ID_NAMES)
        if step_id is not None:
            ids.append(_set_name(environ, _SLURM_STEP_ID_NAMES))
        tasks = environ.get("SLURM_STEP_TASKS_PER_NODE", "")
        if tasks and _most_tasks_on_a_node(tasks) > 1:
            raise UsageError(
                f"{flag('cluster')} slurm: the step runs several tasks on a node (SLURM_STEP_TASKS_PER_NODE={tasks});"
                f" xlarun must run once per node: use `srun --ntasks-per-node=1`"
            )
    _check_node_rank(node_rank, nnodes, "slurm", "SLURM_NODEID")

    nodelist_name = _set_name(environ, nodelist_names)
    try:
        master_addr = first_host(environ[nodelist_name])
    except UsageError as error:
        raise UsageError(f"{flag('cluster')} slurm: {nodelist_name}: {error}") from None
    run_id = str(job_id) if step_id is None else f"{job_id}.{step_id}"
    return ClusterSettings(
        kind="slurm",
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=slurm_master_port(job_id, step_id or 0),
        run_id=run_id,
        read_from={
            "nnodes": nnodes_name,
            "node_rank": node_rank_name,
            "master_addr": nodelist_name,
            "master_port": ", ".join(ids),
            "run_id": ", ".join(ids),
        },
    )


def _read_k8s(environ: Mapping[str, str]) -> ClusterSettings:
    if _is_elastic_pytorchjob(environ):
        raise UsageError(
            f"{flag('cluster')} k8s: PET_NNODES={environ['PET_NNODES']} is an elastic PyTorchJob, which its"
            f" PET_RDZV_* variables configure; run xlarun without {flag('cluster')}"
        )
    if _present(environ, "PET_NPROC_PER_NODE"):
        node_count_names: Sequence[str] = ("PET_NNODES",)  # WORLD_SIZE counts processes here
    else:
        node_count_names = ("PET_NNODES", "WORLD_SIZE")
    required = [node_count_names, ("PET_NODE_RANK", "RANK"), ("PET_MASTER_ADDR", "MASTER_ADDR")]
    _require(environ, "k8s", required, "these come from a Kubeflow PyTorchJob with a Master replica")

    nnodes_name = _set_name(environ, node_count_names)
    nnodes_text = environ[nnodes_name]
    if nnodes_name == "PET_NNODES" and ":" in nnodes_text:
        nnodes_text = nnodes_text.split(":", 1)[0]  # a MIN:MAX with MIN == MAX; elastic was refused above
    nnodes = _parse_count(nnodes_text, nnodes_name, "k8s")
    rank_name, node_rank = _whole_number(environ, "k8s", ("PET_NODE_RANK", "RANK"))
    _check_node_rank(node_rank, nnodes, "k8s", rank_name)

    master_addr_name = _set_name(environ, ("PET_MASTER_ADDR", "MASTER_ADDR"))
    if node_rank == 0 and nnodes > 1 and _is_loopback(environ[master_addr_name]) and _present(environ, "HOSTNAME"):
        master_addr_name = "HOSTNAME"
    master_addr = environ[master_addr_name]
    if not master_addr.strip():
        raise UsageError(f"{flag('cluster')} k8s: {master_addr_name}={master_addr!r} names no host")
    port_names = ("PET_MASTER_PORT", "MASTER_PORT")
    master_port = _optional_port(environ, "k8s", port_names)
    nproc_text = environ.get("PET_NPROC_PER_NODE", "")
    # "auto", "gpu" or "cpu" are torchrun's own values: left to the option's own rules.
    nproc_per_node = (
        _parse_count(nproc_text, "PET_NPROC_PER_NODE", "k8s") if re.fullmatch(_DIGITS, nproc_text) else None
    )
    read_from = {"nnodes": nnodes_name, "node_rank": rank_name, "master_addr": master_addr_name}
    if master_port is not None:
        read_from["master_port"] = _set_name(environ, port_names)
    if nproc_per_node is not None:
        read_from["nproc_per_node"] = "PET_NPROC_PER_NODE"
    return ClusterSettings(
        kind="k8s",
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        run_id=None,
        nproc_per_node=nproc_per_node,
        read_from=read_from,
    )


def _read_gke_tpu(environ: Mapping[str, str]) -> ClusterSettings:
    _require(
        environ,
        "gke-tpu",
        [("TPU_WORKER_ID",), ("TPU_WORKER_HOSTNAMES",)],
        "these come from a multi-host TPU slice on GKE",
    )
    hostnames = environ["TPU_WORKER_HOSTNAMES"]
    hosts = [host.strip() for host in hostnames.split(",")]
    if not all(hosts):
        raise UsageError(
            f"{flag('cluster')} gke-tpu: TPU_WORKER_HOSTNAMES={hostnames!r} has an empty entry;"
            f" it must be a comma-separated list of host names"
        )
    _, worker = _whole_number(environ, "gke-tpu", ("TPU_WORKER_ID",))
    _check_node_rank(worker, len(hosts), "gke-tpu", "TPU_WORKER_ID")
    return _slice_settings(
        "gke-tpu",
        hosts,
        worker,
        environ,
        {"nnodes": "TPU_WORKER_HOSTNAMES", "node_rank": "TPU_WORKER_ID", "master_addr": "TPU_WORKER_HOSTNAMES"},
    )


def _slice_settings(
    kind: str,
    hosts: Sequence[str],
    worker: int,
    megascale_source: Mapping[str, str],
    read_from: Mapping[str, str],
    device_environ: Mapping[str, str] | None = None,
) -> ClusterSettings:
    """A TPU host's place: worker ``worker`` of its slice's ``hosts``, and of the job's slices where
    ``megascale_source`` holds a multislice job's MegaScale settings (:mod:`xlarun.runtimes.megascale`).

    Across slices node 0 is slice 0's worker 0, which the coordinator's host names; without a
    coordinator only slice 0 knows it (its first host), the other slices must be given it.
    """
    try:
        settings = megascale.read_megascale(megascale_source)
    except UsageError as error:
        raise UsageError(f"{flag('cluster')} {kind}: {error}") from None
    if settings is None:
        return ClusterSettings(
            kind=kind,
            nnodes=len(hosts),
            node_rank=worker,
            master_addr=hosts[0],
            master_port=None,
            run_id=None,
            device_environ=dict(device_environ or {}),
            read_from=read_from,
        )
    bounds = megascale_source.get("TPU_HOST_BOUNDS", "")
    shape_hosts = (
        math.prod(map(int, bounds.split(","))) if re.fullmatch(r"[0-9]{1,4}(,[0-9]{1,4}){2}", bounds) else None
    )
    if shape_hosts is not None and shape_hosts != len(hosts):
        # Every slice of a job has one shape: a host count off its own means the slices would not agree.
        raise UsageError(
            f"{flag('cluster')} {kind}: slice {settings.slice_id} lists {len(hosts)} hosts but its "
            f"host bounds {bounds} make {shape_hosts}: every slice of a multislice job must have as "
            "many hosts, node rank = slice id x hosts per slice + worker id"
        )
    master_addr = settings.coordinator_host or (hosts[0] if settings.slice_id == 0 else None)
    read_from = {
        "nnodes": f"{megascale.NUM_SLICES}, {read_from['nnodes']}",
        "node_rank": f"{megascale.NUM_SLICES}, {megascale.SLICE_ID}, {read_from['node_rank']}",
        "master_addr": megascale.COORDINATOR if settings.coordinator else read_from["master_addr"],
    }
    return ClusterSettings(
        kind=kind,
        nnodes=settings.slices * len(hosts),
        node_rank=megascale.node_rank(settings, worker, len(hosts)),
        master_addr=master_addr,
        master_port=None,
        run_id=None,
        device_environ=dict(device_environ or {}),
        read_from=read_from,
    )


TPU_ENV_VARIABLES = {
    "ACCELERATOR_TYPE": "TPU_ACCELERATOR_TYPE",
    "HOST_BOUNDS": "TPU_HOST_BOUNDS",
    "TPU_PROCESS_BOUNDS": "TPU_HOST_BOUNDS",
    "CHIPS_PER_HOST_BOUNDS": "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS": "TPU_CHIPS_PER_HOST_BOUNDS",
    "TOPOLOGY": "TPU_TOPOLOGY",
}
"""``tpu-env`` keys and the variables that say the same on GKE, the first key present winning (for v4
and later ``TPU_PROCESS_BOUNDS`` is the host grid and ``TPU_CHIPS_PER_PROCESS_BOUNDS`` a host's chips,
as torch_xla reads them)."""


TPU_VM_ATTRIBUTES = ("agent-worker-number", "worker-network-endpoints", "tpu-env")


def _read_tpu_vm(environ: Mapping[str, str]) -> ClusterSettings:
    from xlarun.rendezvous import shown

    try:
        answers = instance_attributes(TPU_VM_ATTRIBUTES, environ)
    except MetadataError as error:
        raise UsageError(
            f"{flag('cluster')} tpu-vm: {error}; run on a TPU VM (or point GCE_METADATA_HOST at its metadata server)"
        ) from None
    worker_text, endpoints_text, tpu_env_text = (answers[key].strip() for key in TPU_VM_ATTRIBUTES)
    endpoints = [endpoint.strip().split(":") for endpoint in endpoints_text.split(",")]
    if not all(len(parts) == 3 and _is_ip_address(parts[2]) for parts in endpoints):
        raise UsageError(
            f"{flag('cluster')} tpu-vm: worker-network-endpoints='{shown(endpoints_text)}' is not a list "
            "of <name>:<uid>:<ip> entries"
        )
    hosts = [parts[2] for parts in endpoints]
    if not re.fullmatch(_DIGITS, worker_text) or len(worker_text.lstrip("0")) > len(str(len(hosts))):
        raise UsageError(
            f"{flag('cluster')} tpu-vm: agent-worker-number='{shown(worker_text, 40)}' is not a whole "
            f"number below the node count {len(hosts)}"
        )
    node_rank = int(worker_text)
    _check_node_rank(node_rank, len(hosts), "tpu-vm", "agent-worker-number")
    facts = {"TPU_WORKER_ID": str(node_rank), "TPU_WORKER_HOSTNAMES": ",".join(hosts)}
    for line in tpu_env_text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        variable = key if key in megascale.NAMES else TPU_ENV_VARIABLES.get(key)
        pattern = _TPU_ENV_ADDRESS if key == megascale.COORDINATOR else _TPU_ENV_VALUE
        if variable is None or (key in megascale.NAMES and not value):  # an empty MegaScale key is an unset one
            continue
        if not re.fullmatch(pattern, value):
            raise UsageError(
                f"{flag('cluster')} tpu-vm: tpu-env's {key}='{shown(value, 40)}' is not "
                + (
                    "an address"
                    if key == megascale.COORDINATOR
                    else "a slice's shape (letters, digits and , . - _ such as v4-16 or 1,1,2)"
                )
            )
        facts.setdefault(variable, value)
    return _slice_settings(
        "tpu-vm",
        hosts,
        node_rank,
        facts,
        {
            "nnodes": "worker-network-endpoints",
            "node_rank": "agent-worker-number",
            "master_addr": "worker-network-endpoints",
        },
        device_environ=facts,
    )


def _is_ip_address(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _read_mpi(environ: Mapping[str, str]) -> ClusterSettings:
    _require(
        environ,
        "mpi",
        [("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_RANK",)],
        "run one xlarun per node with `mpirun --npernode 1 xlarun ...`",
    )
    local_size = _optional_int(environ, "mpi", ("OMPI_COMM_WORLD_LOCAL_SIZE",))
    if local_size is not None and local_size > 1:
        raise UsageError(
            f"{flag('cluster')} mpi: mpirun started {local_size} xlarun processes on this node; xlarun must run"
            f" once per node: use `mpirun --npernode 1` (or --map-by ppr:1:node)"
        )
    nnodes_name, nnodes = _node_count(environ, "mpi", ("OMPI_COMM_WORLD_SIZE",))
    node_rank_name, node_rank = _whole_number(environ, "mpi", ("OMPI_COMM_WORLD_RANK",))
    _check_node_rank(node_rank, nnodes, "mpi", node_rank_name)
    read_from = {"nnodes": nnodes_name, "node_rank": node_rank_name}
    run_id_name = _first_present(environ, ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"))
    if run_id_name is not None:
        read_from["run_id"] = run_id_name
    return ClusterSettings(
        kind="mpi",
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=None,
        master_port=None,
        run_id=environ[run_id_name] if run_id_name else None,
        read_from=read_from,
    )


def _is_elastic_pytorchjob(environ: Mapping[str, str]) -> bool:
    low, separator, high = environ.get("PET_NNODES", "").partition(":")
    return bool(separator) and low != high


_READERS: dict[str, Callable[[Mapping[str, str]], ClusterSettings]] = {
    "slurm": _read_slurm,
    "k8s": _read_k8s,
    "gke-tpu": _read_gke_tpu,
    "tpu-vm": _read_tpu_vm,
    "mpi": _read_mpi,
}

_AUTO_ORDER = ("mpi", "slurm", "gke-tpu", "k8s")

_MARKERS: dict[str, Callable[[Mapping[str, str]], bool]] = {
    "mpi": lambda environ: _present(environ, "OMPI_COMM_WORLD_SIZE"),
    "slurm": lambda environ: _present(environ, "SLURM_JOB_ID") or _present(environ, "SLURM_JOBID"),
    "gke-tpu": lambda environ: _present(environ, "TPU_WORKER_HOSTNAMES"),
    # Users export MASTER_ADDR by hand for manual runs: only a pod counts as a PyTorchJob.
    "k8s": lambda environ: (
        _present(environ, "KUBERNETES_SERVICE_HOST")
        and (_present(environ, "PET_NODE_RANK") or _present(environ, "MASTER_ADDR"))
        and not _is_elastic_pytorchjob(environ)
    ),
}


def _present(environ: Mapping[str, str], name: str) -> bool:
    return bool(environ.get(name))


def _first_present(environ: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((name for name in names if _present(environ, name)), None)


def _set_name(environ: Mapping[str, str], names: Sequence[str]) -> str:
    """The first set variable of ``names``, which the caller's :func:`_require` made sure of."""
    name = _first_present(environ, names)
    if name is None:
        raise KeyError(names[0])
    return name


def _describe(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} (or {' or '.join(names[1:])})"


def _require(environ: Mapping[str, str], kind: str, required: Sequence[Sequence[str]], hint: str) -> None:
    """Raise one UsageError naming every required variable (with its alternatives) that is unset."""
    missing = [_describe(names) for names in required if _first_present(environ, names) is None]
    if missing:
        raise UsageError(f"{flag('cluster')} {kind}: missing {', '.join(missing)}; {hint}")


def _parse_count(text: str, name: str, kind: str, least: int = 1) -> int:
    """``text`` read as a whole number ``least`` (0 or 1) or more, of at most
    :data:`~xlarun.planning.hostlist.MAX_NUMBER_DIGITS` digits; a UsageError naming ``name`` otherwise."""
    what = "a positive whole number" if least else "a whole number 0 or more"
    if re.fullmatch(_DIGITS, text) and too_long(text):
        raise UsageError(
            f"{flag('cluster')} {kind}: {name} is a number of {len(text)} digits, not {what} of at "
            f"most {MAX_NUMBER_DIGITS} digits as a scheduler gives"
        )
    if not re.fullmatch(_DIGITS, text) or int(text) < least:
        raise UsageError(f"{flag('cluster')} {kind}: {name}={text!r} is not {what}")
    return int(text)


def _node_count(environ: Mapping[str, str], kind: str, names: Sequence[str]) -> tuple[str, int]:
    """The first set variable of ``names`` and its value, a whole number 1 or more."""
    name = _set_name(environ, names)
    return name, _parse_count(environ[name], name, kind)


def _whole_number(environ: Mapping[str, str], kind: str, names: Sequence[str]) -> tuple[str, int]:
    """The first set variable of ``names`` and its value, a whole number 0 or more."""
    name = _set_name(environ, names)
    return name, _parse_count(environ[name], name, kind, least=0)


def _optional_int(environ: Mapping[str, str], kind: str, names: Sequence[str]) -> int | None:
    if _first_present(environ, names) is None:
        return None
    return _whole_number(environ, kind, names)[1]


def _optional_port(environ: Mapping[str, str], kind: str, names: Sequence[str]) -> int | None:
    port = _optional_int(environ, kind, names)
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(
            f"{flag('cluster')} {kind}: {_first_present(environ, names)}={port} is not a TCP port (1-65535)"
        )
    return port


def _check_node_rank(node_rank: int, nnodes: int, kind: str, name: str) -> None:
    if node_rank >= nnodes:
        raise UsageError(f"{flag('cluster')} {kind}: {name}={node_rank} is not below the node count {nnodes}")


def _most_tasks_on_a_node(tasks_per_node: str) -> int:
    """The largest count in Slurm's compressed tasks-per-node form, e.g. ``2(x3),1``."""
    counts = []
    for item in tasks_per_node.split(","):
        match = re.fullmatch(_TASKS_PER_NODE_ITEM, item)
        if match is None or too_long(match.group(1)):
            raise UsageError(
                f"{flag('cluster')} slurm: SLURM_STEP_TASKS_PER_NODE={tasks_per_node!r} is not"
                f" Slurm's counts form (e.g. 1(x4) or 2,1)"
            )
        counts.append(int(match.group(1)))
    return max(counts)


def _is_loopback(address: str) -> bool:
    return address in _LOOPBACK_NAMES or address.startswith("127.")
