"""``share``: xlarun's own share of a launch, this checkout against other source trees, side by side.

Each tree runs as a launcher of its own with this environment's Python (``python -c`` putting the tree
first on ``sys.path`` and calling its command line), so that only xlarun's code differs between them: a
``git worktree`` of an earlier commit is such a tree. Every tree launches 2 no-op workers with
``--standalone`` once untimed (its bytecode caches are written), then ``--repeat`` times, the trees
interleaved, each launch timed beside the shell floor and ``python -c pass`` as the ``launch`` measure
times them. A launch's share is its time above the shell floor in interpreter starts: what xlarun itself
costs, read alike on a fast and on a slow machine. The report gives each tree's median (and range), and
each median as a fraction of the last tree's.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from .common import BenchError, progress, scratch_directory
from .launch import Runner, time_interpreter_start, time_shell_floor, time_to_exit

WORKERS = 2
CALL_THE_TREE = "import sys; sys.path.insert(0, sys.argv.pop(1)); from xlarun.cli.command import main; sys.exit(main())"


def tree_launch(runner: Runner, tree: Path, label: str) -> float:
    run_dir = runner.fresh_dir(label)
    argv = [runner.python(), "-c", CALL_THE_TREE, str(tree), "--standalone", "--nproc-per-node", str(WORKERS)]
    argv += ["--log-dir", str(run_dir / "logs"), runner.scripts["noop"]]
    return time_to_exit(runner, f"xlarun of {tree}", argv, run_dir)


def commit_of(tree: Path) -> str:
    found = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else "—"


def compare_trees(bin_dir: Path, trees: list[Path], repeat: int) -> list[str]:
    """The ``share`` run: each tree's share, as a report."""
    for tree in trees:
        if not (tree / "xlarun" / "cli" / "command.py").is_file():
            raise BenchError(f"{tree} holds no xlarun source tree (no xlarun/cli/command.py)")
    shares: dict[Path, list[float]] = {tree: [] for tree in trees}
    with scratch_directory() as scratch:
        runner = Runner(bin_dir, Path(scratch))
        for index, tree in enumerate(trees):
            tree_launch(runner, tree, f"warm-{index}")
        progress(f"bench: xlarun's share of a launch, {len(trees)} source trees")
        for _ in range(repeat):
            for index, tree in enumerate(trees):
                launch = tree_launch(runner, tree, f"tree-{index}")
                shell = time_shell_floor(runner, WORKERS)
                start = time_interpreter_start(runner)
                shares[tree].append((launch - shell) / start)
    last = statistics.median(shares[trees[-1]])
    rows = [
        f"## xlarun's share of a launch of {WORKERS} no-op workers, in interpreter starts above the shell floor",
        "",
        f"Medians of {repeat} interleaved runs per tree, with the min–max range in parentheses.",
        "",
        "| source tree | commit | interpreter starts | of the last tree's |",
        "|---|---|---|---|",
    ]
    for tree, values in shares.items():
        middle = statistics.median(values)
        rows.append(
            f"| {tree} | {commit_of(tree)} | {middle:.2f} ({min(values):.2f}–{max(values):.2f}) | {middle / last:.2f} |"
        )
    return rows
