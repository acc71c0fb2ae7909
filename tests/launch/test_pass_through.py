"""Other systems' variables for the training script reach every worker unchanged under every ``--cluster``:
Kubeflow Trainer's progress reporting and OpenTelemetry's trace context and baggage
(:data:`xlarun.planning.environment.PASSED_THROUGH`). Real launches of workers that dump their environment,
from each cluster's recorded environment (tests/fixtures/cluster) or, for ``tpu-vm``, the stub metadata
server; the flags make each a one-node job on this host. The dry run lists them, a secret-looking name's
value redacted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TESTS, free_port, plan, run_xlarun, worker
from metadata import serve_metadata, slice_attributes

from xlarun.planning.dryrun import REDACTED

FIXTURES = TESTS / "fixtures" / "cluster"

PASSED = {
    "KUBEFLOW_TRAINER_STATUS_URL": "https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443"
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/bert/status",
    "KUBEFLOW_TRAINER_STATUS_CA_CERT": "/var/run/secrets/kubeflow/trainer/ca.crt",
    "KUBEFLOW_TRAINER_STATUS_TOKEN": "/var/run/secrets/kubeflow/trainer/token",
    "TRACEPARENT": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "TRACESTATE": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    "BAGGAGE": "userId=alice,serverNode=DF%2028;prop=1, isProduction=false",
}

ONE_TPU_HOST_ENV = "ACCELERATOR_TYPE: 'v4-8'\nCHIPS_PER_HOST_BOUNDS: '2,2,1'\nHOST_BOUNDS: '1,1,1'\nWORKER_ID: '0'\n"


def recorded(fixture: str) -> dict[str, str]:
    environ = json.loads((FIXTURES / f"{fixture}.json").read_text())["environ"]
    return {name: value for name, value in environ.items() if name not in ("HOME", "PATH", "SHELL")}


@pytest.mark.parametrize(
    "cluster, fixture",
    [
        ("none", "workstation"),
        ("slurm", "slurm_batch_one_node"),
        ("k8s", "k8s_pytorchjob_master"),
        ("auto", "k8s_pytorchjob_worker1"),
        ("gke-tpu", "gke_tpu_worker1"),
        ("tpu-vm", None),
        ("mpi", "mpi_npernode1_rank1"),
    ],
)
def test_the_passed_through_variables_reach_every_worker_unchanged(
    tmp_path: Path, cluster: str, fixture: str | None
) -> None:
    one_node = (
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        free_port(),
        "--device",
        "cpu",
        "--nproc_per_node",
        "2",
    )
    env = {**(recorded(fixture) if fixture else {}), **PASSED, "DUMP_DIR": str(tmp_path)}
    with serve_metadata(slice_attributes(0, ["127.0.0.1"], ONE_TPU_HOST_ENV)) as served:
        result = run_xlarun(
            "--cluster", cluster, *one_node, worker("dump_env.py"), env={**env, "GCE_METADATA_HOST": served.host}
        )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        received = json.loads((tmp_path / f"{rank}_0.json").read_text())["exec_env"]
        assert {name: received.get(name) for name in PASSED} == PASSED


def test_the_dry_run_lists_them_with_a_secret_looking_value_redacted() -> None:
    document = plan("--nproc_per_node", "2", "train.py", env={**PASSED, "HF_TOKEN": "hf_abc"})
    assert document["passed_through"] == {**PASSED, "KUBEFLOW_TRAINER_STATUS_TOKEN": REDACTED}
    assert "/var/run/secrets/kubeflow/trainer/token" not in json.dumps(document)
    assert "hf_abc" not in json.dumps(document)
