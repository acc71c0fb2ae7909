"""The manual is one a newcomer can trust: every command line its pages show plans.

Every xlarun command line of the manual (README.md, ``docs/``, CONTRIBUTING.md) — each line
of its ``bash`` blocks and each inline command that names a script — runs here under
``xlarun --dry-run``, on the fake host its section is about (a TPU VM under "TPU", a
trn1.32xlarge under "Neuron", ...) and, for ``--cluster``, in the environment the scheduler
gives (the recorded fixtures; for ``tpu-vm`` a stub of the VM's metadata server,
``tests/metadata.py``). A bash line that runs anything else must be one of the few other
programs the manual may show (pip, the scripts), so no command escapes.
"""

from __future__ import annotations

import contextlib
import json
import shlex

import pytest
from helpers import REPO, TESTS, run_xlarun
from metadata import serve_metadata, slice_attributes
from readme import Command, manual_commands, section

HOSTS = TESTS / "fixtures" / "hosts"
CLUSTERS = TESTS / "fixtures" / "cluster"

# The host each device's section is planned on, and the device its plans must get.
SECTION_HOSTS = {
    "TPU": ("tpu-v4-vm", "tpu"),
    "AWS Neuron": ("trn1-32xlarge", "neuron"),
    "XLA:GPU": ("nvidia-8gpu", "cuda"),
    "CPU": ("gce-cpu-vm", "cpu"),
}
CLUSTER_FIXTURES = {
    "slurm": "slurm_step_node1",
    "k8s": "k8s_pytorchjob_worker1",
    "gke-tpu": "gke_tpu_worker1",
    "mpi": "mpi_npernode1_rank1",
}
# What worker 1 of a two-host v4-16 slice's metadata server says, for --cluster tpu-vm.
TPU_VM = slice_attributes(1, ["10.130.0.2", "10.130.0.3"])
COMMANDS = manual_commands()[0]


def argv(command: Command) -> list[str]:
    """The command's words from ``xlarun`` on; the manual's commands need no shell variables."""
    assert "$" not in command.line and not command.exported, command.line
    words = shlex.split(command.line)
    return words[words.index("xlarun") :]


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.page}, {c.section}: {c.line}" for c in COMMANDS])
def test_every_manual_command_plans(command: Command) -> None:
    words = argv(command)
    host = next((value for key, value in SECTION_HOSTS.items() if command.section.startswith(key)), None)
    env: dict[str, str] = {}
    if host is not None:
        env["XLARUN_HOST_ROOT"] = str(HOSTS / host[0])
    cluster = words[words.index("--cluster") + 1] if "--cluster" in words else None
    if cluster in CLUSTER_FIXTURES:
        env.update(json.loads((CLUSTERS / f"{CLUSTER_FIXTURES[cluster]}.json").read_text())["environ"])
    flags = [word for word in words[1:] if word != "--dry-run"]
    with serve_metadata(TPU_VM) if cluster == "tpu-vm" else contextlib.nullcontext() as metadata:
        if metadata is not None:
            env["GCE_METADATA_HOST"] = metadata.host
        result = run_xlarun("--dry-run", *flags, env=env, cwd=REPO)
    assert result.returncode == 0, f"{command.page}, {command.section}: {command.line}\n{result.stderr}"
    document = json.loads(result.stdout)
    if host is not None and "--device" not in words:
        assert document["device"] == host[1], command.line
    elif "--device" in words:
        assert document["device"] == words[words.index("--device") + 1], command.line


@pytest.mark.torch_xla  # the second runs SPMD on virtual CPU devices
def test_the_quick_starts_first_commands_run_as_pasted() -> None:
    """What a newcomer pastes first runs for real: scripts that exist, exit 0 (on a free port)."""
    first_block = section("Quick start").split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in first_block.splitlines() if line.startswith("xlarun ")]
    assert len(lines) >= 2, first_block
    for line in lines:
        words = shlex.split(line)
        assert (REPO / next(word for word in words if word.endswith(".py"))).is_file(), line
        result = run_xlarun("--standalone", *words[1:], cwd=REPO, timeout=240)
        assert result.returncode == 0, f"{line}\n{result.stderr[-4000:]}"
