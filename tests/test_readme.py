"""The README is a manual a newcomer can trust: its commands plan, its references match the code.

Every xlarun command line the README shows — each line of its ``bash`` blocks and each
inline command that names a script — runs here under ``xlarun --dry-run``, on the fake host
its section is about (a TPU VM under "TPU", a trn1.32xlarge under "Neuron", ...) and, for
``--cluster``, in the environment the scheduler gives (the recorded fixtures). Shell
variables the README's recipes compute on a real machine (``$WORKER_ID`` from the TPU
metadata server, ...) take sample values. A bash line that runs anything else must be one
of the few other programs the README may show (pip, the scripts), so no command escapes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import NamedTuple

import pytest
from conftest import REPO, TESTS, logical_lines, run_xlarun

README = REPO / "README.md"
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
OTHER_PROGRAMS = {"pip", "python", "scripts/demo.sh", "scripts/test.sh", "export"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class Command(NamedTuple):
    """An xlarun command line as the README writes it, with where it stands."""

    line: str
    section: str
    exported: tuple[str, ...]


def readme_commands() -> tuple[list[Command], list[str]]:
    """The xlarun commands of the README, and the lines of its bash blocks that run something else."""
    commands: list[Command] = []
    others: list[str] = []
    section, block, exported = "", None, []
    for line in logical_lines(README.read_text()):
        if block is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            block = line[3:].strip() if block is None else None
            exported = []
            continue
        if block == "bash":
            text = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if not text:
                continue
            if "xlarun " in text:
                commands.append(Command(text, section, tuple(exported)))
            else:
                first = text.split()[0]
                if first == "export":
                    exported.append(text.split()[1].split("=")[0])
                if not ASSIGNMENT.match(first):
                    others.append(first)
        elif block is None:
            for span in re.findall(r"`([^`\n]*\bxlarun [^`\n]*)`", line):
                if span.split()[-1].endswith(".py") and "..." not in span:
                    commands.append(Command(span, section, ()))
    return commands, others


COMMANDS, OTHERS = readme_commands()


def test_the_readme_shows_many_commands_and_nothing_unchecked() -> None:
    assert len(COMMANDS) >= 30, [command.line for command in COMMANDS]
    assert set(OTHERS) <= OTHER_PROGRAMS, OTHERS


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


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_internal_links_lead_to_a_heading() -> None:
    text = README.read_text()
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}
    assert set(re.findall(r"\]\(#([^)]+)\)", text)) <= anchors


def test_summary_file_schema_names_the_real_keys() -> None:
    from xlarun.failures import FailureRecord
    from xlarun.supervision.group import WorkerResult
    from xlarun.supervision.report import RunSummary

    documented = section("Summary file")
    summary = RunSummary(run_id="job")
    summary.add_attempt(0, [WorkerResult(local_rank=0, rank=0, pid=1, started_at=0.0, returncode=-9)])
    keys = [field.name for field in dataclasses.fields(RunSummary)]
    keys += [field.name for field in dataclasses.fields(FailureRecord)] + ["exit_status", "signal"]
    keys += list(summary.attempts[0]) + list(summary.attempts[0]["workers"][0])
    assert [key for key in keys if f"`{key}`" not in documented] == []


def code_variables() -> set[str]:
    """Every environment variable name written in xlarun's code (quoted, upper case, with an underscore)."""
    names: set[str] = set()
    for path in (REPO / "xlarun").rglob("*.py"):
        names.update(re.findall(r"[\"']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)[\"']", path.read_text()))
    # Not variables: a positional argument's name, a sysconf name, a PJRT_DEVICE value.
    return names - {"TRAINING_SCRIPT", "SC_CLK_TCK", "TPU_LEGACY"}


def test_every_variable_xlarun_sets_or_reads_is_in_the_reference() -> None:
    documented = section("Environment variables")
    assert sorted(name for name in code_variables() if f"`{name}`" not in documented) == []
    for name in ("XLARUN_DEVICE", "XLARUN_CLUSTER", "XLARUN_RDZV_TOKEN", "XLARUN_DEBUG", "XLARUN_HOST_ROOT",
                 "XLARUN_LAUNCHED"):
        assert f"`{name}`" in documented


def test_the_first_lines_and_development_start_with_the_two_scripts() -> None:
    scripts = "```bash\nscripts/demo.sh"
    assert README.read_text().startswith("# xlarun\n\n" + scripts)
    assert section("Development").startswith("\n## Development\n\n" + scripts)
    assert "scripts/test.sh" in section("Development").split("```")[1]


def test_python_requirement_matches_setup_cfg() -> None:
    assert re.search(r"^python_requires = >=3\.10$", (REPO / "setup.cfg").read_text(), flags=re.MULTILINE)
    assert "Python 3.10 or newer" in section("Install")


def test_paths_the_readme_names_exist() -> None:
    for path in set(re.findall(r"`((?:examples|scripts|tests)/[\w./-]+)`", README.read_text())):
        assert (REPO / path).exists(), path
