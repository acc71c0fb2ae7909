"""The failure report (torchrun's "Root Cause" block, no launcher traceback) and the summary file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import launcher_frames, read_pid, run_torchrun, run_xlarun, worker

from xlarun.planning.packages import followed_torchrun

FIELDS = ("time", "host", "rank", "exitcode", "error_file", "traceback")


def report_block(stderr: str, script: str) -> list[str]:
    """The block from its top border to its bottom border."""
    lines = stderr.splitlines()
    title = lines.index(f"{script} FAILED")
    end = next(index for index in range(title + 1, len(lines)) if re.fullmatch(r"=+", lines[index]))
    return lines[title - 1 : end + 1]


def field(block: list[str], name: str) -> str:
    [value] = [line.split(":", 1)[1].strip() for line in block if line.startswith(f"  {name.ljust(10)}:")]
    return value


def layout(block: list[str]) -> list[str]:
    """The block with the values that differ between runs (time, pid, traceback text, widths) blanked.

    xlarun's host field also names the node rank, for multi-node runs.
    """
    shapes = []
    for line in block:
        line = re.sub(r"^(  host      : .*) \(node_rank: \d+\)$", r"\1", line)
        line = re.sub(r"^(=|-)+$", r"\1", line)
        line = re.sub(r"^(  time      : ).*", r"\1TIME", line)
        line = re.sub(r"\(pid: \d+\)", "(pid: PID)", line)
        line = re.sub(r"^(  traceback : ).*", r"\1TRACEBACK", line)
        shapes.append(line)
    return shapes


@pytest.mark.skipif(
    followed_torchrun() != (2, 9),
    reason="xlarun keeps torchrun 2.9's report layout; later torchruns list the stopped peers as failures too",
)
def test_report_has_torchruns_block_layout(out_dir: Path, port: int) -> None:
    script = worker("signal_recorder.py")
    blocks = {}
    for name, run in (("torchrun", run_torchrun), ("xlarun", run_xlarun)):
        for stale in out_dir.iterdir():
            stale.unlink()
        result = run("--nproc_per_node", "2", "--master_port", port, script, out_dir, "--fail-rank", "1", "--code", "3")
        assert result.returncode == {"torchrun": 1, "xlarun": 3}[name], result.stderr
        blocks[name] = report_block(result.stderr, script)
    assert layout(blocks["xlarun"]) == layout(blocks["torchrun"])
    assert blocks["xlarun"][1:8] == [
        f"{script} FAILED",
        blocks["xlarun"][2],
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        blocks["xlarun"][2],
        "Root Cause (first observed failure):",
        "[0]:",
    ]
    assert field(blocks["xlarun"], "rank") == "1 (local_rank: 1)"
    assert field(blocks["xlarun"], "exitcode").startswith("3 (pid: ")
    assert field(blocks["xlarun"], "error_file") == "<N/A>"


@pytest.mark.parametrize("wrapping", ["xlarun", "torch"])
def test_traceback_comes_from_the_error_file_of_a_recorded_main(tmp_path: Path, port: int, wrapping: str) -> None:
    script = worker("raises.py")
    log_dir = tmp_path / "logs"
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, "--log-dir", log_dir, script, wrapping)
    assert result.returncode == 1
    block = report_block(result.stderr, script)
    error_file = field(block, "error_file")
    assert error_file.startswith(str(log_dir)) and error_file.endswith("/attempt_0/0/error.json")
    assert os.path.isfile(error_file)
    text = "\n".join(block)
    assert field(block, "traceback") == "Traceback (most recent call last):"
    assert '    raise RuntimeError("boom from the worker")' in text
    assert "\n  RuntimeError: boom from the worker\n" in text
    # From the error file, not from what the worker printed before.
    assert "progress line" not in text
    assert launcher_frames(result.stderr, allowed=("contract.py",)) == []


@pytest.mark.parametrize("redirect", [[], ["--redirects", "2"]], ids=["console", "redirected"])
def test_traceback_comes_from_stderr_without_record(tmp_path: Path, port: int, redirect: list[str]) -> None:
    script = worker("raises.py")
    result = run_xlarun(
        "--nproc_per_node", "2", "--master_port", port, "--log-dir", tmp_path, *redirect, script, "none"
    )
    assert result.returncode == 1
    block = report_block(result.stderr, script)
    assert field(block, "error_file") == "<N/A>"
    text = "\n".join(block)
    assert "\n  RuntimeError: boom from the worker\n" in text
    assert field(block, "traceback") == "Traceback (most recent call last):"
    assert "progress line" not in text  # what the worker wrote before its traceback
    assert launcher_frames(result.stderr) == []


@pytest.mark.parametrize("redirect", [[], ["--redirects", "2"]], ids=["console", "redirected"])
def test_traceback_without_record_is_the_last_python_traceback_whole(
    tmp_path: Path, port: int, redirect: list[str]
) -> None:
    script = worker("warns_then_raises.py")
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, "--log-dir", tmp_path, *redirect, script)
    assert result.returncode == 1
    block = report_block(result.stderr, script)
    assert field(block, "error_file") == "<N/A>"
    # From the first line of the chain's first traceback, the warning before it left out...
    assert field(block, "traceback") == "Traceback (most recent call last):"
    text = "\n".join(block)
    assert "warnings.warn" not in text and "a warning before the failure" not in text
    # ...to the last exception, every frame of both tracebacks and the line that chains them kept.
    quoted = text[text.index("  traceback : ") :]
    assert quoted.count("Traceback (most recent call last):") == 2
    assert "\n  KeyError: 'missing key'\n" in quoted
    assert "\n  During handling of the above exception, another exception occurred:\n" in quoted
    assert ", in <module>\n" in quoted and ", in main\n" in quoted  # the top of the RuntimeError's stack
    assert "\n  RuntimeError: boom while handling the missing key\n" in quoted


def test_signal_death_names_the_signal(port: int) -> None:
    script = worker("chatter.py")
    result = run_xlarun("--nproc_per_node", "2", "--master_port", port, script, "1", "--crash-rank", "1")
    block = report_block(result.stderr, script)
    exitcode = re.fullmatch(r"-9 \(pid: (\d+)\)", field(block, "exitcode"))
    assert exitcode is not None, block
    pid = exitcode.group(1)
    assert field(block, "traceback") == f"Signal 9 (SIGKILL) received by PID {pid}"
    assert field(block, "rank") == "1 (local_rank: 1)"
    assert "Traceback" not in result.stderr


def test_summary_file_of_a_successful_run(tmp_path: Path, out_dir: Path, port: int) -> None:
    (out_dir / "finish").write_text("")
    summary_file = tmp_path / "reports" / "summary.json"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--rdzv-id",
        "ci-42",
        "--summary-file",
        summary_file,
        worker("signal_recorder.py"),
        out_dir,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(summary_file.read_text())
    assert {
        key: summary[key] for key in ("run_id", "exit_code", "result", "restarts", "launcher_signal", "root_cause")
    } == {
        "run_id": "ci-42",
        "exit_code": 0,
        "result": "succeeded",
        "restarts": 0,
        "launcher_signal": None,
        "root_cause": None,
    }
    [attempt] = summary["attempts"]
    assert attempt["attempt"] == 0
    for rank, record in enumerate(attempt["workers"]):
        assert (record["rank"], record["local_rank"], record["exitcode"], record["signal"]) == (rank, rank, 0, None)
        assert record["pid"] == read_pid(out_dir / f"{rank}.ready")
        assert record["start_time"] <= record["end_time"]


def test_summary_file_of_a_failed_run(tmp_path: Path, out_dir: Path, port: int) -> None:
    summary_file = tmp_path / "summary.json"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--summary-file",
        summary_file,
        worker("signal_recorder.py"),
        out_dir,
        "--fail-rank",
        "0",
        "--code",
        "7",
    )
    assert result.returncode == 7
    summary = json.loads(summary_file.read_text())
    assert (summary["exit_code"], summary["result"]) == (7, "failed")
    root = summary["root_cause"]
    assert (root["rank"], root["local_rank"], root["returncode"], root["exit_status"], root["error_file"]) == (
        0,
        0,
        7,
        7,
        "<N/A>",
    )
    assert root["pid"] == read_pid(out_dir / "0.ready")
    workers = summary["attempts"][0]["workers"]
    assert [(w["exitcode"], w["signal"]) for w in workers] == [(7, None), (None, "SIGTERM")]


def test_summary_file_that_cannot_be_written_keeps_the_runs_exit_code(out_dir: Path, port: int) -> None:
    """The path looked fine at the start (its parent could be created) but is not writable at the end."""
    result = run_xlarun(
        "--master_port",
        port,
        "--summary-file",
        "/proc/no-such-dir/summary.json",
        worker("signal_recorder.py"),
        out_dir,
        "--fail-rank",
        "0",
        "--code",
        "6",
    )
    assert result.returncode == 6
    assert "xlarun: cannot write the summary file /proc/no-such-dir/summary.json" in result.stderr
    assert launcher_frames(result.stderr) == []
