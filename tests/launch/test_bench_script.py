"""scripts/bench/ (``python -m scripts.bench launch``): one quick real run of both launchers, and its
check of tee output.

No timing is asserted: the run must finish, and print (and write) a table with a
number for each launcher on every row.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from scripts.bench.common import LAUNCHERS, BenchError, scratch_directory
from scripts.bench.launch import Runner, damaged_lines, tee_line, time_crash_to_exit

# The package runs from the repository root, where ``scripts`` is a namespace package.
BENCH = [sys.executable, "-m", "scripts.bench", "launch"]
BIN_DIR = Path(sys.executable).parent
NUMBER = r"\d+(\.\d+)?"

EXPECTED_ROWS = (
    "launch and exit, 2 no-op workers",
    "shell floor (sh -c), 2 no-op workers: launch and exit above it",
    "interpreter starts above the shell floor, 2 no-op workers",
    "peak RSS, launcher tree without workers",
    "peak RSS, launcher process alone",
    "ru_maxrss from wait4",
    "crash to exit, 4 sleeping peers",
    "tee throughput, --tee 3, 2 workers",
    "tee throughput, 100-byte lines",
    "tee lines lost, torn or unprefixed",
)


def table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| measure"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


def test_quick_run_prints_a_table_with_both_launchers(tmp_path):
    markdown = tmp_path / "bench.md"
    finished = subprocess.run(
        [*BENCH, "--repeat", "1", "--quick", "--markdown-out", str(markdown), "--bin-dir", str(BIN_DIR)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert finished.returncode == 0, finished.stderr
    assert "| measure | unit | xlarun | torchrun | no launcher | torchrun / xlarun | goal | met |" in finished.stdout
    assert re.search(r"^- CPU: .*\d+ cores", finished.stdout, re.MULTILINE)
    assert re.search(
        r"^- Python \d+\.\d+\.\d+; torch \S+, torch_xla (\S+|not installed), xlarun \S+", finished.stdout, re.MULTILINE
    )
    rows = table_rows(finished.stdout)
    for title in EXPECTED_ROWS:
        matching = [cells for name, cells in rows.items() if name.startswith(title)]
        assert matching, f"no row {title!r} in:\n{finished.stdout}"
        _, _, xlarun, torchrun, *_ = matching[0]
        assert re.fullmatch(NUMBER, xlarun) and re.fullmatch(NUMBER, torchrun), matching[0]
    launch = next(cells for name, cells in rows.items() if name.startswith("launch and exit"))
    assert re.fullmatch(NUMBER, launch[4]), "the launch row shows the no-launcher floor"
    shell = next(cells for name, cells in rows.items() if name.startswith("shell floor"))
    assert re.fullmatch(NUMBER, shell[4]), "the shell floor row shows the shell's own time"
    assert markdown.read_text() == finished.stdout


def run_share(tree: Path) -> subprocess.CompletedProcess[str]:
    """``share`` of this checkout against ``tree``, one run each."""
    return subprocess.run(
        [sys.executable, "-m", "scripts.bench", "share", str(tree), "--repeat", "1", "--bin-dir", str(BIN_DIR)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_share_run_prints_each_trees_share_in_interpreter_starts() -> None:
    """This checkout against itself given as the other tree: two rows, each a number of starts and a fraction."""
    finished = run_share(REPO)
    assert finished.returncode == 0, finished.stderr
    rows = [cells for name, cells in table_rows(finished.stdout).items() if name != "source tree"]
    assert len(rows) == 1 and rows[0][0] == str(REPO), finished.stdout  # both rows name the same tree
    assert re.fullmatch(rf"-?{NUMBER} \(-?{NUMBER}–-?{NUMBER}\)", rows[0][2]) and re.fullmatch(NUMBER, rows[0][3]), rows


def test_share_refuses_a_folder_without_xlarun_source(tmp_path: Path) -> None:
    finished = run_share(tmp_path)
    assert finished.returncode == 1
    assert finished.stderr.strip() == f"bench: {tmp_path} holds no xlarun source tree (no xlarun/cli/command.py)"


def test_tee_check_counts_lost_torn_and_unprefixed_lines():
    whole = [b"[default0]:" + tee_line(0), b"[default1]:" + tee_line(1)] * 3
    console = b"\n".join(whole) + b"\n"
    assert damaged_lines(console, workers=2, lines_per_worker=3) == 0

    torn = tee_line(1)[:10] + b"[default0]:" + tee_line(0)
    damaged = (
        b"\n".join(
            [
                b"[default0]:" + tee_line(0),
                torn,  # rank 0's line glued to a piece of rank 1's
                tee_line(1),  # rank 1's line without its prefix
                b"[default1]:" + tee_line(1),
                b"[default0]:" + tee_line(0),
            ]
        )
        + b"\n"
    )
    # Rank 0: 2 of 3 intact; rank 1: 1 of 3 intact (the third line never came).
    assert damaged_lines(damaged, workers=2, lines_per_worker=3) == 3


def test_bad_repeat_is_a_usage_error():
    finished = subprocess.run(
        [*BENCH, "--repeat", "0", "--bin-dir", str(BIN_DIR)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 2
    assert "--repeat must be at least 1" in finished.stderr


@pytest.mark.parametrize(
    "ending, reported",
    [("exit 1", "torchrun exited 1, before its rank 0 crashed"), ("kill -KILL $$", "torchrun was killed by SIGKILL")],
)
def test_a_launcher_that_ends_before_the_crash_is_no_crash_to_time(tmp_path: Path, ending: str, reported: str) -> None:
    """The crash measure times its rank 0's crash: a launcher that failed or was killed before it is reported
    as such, with its stderr, rather than timed."""
    bin_dir, scratch = tmp_path / "bin", tmp_path / "scratch"
    bin_dir.mkdir()
    scratch.mkdir()
    stand_in = bin_dir / "torchrun"
    stand_in.write_text(f"#!/bin/sh\necho 'the rendezvous failed' >&2\n{ending}\n")
    stand_in.chmod(0o755)
    with pytest.raises(BenchError) as refused:
        time_crash_to_exit(Runner(bin_dir, scratch), "torchrun")
    assert str(refused.value).startswith(reported) and str(refused.value).endswith("the rendezvous failed")


def test_what_the_bench_puts_on_a_launchers_command_line_names_no_other_launcher() -> None:
    """A kill by name aimed at one launcher (``pkill -9 -f xlarun``) ends that launcher's runs only: the
    scratch paths on each launcher's command line and on its workers' name no other launcher."""
    with scratch_directory() as scratch:
        runner = Runner(BIN_DIR, Path(scratch))
        for launcher in LAUNCHERS:
            run_dir = runner.fresh_dir(f"crash-{launcher}")
            # argv[0] is the launcher's own program, wherever the user installed it.
            _, *arguments = runner.launcher_argv(launcher, 5, run_dir / "logs", runner.scripts["crash"], str(run_dir))
            others = [other for other in LAUNCHERS if other != launcher]
            assert not [argument for argument in arguments if any(other in argument for other in others)], arguments
