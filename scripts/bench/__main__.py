"""The command line: one subcommand per module (see the package's docstring), its report printed."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __doc__ as package_doc
from .agent_cpu import AGENT_CPU_NODES, AGENT_CPU_RUN_S, run_agent_cpu
from .common import LAUNCHERS, REPO, BenchError, progress
from .launch import QUICK, compare_launchers
from .share import compare_trees

# pod-scale's defaults: its module is imported only when it runs (see main).
POD_NODES = (8, 64, 512, 2048)
POD_WINDOW_S = 10.0


def check_bin_dir(
    parser: argparse.ArgumentParser, bin_dir: str, names: tuple[str, ...] = (*LAUNCHERS, "python")
) -> None:
    for name in names:
        if not os.access(Path(bin_dir) / name, os.X_OK):
            parser.error(f"no executable {name} in --bin-dir {bin_dir}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench", description=(package_doc or "").split("\n", 1)[0])
    subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    report = argparse.ArgumentParser(add_help=False)
    report.add_argument("--markdown-out", metavar="FILE", help="also write the report to FILE")
    launchers = argparse.ArgumentParser(add_help=False)
    launchers.add_argument(
        "--bin-dir",
        default=str(REPO / ".venv" / "bin"),
        help="directory holding xlarun, torchrun and python (default: the repository's .venv/bin)",
    )

    launch = subcommands.add_parser(
        "launch", parents=[report, launchers], help="xlarun and torchrun side by side (launch, memory, crash, tee)"
    )
    launch.add_argument("--repeat", type=int, default=5, help="runs per launcher and measure (default 5)")
    launch.add_argument(
        "--quick",
        action="store_true",
        help=f"only {QUICK.launch_workers} workers for the launch and "
        f"{QUICK.tee_lines_per_worker} tee lines per worker",
    )

    share = subcommands.add_parser(
        "share",
        parents=[report, launchers],
        help="xlarun's own share of a launch, this checkout against other source trees (git worktrees)",
    )
    share.add_argument("trees", nargs="+", metavar="TREE", help="an xlarun source tree, such as a git worktree")
    share.add_argument("--repeat", type=int, default=15, help="runs per tree (default 15)")

    pod = subcommands.add_parser(
        "pod-scale", parents=[report], help="the simulation of many nodes against one store (its own table)"
    )
    pod.add_argument(
        "--nodes",
        default=",".join(map(str, POD_NODES)),
        help=f"simulated node counts (default {','.join(map(str, POD_NODES))})",
    )
    pod.add_argument(
        "--window",
        type=float,
        default=POD_WINDOW_S,
        help=f"seconds of running counted per node count (default {POD_WINDOW_S:.0f})",
    )

    agent = subcommands.add_parser(
        "agent-cpu",
        parents=[report, launchers],
        help=f"node 0's agent CPU with {' and '.join(map(str, AGENT_CPU_NODES))} loopback nodes",
    )
    agent.add_argument(
        "--cpu-run", type=int, default=AGENT_CPU_RUN_S, help=f"seconds the workers run (default {AGENT_CPU_RUN_S})"
    )

    args = parser.parse_args(argv)
    if args.subcommand == "launch":
        if args.repeat < 1:
            launch.error(f"--repeat must be at least 1, got {args.repeat}")
        check_bin_dir(launch, args.bin_dir)
    elif args.subcommand == "share":
        if args.repeat < 1:
            share.error(f"--repeat must be at least 1, got {args.repeat}")
        check_bin_dir(share, args.bin_dir, ("python",))
    elif args.subcommand == "pod-scale":
        try:
            args.nodes = tuple(int(count) for count in args.nodes.split(","))
        except ValueError:
            pod.error(f"--nodes takes node counts separated by commas, got {args.nodes!r}")
        if min(args.nodes) < 2 or args.window <= 0:
            pod.error("--nodes counts must be at least 2, --window positive")
    else:
        if args.cpu_run < 1:
            agent.error("--cpu-run must be positive")
        check_bin_dir(agent, args.bin_dir)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        if args.subcommand == "launch":
            lines = compare_launchers(Path(args.bin_dir).absolute(), args.repeat, args.quick)
        elif args.subcommand == "share":
            trees = [REPO, *(Path(tree).absolute() for tree in args.trees)]
            lines = compare_trees(Path(args.bin_dir).absolute(), trees, args.repeat)
        elif args.subcommand == "pod-scale":
            # Only this subcommand needs xlarun's multi-node rendezvous: the others run without it.
            from .pod_scale import run_pod_scale

            lines = run_pod_scale(args.nodes, args.window)
        else:
            lines = run_agent_cpu(Path(args.bin_dir).absolute(), args.cpu_run)
    except BenchError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.markdown_out:
        Path(args.markdown_out).write_text(text)
    progress(f"bench: done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
