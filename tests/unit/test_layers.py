"""The package's layers only look down, and the supervision layer stays small.

Each module belongs to a layer: its subpackage (``cli``, ``launching``, ``planning``, ``supervision``,
``rendezvous``, ``runtimes``, ``host``, ``worker``, ``remote``, ``jobs``), ``options`` for the option table
(``xlarun.cli.options``, which the launching layer reads as the command does), ``api`` for the package itself,
or ``leaf`` for the shared modules directly under ``xlarun/``. :data:`MAY_IMPORT` says which layers each one may
import; every ``import`` in the package, at any depth (inside functions and ``TYPE_CHECKING`` blocks too), is
checked against it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "xlarun"
LAYERS = ("cli", "launching", "jobs", "remote", "planning", "supervision", "rendezvous", "runtimes", "host", "worker")
OPTION_TABLE = "xlarun.cli.options"
MAY_IMPORT = {
    "leaf": {"leaf"},
    "host": {"leaf", "host"},
    "runtimes": {"leaf", "host", "runtimes"},
    "rendezvous": {"leaf", "host", "rendezvous"},
    # The scheduler readers word a TPU VM's metadata as the rendezvous words a store's text (rendezvous.shown).
    "planning": {"leaf", "host", "runtimes", "rendezvous", "planning"},
    "supervision": {"leaf", "host", "rendezvous", "supervision"},
    # Workers run no plan: what they share with the launcher is the contract, a leaf (xlarun.contract).
    "worker": {"leaf", "host", "runtimes", "worker"},
    # The fan-out over hosts: what a host is sent and how; the dry run's rule of what looks secret; the signal inbox;
    # xlarun's version (the package itself), which every host must share with the launcher.
    "remote": {"api", "leaf", "host", "planning", "supervision", "remote"},
    # The runs to leave: their records, and the verbs, which find a run's workers as --stacks does.
    "jobs": {"leaf", "host", "supervision", "jobs"},
    # The option table's rows name what the layers below allow (devices, runtimes, worker counts, ports); its
    # parsers read Slurm host lists (planning.hostlist), --rsh templates and --env files (remote).
    "options": {"leaf", "host", "runtimes", "planning", "remote"},
    # xlarun.launch() (launching.library) reads back the files its worker module (worker.call) leaves.
    "launching": {
        "api",
        "leaf",
        "host",
        "runtimes",
        "rendezvous",
        "planning",
        "supervision",
        "remote",
        "worker",
        "jobs",
        "options",
        "launching",
    },
    # --version (the package's), a host's agent (remote.agent), the variables --help names (host, jobs.records).
    "cli": {"api", "leaf", "host", "remote", "jobs", "options", "launching", "cli"},
    # The package itself: xlarun.record, and the worker helpers and xlarun.launch() loaded on first use.
    "api": {"leaf", "worker", "launching"},
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    if parts[1] == "__main__":
        return "cli"
    if module == OPTION_TABLE:
        return "options"
    return parts[1] if parts[1] in LAYERS else "leaf"


def is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every xlarun module ``path`` imports; ``from pkg import name`` counts as ``pkg.name`` when that is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(
                f"{node.module}.{alias.name}" if is_module(f"{node.module}.{alias.name}", root) else node.module
                for alias in node.names
            )
    return {name for name in found if name == "xlarun" or name.startswith("xlarun.")}


def upward_imports(package: Path) -> list[str]:
    """Each import of a module in ``package`` that its layer may not make, as a line."""
    root, violations = package.parent, []
    for path in sorted(package.rglob("*.py")):
        importer = module_name(path, root)
        for imported in sorted(imported_modules(path, root)):
            if layer_of(imported) not in MAY_IMPORT[layer_of(importer)]:
                violations.append(f"{importer} ({layer_of(importer)}) imports {imported} ({layer_of(imported)})")
    return violations


def test_no_module_imports_up_a_layer() -> None:
    assert upward_imports(PACKAGE) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    # The check itself, on a copy of one leaf that reaches for the option table.
    (tmp_path / "xlarun" / "cli").mkdir(parents=True)
    (tmp_path / "xlarun" / "cli" / "options.py").write_text("")
    leaf = (PACKAGE / "flags.py").read_text() + "\nfrom xlarun.cli import options\n"
    (tmp_path / "xlarun" / "flags.py").write_text(leaf)
    assert upward_imports(tmp_path / "xlarun") == ["xlarun.flags (leaf) imports xlarun.cli.options (options)"]


def test_at_most_a_dozen_modules_sit_directly_under_the_package() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 12


def test_the_worker_group_loads_neither_the_option_table_nor_a_runtime() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, xlarun.supervision.group\nprint(*sorted(m for m in sys.modules if m.startswith('xlarun')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    assert "xlarun.supervision.group" in loaded
    # Twelve of its own, and xlarun.structs, which stands in for the standard library's dataclasses.
    assert len(loaded) <= 13, loaded
    assert [
        name
        for name in loaded
        if name.startswith(("xlarun.cli", "xlarun.launching", "xlarun.runtimes", "xlarun.planning"))
    ] == []


def test_the_worker_group_stays_a_loop_over_workers() -> None:
    # What watches the workers (hangs, the console, the OOM killer, ...) lives in objects of its own
    # (xlarun.supervision.watches), not in the loop's fields and methods.
    tree = ast.parse((PACKAGE / "supervision" / "group.py").read_text())
    group = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "WorkerGroup")
    fields = {
        node.attr
        for node in ast.walk(group)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    assert group.end_lineno is not None and group.end_lineno - group.lineno + 1 <= 300
    assert len(fields) <= 15, sorted(fields)


def test_a_worker_loads_no_planning_module() -> None:
    # What a worker shares with the launcher is the contract (xlarun.contract), not the launcher's plan.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, xlarun.worker\nprint(*sorted(m for m in sys.modules if m.startswith('xlarun')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    assert "xlarun.worker" in loaded and "xlarun.contract" in loaded
    assert [
        name
        for name in loaded
        if name.startswith(("xlarun.planning", "xlarun.cli", "xlarun.launching", "xlarun.supervision"))
    ] == []


FLAG_CALL = re.compile(r"\bflag\(['\"]([a-z_]+)['\"]\)")


def test_every_flag_spelt_in_the_package_names_an_option() -> None:
    from xlarun.cli.options import OPTIONS_BY_DEST
    from xlarun.flags import flag

    spelt = {dest for path in PACKAGE.rglob("*.py") for dest in FLAG_CALL.findall(path.read_text())}
    assert len(spelt) > 20
    assert sorted(spelt - set(OPTIONS_BY_DEST)) == []
    assert all(flag(dest) == option.display_name for dest, option in OPTIONS_BY_DEST.items())
