"""The migration page accounts for every flag: each row of the option table (xlarun/cli/options.py),
torchrun's and xlarun's own, appears in one of docs/migrating.md's tables, so a difference a
drop-in user meets cannot be left out by a flag the page never mentions."""

from __future__ import annotations

import re

from helpers import REPO

from xlarun.cli.options import OPTIONS

MIGRATING = REPO / "docs" / "migrating.md"


def table_rows() -> list[str]:
    return [line for line in MIGRATING.read_text().splitlines() if line.startswith("|")]


def named_in(row: str, spelling: str) -> bool:
    """The row names the flag in a code span: `--tee`, `-t/--tee`, `--tee 3` (not `--tee-x`)."""
    return any(re.search(rf"(^|[\s/]){re.escape(spelling)}($|[\s=/])", span) for span in re.findall(r"`([^`]+)`", row))


def test_every_flag_is_in_a_table_of_the_migration_page() -> None:
    rows = table_rows()
    missing = [
        option.spellings[0]
        for option in OPTIONS
        if not any(named_in(row, spelling) for row in rows for spelling in option.spellings)
    ]
    assert missing == []


def test_the_differences_users_meet_at_the_end_are_in_the_table() -> None:
    differences = "\n".join(rows for rows in table_rows())
    assert "argparse" in differences  # a worker's exit 2 passed through, where torchrun says 1
    assert "130" in differences and "143" in differences  # the launcher stopped by SIGINT / SIGTERM
