"""The manual read as the tests check it: its pages, their command lines, sections, headings and links.

The manual is README.md (the front page), every page under ``docs/`` and CONTRIBUTING.md.

- ``PAGES``: the pages, the front page first.
- ``manual_commands()``: the xlarun command lines of every page's ``bash`` blocks and inline commands,
  each with its page and section, and the first words of the other lines those blocks run.
- ``section(title)``: the text of the one section of the manual with that heading, whatever its page.
- ``headings(text)``: a page's headings (outside code blocks) as ``(level, title)``.
- ``anchor(title)``: the anchor GitHub gives a heading.
- ``links(text)``: a page's links to other pages or headings (not to web addresses) as ``(path, anchor)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from helpers import REPO, logical_lines

README = REPO / "README.md"
CONTRIBUTING = REPO / "CONTRIBUTING.md"
PAGES = (README, *sorted((REPO / "docs").glob("*.md")), CONTRIBUTING)
OTHER_PROGRAMS = {"pip", "python", "scripts/demo.sh", "scripts/test.sh", "export"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEADING = re.compile(r"^(#+) (.*)$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


class Command(NamedTuple):
    """An xlarun command line as the manual writes it, with where it stands."""

    line: str
    page: str
    section: str
    exported: tuple[str, ...]


def page_name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def manual_commands() -> tuple[list[Command], list[str]]:
    """The xlarun commands of every page, and the lines of their bash blocks that run something else."""
    commands: list[Command] = []
    others: list[str] = []
    for page in PAGES:
        page_commands, page_others = commands_of(page_name(page), page.read_text())
        commands += page_commands
        others += page_others
    return commands, others


def commands_of(page: str, text: str) -> tuple[list[Command], list[str]]:
    """One page's xlarun commands, each under the nearest heading above it, and its other bash lines."""
    commands: list[Command] = []
    others: list[str] = []
    section, block = "", None
    exported: list[str] = []
    for line in logical_lines(text):
        if block is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            block = line[3:].strip() if block is None else None
            exported = []
            continue
        if block == "bash":
            code = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if not code:
                continue
            if "xlarun " in code:
                commands.append(Command(code, page, section, tuple(exported)))
            else:
                first = code.split()[0]
                if first == "export":
                    exported.append(code.split()[1].split("=")[0])
                if not ASSIGNMENT.match(first):
                    others.append(first)
        elif block is None:
            for span in re.findall(r"`([^`\n]*\bxlarun [^`\n]*)`", line):
                if span.split()[-1].endswith(".py") and "..." not in span:
                    commands.append(Command(span, page, section, ()))
    return commands, others


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The page's lines outside code blocks, with their index."""
    fenced = False
    for index, line in enumerate(text.split("\n")):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield index, line


def headings(text: str) -> list[tuple[int, str]]:
    return list(headings_by_line(text).values())


def headings_by_line(text: str) -> dict[int, tuple[int, str]]:
    """The page's headings as (level, title), by the index of their line."""
    return {
        index: (len(match[1]), match[2].strip()) for index, line in prose_lines(text) if (match := HEADING.match(line))
    }


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def links(text: str) -> list[tuple[str, str]]:
    """The page's links that are not web addresses, as (path, anchor): an empty path is the page itself."""
    found = []
    for _, line in prose_lines(text):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z]+:", target):
                path, _, fragment = target.partition("#")
                found.append((path, fragment))
    return found


def section(title: str) -> str:
    """The section headed ``title`` on whichever page holds it, from its heading to the next heading of
    its level or above; the title must head one section of the whole manual."""
    found = []
    for page in PAGES:
        lines = page.read_text().split("\n")
        by_line = headings_by_line("\n".join(lines))
        for start, (level, heading) in by_line.items():
            if heading == title:
                end = min(
                    (index for index, (other, _) in by_line.items() if index > start and other <= level),
                    default=len(lines),
                )
                found.append("\n".join(lines[start:end]))
    assert len(found) == 1, f"{len(found)} sections of the manual are headed {title!r}"
    return found[0]
