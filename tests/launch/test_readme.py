"""The README is a manual a newcomer can trust: every command line it shows plans.

Every xlarun command line the README shows — each line of its ``bash`` blocks and each
inline command that names a script — runs here under ``xlarun --dry-run``, on the fake host
its section is about (a TPU VM under "TPU", a trn1.32xlarge under "Neuron", ...) and, for
``--cluster``, in the environment the scheduler gives (the recorded fixtures). Shell
variables the README's recipes compute on a real machine (``$WORKER_ID`` from the TPU
metadata server, ...) take sample values. A bash line that runs anything else must be one
of the few other programs the README may show (pip, the scripts), so no command escapes.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from helpers import REPO, TESTS, run_xlarun
from readme import Command, readme_commands

HOSTS = TESTS / "fixtures" / "hosts"
CLUSTERS = TESTS / "fixtures" / "cluster"

# The host each device's section is planned on, and the device its plans must get.
SECTION_HOSTS = {"TPU": ("tpu-v4-vm", "tpu"), "AWS Neuron": ("trn1-32xlarge", "neuron"),
                 "XLA:GPU": ("nvidia-8gpu", "cuda"), "CPU": ("gce-cpu-vm", "cpu")}
CLUSTER_FIXTURES = {"slurm": "slurm_step_node1", "k8s": "k8s_pytorchjob_worker1", "gke-tpu": "gke_tpu_worker1",
                    "mpi": "mpi_npernode1_rank1"}
# What the README's recipes compute on a real machine (a 4-host TPU slice here).
SHELL_VALUES = {"WORKER_ID": "1", "WORKER0": "10.130.0.2", "NHOSTS": "4", "TPU_HOST_BOUNDS": "1,1,4",
                "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}
COMMANDS, OTHERS = readme_commands()


def argv(command: Command) -> list[str]:
    """The command's words from ``xlarun`` on, the recipe's shell variables given their sample values."""
    def value(match: re.Match[str]) -> str:
        assert match.group(1) in SHELL_VALUES, f"unknown shell variable in {command.line}"
        return SHELL_VALUES[match.group(1)]

    words = shlex.split(re.sub(r"\$\{?(\w+)\}?", value, command.line))
    return words[words.index("xlarun"):]


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.section}: {c.line}" for c in COMMANDS])
def test_every_readme_command_plans(command: Command) -> None:
    words = argv(command)
    host = next((value for key, value in SECTION_HOSTS.items() if command.section.startswith(key)), None)
    env = {name: SHELL_VALUES[name] for name in command.exported}
    if host is not None:
        env["XLARUN_HOST_ROOT"] = str(HOSTS / host[0])
    if "--cluster" in words:
        cluster = words[words.index("--cluster") + 1]
        env.update(json.loads((CLUSTERS / f"{CLUSTER_FIXTURES[cluster]}.json").read_text())["environ"])
    flags = [word for word in words[1:] if word != "--dry-run"]
    result = run_xlarun("--dry-run", *flags, env=env, cwd=REPO)
    assert result.returncode == 0, f"{command.line}\n{result.stderr}"
    document = json.loads(result.stdout)
    if host is not None and "--device" not in words:
        assert document["device"] == host[1], command.line
    elif "--device" in words:
        assert document["device"] == words[words.index("--device") + 1], command.line
