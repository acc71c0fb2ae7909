"""The launcher keeps its promises when what it is handed is hostile, launched for real.

A worker's error file with any content still gives the worker's exit code, a report and a
summary, and no worker outlives the launcher; a link planted where the summary is written is
left alone; a run id that would leave ``--log-dir`` and a summary nobody may write are refused
before anything starts; a store that is not there is given up at the join timeout. The pieces
are checked in-process in ``tests/unit/test_untrusted_input.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import PYTHON, Run, is_alive, kill_all, launcher_frames, read_pid, run_command, run_xlarun, slack_s, worker
from multinode import HOST, Nodes, lines, static

from xlarun.supervision.report import MAX_QUOTED_BYTES

HOSTILE = worker("hostile_error_file.py")
OWN_STDERR = "RuntimeError: the worker's own stderr"
# What the root cause's traceback holds, per kind of error file (see the worker's docstring).
ROOT_TRACEBACKS = {
    "timestamp=inf": "RuntimeError: odd timestamp",
    "timestamp=nan": "RuntimeError: odd timestamp",
    "timestamp=1e20": "RuntimeError: odd timestamp",
    "timestamp=-5e15": "RuntimeError: odd timestamp",
    "deep": OWN_STDERR,
    "long": "RuntimeError: the end of a long traceback",
    "huge": OWN_STDERR,
    "huge=12": OWN_STDERR,
    "escapes": "RuntimeError: \x1b[2J",
    "link": OWN_STDERR,
}
# Far above a report of 64 KiB, far below one that quotes a megabyte.
MAX_STDERR_CHARS = 300_000


@pytest.fixture
def hostile_workers(out_dir: Path) -> Iterator[None]:
    """Kills at teardown whatever hostile workers a failed test left running."""
    yield
    kill_all([read_pid(path) for path in out_dir.glob("*.ready")])


def report_value(stderr: str, name: str) -> str:
    """The root cause's ``name`` line in the report (it comes after the other failures)."""
    return re.findall(rf"^  {name.ljust(10)}: (.*)$", stderr, re.MULTILINE)[-1]


def assert_failed_with_code_3(run: Run, summary_file: Path, out_dir: Path, kind: str) -> dict[str, Any]:
    """Exit 3, a report and a summary whose root cause is rank 1's, every worker gone; returns the root cause."""
    assert run.returncode == 3, run.stderr[-3000:]
    assert "Root Cause (first observed failure):" in run.stderr
    assert report_value(run.stderr, "rank").startswith("1 (local_rank: ")
    assert report_value(run.stderr, "exitcode").startswith("3 (pid: ")
    assert "internal error" not in run.stderr and launcher_frames(run.stderr) == []
    assert len(run.stderr) < MAX_STDERR_CHARS
    assert "\x1b" not in run.stderr
    summary = json.loads(summary_file.read_text())
    root = summary["root_cause"]
    assert (summary["exit_code"], summary["result"], root["rank"], root["exit_status"]) == (3, "failed", 1, 3)
    assert ROOT_TRACEBACKS[kind] in root["traceback"]
    assert len(root["traceback"].encode()) <= MAX_QUOTED_BYTES + 100
    for ready in sorted(out_dir.glob("*.ready")):
        assert not is_alive(read_pid(ready)), f"worker {ready.stem} outlived the launcher"
    return root


@pytest.mark.usefixtures("hostile_workers")
@pytest.mark.parametrize("kind", sorted(ROOT_TRACEBACKS))
def test_a_hostile_error_file_gives_the_workers_code_a_report_and_a_summary(
    tmp_path: Path, out_dir: Path, port: int, kind: str
) -> None:
    summary_file = tmp_path / "summary.json"
    started = time.time()
    run = run_xlarun(
        "--nproc_per_node", "2", "--master_port", port, "--summary-file", summary_file, HOSTILE, out_dir, kind
    )
    root = assert_failed_with_code_3(run, summary_file, out_dir, kind)

    # An implausible timestamp gives way to the worker's exit time.
    assert started - 1 <= root["time"] <= time.time() + 1
    assert datetime.strptime(report_value(run.stderr, "time"), "%Y-%m-%d_%H:%M:%S").timestamp() >= started - 2
    if kind == "long":
        assert re.match(r"\[\.\.\. \d+ bytes cut \.\.\.\]\n", root["traceback"])
        assert report_value(run.stderr, "traceback").startswith("[... ")
    if kind == "escapes":
        assert "  RuntimeError: \\x1b[2J\\x1b]0;retitled\\x07\\x1b[31mred\\r\\x9b1mover" in run.stderr
    if ROOT_TRACEBACKS[kind] == OWN_STDERR:  # no record read: the stderr tail stands in
        assert root["error_file"] == report_value(run.stderr, "error_file") == "<N/A>"
    assert "TOP SECRET" not in run.stderr + summary_file.read_text()


@pytest.mark.usefixtures("hostile_workers")
@pytest.mark.parametrize("kind", ["long", "huge=12"])
def test_another_nodes_hostile_error_file_reaches_every_node_cut(
    nodes: Nodes, tmp_path: Path, out_dir: Path, port: int, kind: str
) -> None:
    """The record goes through the store to the other node: a record of megabytes broke its connection."""
    summaries = [tmp_path / f"summary.{node_rank}.json" for node_rank in (0, 1)]
    agents = [
        nodes.start(*static(port, node_rank, 2, 1), "--summary-file", summaries[node_rank], HOSTILE, out_dir, kind)
        for node_rank in (0, 1)
    ]
    runs = nodes.finish_all(agents)
    for run, summary_file in zip(runs, summaries, strict=True):
        root = assert_failed_with_code_3(run, summary_file, out_dir, kind)
        assert report_value(run.stderr, "host").endswith("(node_rank: 1)")
        if kind == "long":
            assert root["traceback"].startswith("[... ")


def test_a_link_planted_at_the_old_temporary_name_of_the_summary_is_left_alone(tmp_path: Path) -> None:
    """The summary was written through ``<path>.tmp<launcher pid>``, following a link there: the shell that
    plants the link execs the launcher, so the launcher has the pid the link names."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    summary_file = tmp_path / "summary.json"
    plant_then_launch = f'ln -s {victim} "{summary_file}.tmp$$" && exec "$@"'
    run = run_command(
        [
            "sh",
            "-c",
            plant_then_launch,
            "sh",
            PYTHON,
            "-m",
            "xlarun",
            "--standalone",
            "--summary-file",
            str(summary_file),
            "--no-python",
            "true",
        ]
    )
    assert run.returncode == 0, run.stderr
    [link] = tmp_path.glob("summary.json.tmp*")
    assert victim.read_text() == "precious"
    assert link.is_symlink() and link.readlink() == victim
    assert not summary_file.is_symlink()
    summary = json.loads(summary_file.read_text())
    assert (summary["exit_code"], summary["result"]) == (0, "succeeded")


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--rdzv-id", "../../esc"], "--rdzv-id='../../esc' cannot be a run id"),
        (["--rdzv-id", "job\nforged line"], "--rdzv-id='job\\nforged line' cannot be a run id"),
        (["--summary-file", "/proc/1/ci/summary.json"], "(/proc/1 is not writable)"),
    ],
    ids=["run-id-leaving-the-log-dir", "run-id-with-a-newline", "summary-nobody-may-write"],
)
def test_hostile_input_is_refused_before_anything_starts(
    tmp_path: Path, port: int, flags: list[str], expected: str
) -> None:
    log_dir = tmp_path / "a" / "b" / "logs"
    log_dir.mkdir(parents=True)
    marker = tmp_path / "marker"
    run = run_xlarun("--master_port", port, "--log-dir", log_dir, *flags, worker("marker.py"), marker)
    [line] = run.stderr.splitlines()
    assert run.returncode == 2 and line.startswith("xlarun: error: ") and expected in line, run.stderr
    assert "Traceback" not in run.stderr
    assert not marker.exists(), "a worker ran"
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == ["a", "a/b", "a/b/logs"]


def test_a_store_that_is_not_there_is_given_up_at_the_join_timeout(out_dir: Path, port: int) -> None:
    """torch's connect retries for 30 s and longer: the launcher used to wait 40 to 65 s, then say 3."""
    started = time.monotonic()
    run = run_xlarun(*static(port, 1, 2, 1), "--rdzv_conf", "join_timeout=3", worker("marker.py"), out_dir / "marker")
    elapsed = time.monotonic() - started
    assert run.returncode == 1
    [line] = lines(run)
    waited = re.fullmatch(
        rf"xlarun: cannot reach the rendezvous store at {HOST}:{port} after (\d+) s "
        r"\(Connection refused\): is node 0's agent running, and is the address reachable from "
        r"this node\?",
        line,
    )
    assert waited is not None, line
    assert int(waited.group(1)) == 3
    # The launcher's own start (torch's import) takes a second or two of this on a busy machine.
    assert elapsed < 3 + slack_s(5), f"gave up after {elapsed:.1f} s"
    assert list(out_dir.iterdir()) == []
