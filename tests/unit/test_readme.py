"""The manual's references match the code: summary-file keys, environment variables, paths, the
Python requirement, and every command line its pages show is one the tests check
(``tests/launch/test_readme.py`` plans each of them). Its links are checked in
``test_manual_links.py``, its module map in ``test_module_map.py``."""

from __future__ import annotations

import re

from helpers import REPO
from readme import OTHER_PROGRAMS, PAGES, README, manual_commands, page_name, section

from xlarun import structs

COMMANDS, OTHERS = manual_commands()


def test_the_manual_shows_many_commands_and_nothing_unchecked() -> None:
    assert len(COMMANDS) >= 38, [command.line for command in COMMANDS]
    assert set(OTHERS) <= OTHER_PROGRAMS, OTHERS


def test_the_front_page_stays_short() -> None:
    assert len(README.read_bytes()) < 20 * 1024


def test_summary_file_schema_names_the_real_keys() -> None:
    from xlarun.failures import FailureRecord
    from xlarun.supervision.end import RunEnd
    from xlarun.supervision.group import WorkerResult
    from xlarun.supervision.report import RunSummary

    documented = section("Summary file")
    summary = RunSummary(run_id="job")
    summary.add_attempt(0, [WorkerResult(local_rank=0, rank=0, pid=1, started_at=0.0, returncode=-9)])
    keys = list(summary.record(RunEnd.succeeded()))
    keys += [field.name for field in structs.fields(FailureRecord)] + ["exit_status", "signal"]
    keys += list(summary.attempts[0]) + list(summary.attempts[0]["workers"][0])
    assert [key for key in keys if f"`{key}`" not in documented] == []


def code_variables() -> set[str]:
    """Every environment variable name written in xlarun's code (quoted, upper case, with an underscore)."""
    names: set[str] = set()
    for path in (REPO / "xlarun").rglob("*.py"):
        names.update(re.findall(r"[\"']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)[\"']", path.read_text()))
    # Not variables: a positional argument's name, a sysconf name, a PJRT_DEVICE value, a torchrun event's state,
    # the metadata server's maintenance notices.
    return names - {
        "TRAINING_SCRIPT",
        "SC_CLK_TCK",
        "TPU_LEGACY",
        "ASSIGN_WORKER_RANKS",
        "TERMINATE_ON_HOST_MAINTENANCE",
        "MIGRATE_ON_HOST_MAINTENANCE",
    }


def test_every_variable_xlarun_sets_or_reads_is_in_the_reference() -> None:
    documented = section("Environment variables")
    assert sorted(name for name in code_variables() if f"`{name}`" not in documented) == []
    for name in (
        "XLARUN_DEVICE",
        "XLARUN_CLUSTER",
        "XLARUN_RDZV_TOKEN",
        "XLARUN_DEBUG",
        "XLARUN_HOST_ROOT",
        "XLARUN_LAUNCHED",
    ):
        assert f"`{name}`" in documented


def test_the_first_lines_and_development_start_with_the_two_scripts() -> None:
    scripts = "```bash\nscripts/demo.sh"
    assert README.read_text().startswith("# xlarun\n\n" + scripts)
    assert "scripts/test.sh" in README.read_text().split("```")[1]
    assert section("Development").startswith("# Development\n\n" + scripts)
    assert "scripts/test.sh" in section("Development").split("```")[1]


def test_python_requirement_matches_pyproject() -> None:
    assert re.search(r'^requires-python = ">=3.10"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert "Python 3.10 or newer" in section("Install")


def test_paths_the_manual_names_exist() -> None:
    for page in PAGES:
        for path in set(re.findall(r"`((?:examples|scripts|tests)/[\w./-]+)`", page.read_text())):
            assert (REPO / path).exists(), f"{page_name(page)}: {path}"


def test_the_hugging_face_section_spells_fsdp_as_the_example_passes_it() -> None:
    # The example runs under the installed transformers with no deprecation warning (tests/launch/test_examples.py).
    [spelling] = re.findall(r"TrainingArguments\((fsdp=[^,]+),", section("Hugging Face Trainer with FSDPv2"))
    assert f" {spelling}," in (REPO / "examples" / "hf_trainer_fsdp_v2.py").read_text()
