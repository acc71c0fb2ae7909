"""A launch imports what it runs and no more: the xlarun modules a one-node CPU launch loads, held as a list.

The launcher runs for real (its workers, its guard, its exit) from a driver that, as the launcher
ends, writes the names in its ``sys.modules``. A module that joins the list (a device's runtime, the
dry run, the fan-out's plan) shows in the difference, and so does a costly library it has no use for.
"""

from __future__ import annotations

from pathlib import Path

from helpers import PYTHON, run_command

DRIVER = """\
import os, sys
from xlarun.cli.command import main

launcher, exit_now = os.getpid(), os._exit


def exit_reporting_modules(code):
    if os.getpid() == launcher:  # not the orphan guard, a fork that ends the same way
        with open(sys.argv[1], "w") as report:
            report.write("\\n".join(sorted(sys.modules)))
    exit_now(code)


os._exit = exit_reporting_modules
main(sys.argv[2:])
"""

NOT_LOADED = ("click", "importlib.metadata", "typing", "dataclasses", "inspect", "json", "uuid")
"""Libraries a plain launch has no use for, whose import alone costs it milliseconds: click answers only
``--help``, ``--version`` and completion; the installed packages are read from their folders; types are
for type checkers, and structs (:mod:`xlarun.structs`) make no code at import as dataclasses do (which loads
``inspect``); JSON is read and written only where a record is; the standalone run id is made without ``uuid``."""

ONE_NODE_CPU_LAUNCH = [
    "xlarun",
    "xlarun.cli",
    "xlarun.cli.command",
    "xlarun.cli.options",
    "xlarun.config",
    "xlarun.console",
    "xlarun.contract",
    "xlarun.durations",
    "xlarun.exceptions",
    "xlarun.failures",
    "xlarun.flags",
    "xlarun.host",
    "xlarun.host.devices",
    "xlarun.host.oom",
    "xlarun.host.ports",
    "xlarun.host.procfs",
    "xlarun.host.programs",
    "xlarun.launching",
    "xlarun.launching.node",
    "xlarun.planning",
    "xlarun.planning.device",
    "xlarun.planning.environment",
    "xlarun.planning.packages",
    "xlarun.planning.plan",
    "xlarun.planning.rules",
    "xlarun.ranks",
    "xlarun.rdzv_conf",
    "xlarun.rendezvous",
    "xlarun.runtimes",
    "xlarun.runtimes.cpu",
    "xlarun.runtimes.pjrt",
    "xlarun.runtimes.releases",
    "xlarun.structs",
    "xlarun.supervision",
    "xlarun.supervision.agent",
    "xlarun.supervision.end",
    "xlarun.supervision.events",
    "xlarun.supervision.group",
    "xlarun.supervision.guard",
    "xlarun.supervision.logs",
    "xlarun.supervision.process",
    "xlarun.supervision.relay",
    "xlarun.supervision.report",
    "xlarun.supervision.signals",
    "xlarun.supervision.watches",
]
"""The CPU device's runtime (PJRT's common variables and the CPU's) and nothing of another device, the
dry run, the fan-out (``remote``), ``xlarun.launch()``'s module, the Slurm host list parser or ``--stacks``."""


def test_a_one_node_cpu_launch_loads_only_what_it_runs(tmp_path: Path) -> None:
    report, script = tmp_path / "modules", tmp_path / "noop.py"
    script.write_text("pass\n")
    launch = run_command([PYTHON, "-c", DRIVER, str(report), "--nproc-per-node", "2", str(script)], cwd=tmp_path)
    assert launch.returncode == 0, launch.stderr
    loaded = report.read_text().split()
    assert [name for name in loaded if name.split(".")[0] == "xlarun"] == ONE_NODE_CPU_LAUNCH
    assert [name for name in NOT_LOADED if name in loaded] == []
