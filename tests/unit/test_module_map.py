"""The module map of CONTRIBUTING.md names every module and folder of the package where it stands,
and nothing that is gone.

The map is the code block that starts with ``xlarun/``: a folder is a line ``name/`` indented two
spaces deeper than its parent's, and everything indented deeper below it, up to its next sibling,
belongs to it. A module is named as ``name.py`` in its own folder's lines (its entry, or the
description of its folder or of a neighbour), not in a subfolder's. ``__init__.py`` is its
folder's own entry.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO
from readme import CONTRIBUTING

PACKAGE = REPO / "xlarun"
MODULE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def module_map() -> list[str]:
    text = CONTRIBUTING.read_text()
    start = text.index("```\nxlarun/") + 4
    return text[start : text.index("```", start)].splitlines()


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def folder_lines(lines: list[str], start: int) -> tuple[list[str], dict[str, int]]:
    """The folder at ``lines[start]``: its own lines (without its subfolders'), and its subfolders' starts."""
    own, subfolders = [lines[start]], {}
    depth, index = indent(lines[start]), start + 1
    while index < len(lines) and indent(lines[index]) > depth:
        line = lines[index]
        if indent(line) == depth + 2 and line.split()[0].endswith("/"):
            subfolders[line.split()[0].rstrip("/")] = index
            index += 1
            while index < len(lines) and indent(lines[index]) > depth + 2:
                index += 1
            continue
        own.append(line)
        index += 1
    return own, subfolders


def mapped(lines: list[str], start: int, path: str = "") -> dict[str, set[str]]:
    """Every folder under the one at ``lines[start]`` (as a path inside the package) and the modules its
    lines name."""
    own, subfolders = folder_lines(lines, start)
    found = {path: set(MODULE.findall("\n".join(own)))}
    for name, index in subfolders.items():
        found.update(mapped(lines, index, f"{path}{name}/"))
    return found


def on_disk() -> dict[str, set[str]]:
    """Every folder of the package that holds Python modules, and its modules but ``__init__.py``."""
    found: dict[str, set[str]] = {}
    for module in PACKAGE.rglob("*.py"):
        if "__pycache__" not in module.parts:
            folder = module.parent.relative_to(PACKAGE).as_posix()
            found.setdefault("" if folder == "." else f"{folder}/", set()).add(module.name)
    for folder in list(found):
        parent = Path(folder)
        while parent.parts:  # a folder of subfolders alone still has an entry
            parent = parent.parent
            found.setdefault("" if parent == Path(".") else f"{parent.as_posix()}/", set())
        found[folder].discard("__init__.py")
    return found


def test_the_map_names_every_module_and_folder_where_it_stands() -> None:
    lines = module_map()
    assert lines[0].startswith("xlarun/")
    described, real = mapped(lines, 0), on_disk()
    missing = [f"xlarun/{folder}" for folder in real if folder not in described]
    missing += [f"xlarun/{folder}{name}" for folder in real for name in real[folder] - described.get(folder, set())]
    assert not missing, f"not in CONTRIBUTING.md's module map: {sorted(missing)}"


def test_the_map_names_nothing_that_is_gone() -> None:
    described, real = mapped(module_map(), 0), on_disk()
    gone = [f"xlarun/{folder}" for folder in described if folder not in real]
    gone += [
        f"xlarun/{folder}{name}" for folder in described if folder in real for name in described[folder] - real[folder]
    ]
    assert not gone, f"in CONTRIBUTING.md's module map, but not in the package: {sorted(gone)}"
