"""The README read as the tests check it: its command lines and its sections.

- ``readme_commands()``: the xlarun command lines of its ``bash`` blocks and inline commands,
  each with its section, and the first words of the other lines those blocks run.
- ``section(title)``: the text of one ``##`` section.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from helpers import REPO, logical_lines

README = REPO / "README.md"
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


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]
