"""Numbers out of bounds, launched for real: exit 2, one line naming where the value came from, nothing started.

Every number of seconds a flag, its variable or an ``--rdzv-conf`` key gives is finite, above 0
(0 where a flag allows it) and at most :data:`xlarun.durations.MAX_SECONDS`; a whole number too
long for Python's ``int()`` (over 4,300 digits) is refused as any other bad value, whether a flag,
a ``PET_*`` variable or a scheduler's variable gave it, and so is a count no host can run (more workers
than Linux has process ids, an ``xlarun --stacks`` PID past them). Each launch names ``marker.py`` as the
worker: the marker file it would create must not exist afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import free_port, launcher_frames, run_xlarun, worker

from xlarun.durations import MAX_SECONDS

OUT_OF_BOUNDS = ("99999999", "1e308", "inf", "nan", "-1", str(MAX_SECONDS + 1))
"""Seconds refused everywhere: past the bound, not finite, not a number, negative."""

# Each source of a number of seconds, with whether 0 is a value it takes (a grace of 0 is SIGKILL at once).
DURATION_FLAGS = {
    "--shutdown-timeout": True,
    "--kill-timeout": True,
    "--hang-timeout": False,
    "--monitor-interval": False,
}
DURATION_VARIABLES = {
    "PET_SHUTDOWN_TIMEOUT": "--shutdown-timeout",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "--shutdown-timeout",
    "XLARUN_HANG_TIMEOUT": "--hang-timeout",
    "PET_MONITOR_INTERVAL": "--monitor-interval",
}
C10D_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "read_timeout",
    "keep_alive_interval",
)
STATIC_KEYS = ("timeout", "join_timeout", "close_timeout", "heartbeat_timeout", "read_timeout")

HUGE = "1" * 5000
"""More digits than Python's int() takes (4,300)."""


def values(zero_allowed: bool) -> list[str]:
    return list(OUT_OF_BOUNDS) if zero_allowed else [*OUT_OF_BOUNDS, "0"]


def cases(sources: dict[str, bool]) -> list[tuple[str, str]]:
    return [(source, value) for source, zero_allowed in sources.items() for value in values(zero_allowed)]


def assert_refused(tmp_path: Path, *flags: object, env: dict[str, str] | None = None, names: str) -> None:
    marker = tmp_path / "marker"
    result = run_xlarun(*flags, worker("marker.py"), marker, env=env, timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("xlarun: error: "), result.stderr[-2000:]
    assert names in lines[0], lines[0][:2000]
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert not launcher_frames(result.stderr)
    assert not marker.exists(), "a worker ran"


@pytest.mark.parametrize("flag, value", cases(DURATION_FLAGS))
def test_a_flags_seconds_out_of_bounds_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    # --kill-timeout is the older name of --shutdown-timeout: refusals name the option by its newer one.
    named = "--shutdown-timeout" if flag == "--kill-timeout" else flag
    assert_refused(tmp_path, "--standalone", flag, value, names=f"{named}={value!r}")


@pytest.mark.parametrize(
    "variable, value", cases({name: DURATION_FLAGS[flag] for name, flag in DURATION_VARIABLES.items()})
)
def test_a_variables_seconds_out_of_bounds_are_refused(tmp_path: Path, variable: str, value: str) -> None:
    flag = DURATION_VARIABLES[variable]
    assert_refused(tmp_path, "--standalone", env={variable: value}, names=f"{flag} (from {variable})={value!r}")


@pytest.mark.parametrize("key, value", cases(dict.fromkeys(C10D_KEYS, False)))
def test_a_c10d_keys_seconds_out_of_bounds_are_refused(tmp_path: Path, key: str, value: str) -> None:
    c10d = ("--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    assert_refused(tmp_path, *c10d, "--rdzv-conf", f"{key}={value}", names=f"--rdzv-conf {key}={value!r}")


@pytest.mark.parametrize("value", ["read_timeout=inf", "join_timeout=99999999"])
def test_rdzv_conf_from_its_variable_is_refused_naming_the_variable(tmp_path: Path, value: str) -> None:
    c10d = ("--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    key, _, seconds = value.partition("=")
    assert_refused(
        tmp_path,
        *c10d,
        env={"PET_RDZV_CONF": value},
        names=f"--rdzv-conf (from PET_RDZV_CONF) {key}={seconds!r} is invalid",
    )


@pytest.mark.parametrize("key, value", cases(dict.fromkeys(STATIC_KEYS, False)))
def test_a_static_keys_seconds_out_of_bounds_are_refused(tmp_path: Path, key: str, value: str) -> None:
    # Node 0 of two, alone: the rendezvous would wait for node 1 up to the join timeout.
    static = ("--nnodes", "2", "--node-rank", "0", "--master-port", free_port())
    assert_refused(tmp_path, *static, "--rdzv-conf", f"{key}={value}", names=f"--rdzv-conf {key}={value!r}")


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--tee", f"{HUGE}:1"], "--tee="),
        (["--redirects", f"0:1,{HUGE}:3"], "--redirects="),
        (["--local-ranks-filter", HUGE], "--local-ranks-filter="),
        (["--nnodes", f"1:{HUGE}"], "--nnodes="),
        (["--nproc-per-node", HUGE], "--nproc-per-node="),
        (["--max-restarts", HUGE], "--max-restarts="),
        (["--node-rank", HUGE], "--node-rank="),
        (["--master-port", HUGE], "--master-port="),
        (["--coordinator-port", HUGE], "--coordinator-port="),
        (["--virtual-devices", HUGE], "--virtual-devices="),
        (["--rdzv-backend", "c10d", "--rdzv-conf", f"keep_alive_max_attempt={HUGE}"], "keep_alive_max_attempt="),
        (["--rdzv-backend", "c10d", "--rdzv-conf", f"join_timeout={HUGE}"], "join_timeout="),
    ],
    ids=lambda item: item[0] if isinstance(item, list) else "",
)
def test_a_flags_number_of_over_4300_digits_is_refused(tmp_path: Path, flags: list[str], names: str) -> None:
    assert_refused(tmp_path, *flags, names=names)


@pytest.mark.parametrize(
    "flags, env, names",
    [
        (
            ["--nproc-per-node", "99999999999999999999999"],
            {},
            "--nproc-per-node='99999999999999999999999' is invalid (over ",
        ),
        (
            [],
            {"PET_NPROC_PER_NODE": "4194305"},
            "--nproc-per-node (from PET_NPROC_PER_NODE)='4194305' is invalid (over ",
        ),
    ],
    ids=["flag", "variable"],
)
def test_more_workers_than_a_host_can_run_are_refused_before_any_is_planned(
    tmp_path: Path, flags: list[str], env: dict[str, str], names: str
) -> None:
    assert_refused(tmp_path, *flags, env=env, names=names)


@pytest.mark.parametrize(
    "variable",
    [
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_MAX_RESTARTS",
        "PET_NODE_RANK",
        "PET_MASTER_PORT",
        "PET_TEE",
        "PET_STANDALONE",
    ],
)
def test_a_pet_variables_number_of_over_4300_digits_is_refused(tmp_path: Path, variable: str) -> None:
    assert_refused(tmp_path, env={variable: HUGE}, names=f"(from {variable})")


SLURM_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
}
K8S_POD = {
    "PET_NNODES": "1",
    "PET_NODE_RANK": "0",
    "PET_MASTER_ADDR": "127.0.0.1",
    "PET_MASTER_PORT": "29500",
    "PET_NPROC_PER_NODE": "1",
}
MPI_RANK = {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
GKE_WORKER = {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "127.0.0.1", "MEGASCALE_NUM_SLICES": "1"}
SCHEDULERS = {"slurm": SLURM_STEP, "k8s": K8S_POD, "mpi": MPI_RANK, "gke-tpu": GKE_WORKER}
# (the scheduler, its variables changed: None unsets one, the variable the refusal names)
HUGE_SCHEDULER_VALUES: list[tuple[str, Mapping[str, str | None], str]] = [
    *(
        (kind, {variable: HUGE}, variable)
        for kind, environ in SCHEDULERS.items()
        for variable in environ
        if variable not in ("SLURM_STEP_NODELIST", "TPU_WORKER_HOSTNAMES", "PET_MASTER_ADDR")
    ),
    ("slurm", {"SLURM_STEP_NUM_NODES": None, "SLURM_NNODES": HUGE}, "SLURM_NNODES"),
    ("slurm", {"SLURM_STEP_TASKS_PER_NODE": f"{HUGE}(x2)"}, "SLURM_STEP_TASKS_PER_NODE"),
    ("slurm", {"SLURM_STEP_NODELIST": f"n[{HUGE}-{HUGE}]"}, "SLURM_STEP_NODELIST"),
    (
        "slurm",
        {
            "SLURM_STEP_NODELIST": None,
            "SLURM_STEP_NUM_NODES": None,
            "SLURM_NODEID": None,
            "SLURM_JOB_NUM_NODES": HUGE,
            "SLURM_JOB_NODELIST": "n1",
        },
        "SLURM_JOB_NUM_NODES",
    ),
]


@pytest.mark.parametrize(
    "kind, changes, variable",
    HUGE_SCHEDULER_VALUES,
    ids=[
        f"{kind}-{'-'.join(name for name, value in changes.items() if value)}"
        for kind, changes, _ in HUGE_SCHEDULER_VALUES
    ],
)
def test_a_schedulers_number_of_over_4300_digits_is_refused(
    tmp_path: Path, kind: str, changes: Mapping[str, str | None], variable: str
) -> None:
    env = {name: value for name, value in {**SCHEDULERS[kind], **changes}.items() if value is not None}
    assert_refused(tmp_path, "--cluster", kind, "--master-addr", "127.0.0.1", env=env, names=variable)


@pytest.mark.parametrize(
    "changes, names",
    [
        ({"MEGASCALE_NUM_SLICES": "0"}, "MEGASCALE_NUM_SLICES=0 is no slice count"),
        ({"MEGASCALE_NUM_SLICES": None, "MEGASCALE_SLICE_ID": "1"}, "MEGASCALE_SLICE_ID=1 is set without"),
        (
            {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1", "MEGASCALE_COORDINATOR_ADDRESS": "a b;c:8080"},
            "MEGASCALE_COORDINATOR_ADDRESS='a b;c:8080' names no host",
        ),
        ({"MEGASCALE_NUM_SLICES": "1000000000", "MEGASCALE_SLICE_ID": "999999999"}, "MEGASCALE_NUM_SLICES=1000000000"),
    ],
    ids=["no-slices", "slice-id-without-count", "coordinator-no-host", "a-billion-slices"],
)
def test_multislice_settings_no_job_has_are_refused(
    tmp_path: Path, changes: Mapping[str, str | None], names: str
) -> None:
    env = {name: value for name, value in {**GKE_WORKER, **changes}.items() if value is not None}
    assert_refused(tmp_path, "--cluster", "gke-tpu", "--master-addr", "127.0.0.1", env=env, names=names)


def test_a_run_id_from_pmix_namespace_is_refused_naming_the_variable(tmp_path: Path) -> None:
    env = {**MPI_RANK, "PMIX_NAMESPACE": "../../escape"}
    assert_refused(
        tmp_path,
        "--cluster",
        "mpi",
        "--master-addr",
        "127.0.0.1",
        env=env,
        names="--rdzv-id (from --cluster mpi: PMIX_NAMESPACE)='../../escape' cannot be a run id",
    )


@pytest.mark.parametrize("pid", [HUGE, "²", "12345678"], ids=["5000-digits", "superscript-two", "past-pid-max"])
def test_stacks_of_a_pid_no_linux_process_can_have_is_refused(pid: str) -> None:
    result = run_xlarun("--stacks", pid, timeout=60)
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and line.startswith("xlarun: error: --stacks "), result.stderr[-2000:]
    assert "expected the launcher's process id" in line
    assert "Traceback" not in result.stderr
