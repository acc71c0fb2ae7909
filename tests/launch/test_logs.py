"""Worker logs: torchrun's layout, redirects, tee prefixes, rank filters; whole lines; nothing lost.

The layout and console cases run under torchrun as well and must give the same log files
(relative to the run directory) and the same worker lines on each console stream.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from helpers import RUN_TIMEOUT_S, XLARUN, clean_env, pipe_is_full, run_torchrun, run_xlarun, wait_for, worker

WORKER_LINE = re.compile(r"r\d (out|err) \d+|last words|dying breath")


def worker_lines(text: str) -> Counter:
    """Lines the workers wrote (launcher notices left out), as a multiset: ranks interleave freely."""
    return Counter(line for line in text.splitlines() if WORKER_LINE.search(line))


def log_files(log_dir: Path) -> dict[str, str]:
    """Every file under the single run directory, by path relative to it."""
    [run_dir] = log_dir.iterdir()
    return {str(path.relative_to(run_dir)): path.read_text() for path in sorted(run_dir.rglob("*")) if path.is_file()}


# Each case keeps unprefixed console text to one worker per stream: raw half-lines of two
# workers on one terminal mix under any launcher.
CONSOLE_CASES = {
    "tee both streams": (["-t", "3"], {}),
    "tee per rank with redirect, role and prefix template": (
        ["--role", "trainer", "-t", "0:3,1:2", "-r", "1:1"],
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}|${local_rank}> "},
    ),
    "redirect per rank": (["-r", "0:1,1:2"], {}),
    "local ranks filter": (["--local-ranks-filter", "1", "-t", "0:2"], {}),
}


@pytest.mark.parametrize("case", list(CONSOLE_CASES))
def test_log_files_and_console_lines_match_torchrun(tmp_path: Path, port: int, case: str) -> None:
    flags, env = CONSOLE_CASES[case]
    seen = {}
    for name, run in (("torchrun", run_torchrun), ("xlarun", run_xlarun)):
        log_dir = tmp_path / name
        result = run(
            "--nproc_per_node",
            "2",
            "--master_port",
            port,
            "--log-dir",
            log_dir,
            *flags,
            worker("chatter.py"),
            "4",
            env=env,
        )
        assert result.returncode == 0, result.stderr
        seen[name] = (worker_lines(result.stdout), worker_lines(result.stderr), log_files(log_dir))
    assert seen["xlarun"] == seen["torchrun"]
    assert any(seen["xlarun"]), "the case shows nothing at all"


def test_redirect_all_writes_files_in_torchruns_layout_and_nothing_to_the_console(tmp_path: Path, port: int) -> None:
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node", "2", "--master_port", port, "--log-dir", log_dir, "-r", "3", worker("chatter.py"), "3"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert all(line.startswith("xlarun: ") for line in result.stderr.splitlines())
    [run_dir] = log_dir.iterdir()
    assert re.fullmatch(r"none_[a-z0-9_]{8}", run_dir.name)
    files = log_files(log_dir)
    assert sorted(files) == [
        "attempt_0/0/stderr.log",
        "attempt_0/0/stdout.log",
        "attempt_0/1/stderr.log",
        "attempt_0/1/stdout.log",
    ]
    assert files["attempt_0/1/stdout.log"].splitlines() == ["r1 out 0 ", "r1 out 1 x", "r1 out 2 xx"]


def test_tee_prefixes_console_lines_and_keeps_files_plain(tmp_path: Path, port: int) -> None:
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--log-dir",
        log_dir,
        "-t",
        "3",
        "--role",
        "trainer",
        worker("chatter.py"),
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "[trainer0]:r0 out 0 ",
        "[trainer0]:r0 out 1 x",
        "[trainer1]:r1 out 0 ",
        "[trainer1]:r1 out 1 x",
    ]
    assert log_files(log_dir)["attempt_0/0/stderr.log"] == "r0 err 0 \nr0 err 1 x\n"


def test_prefix_template_takes_role_rank_and_local_rank(port: int) -> None:
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "-t",
        "1",
        "--role",
        "learner",
        worker("chatter.py"),
        "1",
        env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${role_name}/${rank}/${local_rank}: "},
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["learner/0/0: r0 out 0 ", "learner/1/1: r1 out 0 "]


def test_local_ranks_filter_shows_only_the_chosen_ranks(tmp_path: Path, port: int) -> None:
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--log-dir",
        log_dir,
        "-t",
        "3",
        "--local-ranks-filter",
        "0",
        worker("chatter.py"),
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert {line.split(":")[0] for line in worker_lines(result.stdout + result.stderr)} == {"[default0]"}
    # The filtered rank's tee'd streams still reach its files.
    assert log_files(log_dir)["attempt_0/1/stdout.log"] == "r1 out 0 \nr1 out 1 x\n"


def test_concurrent_tee_lines_never_mix(tmp_path: Path, port: int) -> None:
    lines = 3000
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node", "2", "--master_port", port, "--log-dir", log_dir, "-t", "3", worker("chatter.py"), lines
    )
    assert result.returncode == 0, result.stderr
    for stream, text in (("out", result.stdout), ("err", result.stderr)):
        numbers: dict[int, list[int]] = {0: [], 1: []}
        for line in text.splitlines():
            if line.startswith("xlarun: "):
                continue
            match = re.fullmatch(r"\[default(\d)\]:r(\d) (out|err) (\d+) (x*)", line)
            assert match, f"mixed or broken line: {line!r}"
            rank, writer, written_to, number, filler = match.groups()
            assert (rank, written_to, len(filler)) == (writer, stream, int(number) % 97), line
            numbers[int(rank)].append(int(number))
        assert numbers == {0: list(range(lines)), 1: list(range(lines))}
    files = log_files(log_dir)
    assert files["attempt_0/1/stderr.log"].splitlines()[-1] == f"r1 err {lines - 1} " + "x" * ((lines - 1) % 97)


def test_crashing_worker_last_output_is_not_lost_under_tee(tmp_path: Path, port: int) -> None:
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--log-dir",
        log_dir,
        "-t",
        "3",
        worker("chatter.py"),
        "200",
        "--crash-rank",
        "1",
    )
    assert result.returncode == 137
    assert "[default1]:last words of r1" in result.stdout.splitlines()
    assert "[default1]:last words of r1" in result.stderr.splitlines()
    assert "[default1]:dying breath of r1" in result.stderr.splitlines()
    files = log_files(log_dir)
    assert files["attempt_0/1/stdout.log"].endswith("last words of r1\n")
    assert files["attempt_0/1/stderr.log"].endswith("last words of r1\ndying breath of r1")


def test_crashing_worker_last_output_is_not_lost_on_the_console(port: int) -> None:
    result = run_xlarun("--master_port", port, worker("chatter.py"), "200", "--crash-rank", "0")
    assert result.returncode == 137
    assert result.stdout.splitlines()[-1] == "last words of r0"
    assert "last words of r0\ndying breath of r0" in result.stderr


def tee_lines_complete(stdout: str, lines: int) -> bool:
    """Every ``-t 1`` line of both ranks of ``chatter.py LINES`` reached stdout, whole and in order."""
    numbers: dict[int, list[int]] = {0: [], 1: []}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[default(\d)\]:r\1 out (\d+) x*", line)
        assert match, f"mixed or broken line: {line!r}"
        numbers[int(match.group(1))].append(int(match.group(2)))
    return numbers == {0: list(range(lines)), 1: list(range(lines))}


def test_a_console_that_does_not_keep_up_is_waited_for_without_spinning(tmp_path: Path, port: int) -> None:
    """A non-blocking console (the file description is shared with whoever started the
    launcher) that stops reading holds the tee back; nothing is dropped and no CPU burnt."""
    lines = 3000
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    launcher = subprocess.Popen(
        [
            *XLARUN,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            "--log-dir",
            str(tmp_path / "logs"),
            "-t",
            "1",
            "-r",
            "2",
            worker("chatter.py"),
            str(lines),
        ],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=write_fd,
        stderr=subprocess.PIPE,
    )
    os.close(write_fd)
    try:
        received = os.read(read_fd, 64)
        while b"[default" not in received:
            chunk = os.read(read_fd, 64)
            assert chunk, "the launcher ended before any worker line"
            received += chunk
        # The workers write far more than the pipe holds: the launcher waits on a full console.
        wait_for(pipe_is_full(read_fd), "the workers' lines to fill the console")
        process = psutil.Process(launcher.pid)
        before = process.cpu_times()
        time.sleep(2.0)
        after = process.cpu_times()
        busy = (after.user + after.system) - (before.user + before.system)
        assert busy < 0.5, f"the launcher used {busy:.2f} s of CPU while its console was full"
        while chunk := os.read(read_fd, 1 << 16):
            received += chunk
        _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        os.close(read_fd)
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 0, stderr
    assert tee_lines_complete(received.decode(), lines)


def test_a_console_whose_reader_left_ends_only_the_copy_to_it(tmp_path: Path, port: int) -> None:
    """``xlarun ... | head``: the run goes on to its own end, and the log files miss nothing."""
    lines = 3000
    log_dir = tmp_path / "logs"
    launcher = subprocess.Popen(
        [
            *XLARUN,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            "--log-dir",
            str(log_dir),
            "-t",
            "1",
            "-r",
            "2",
            worker("chatter.py"),
            str(lines),
        ],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    launcher.stdout.readline()
    launcher.stdout.close()
    _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    assert launcher.returncode == 0, stderr
    assert "xlarun: cannot write" not in stderr
    files = log_files(log_dir)
    assert files["attempt_0/1/stdout.log"].splitlines()[-1] == f"r1 out {lines - 1} " + "x" * ((lines - 1) % 97)


def test_a_console_that_refuses_output_is_reported_once_and_the_run_goes_on(tmp_path: Path, port: int) -> None:
    lines = 200
    log_dir = tmp_path / "logs"
    with open("/dev/full", "wb") as full:
        completed = subprocess.run(
            [
                *XLARUN,
                "--nproc_per_node",
                "2",
                "--master_port",
                str(port),
                "--log-dir",
                str(log_dir),
                "-t",
                "3",
                worker("chatter.py"),
                str(lines),
            ],
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    assert completed.returncode == 0, completed.stderr
    notices = [line for line in completed.stderr.splitlines() if line.startswith("xlarun: cannot write")]
    assert notices == [
        "xlarun: cannot write worker output to stdout: No space left on device; output it refuses is lost"
    ]
    assert sum(line.startswith("[default") for line in completed.stderr.splitlines()) == 2 * lines
    files = log_files(log_dir)
    assert files["attempt_0/1/stdout.log"].splitlines()[-1] == f"r1 out {lines - 1} " + "x" * ((lines - 1) % 97)
