"""torchrun 2.10 to 2.15's flags under xlarun, for real: signals, the shutdown grace, the virtual local
rank, the filtered log copies, the prefix template and the completion scripts.

``test_parity_newer_torchrun.py`` runs the same flags under the installed torchrun where it has them;
these tests hold whatever torch is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    PYTHON,
    Run,
    clean_env,
    finish,
    is_alive,
    read_pid,
    recorded_signals,
    run_xlarun,
    start_signal_recorders,
    wait_for,
    worker,
)

SCRIPTS = str(Path(PYTHON).parent)
"""Where the ``xlarun`` console script is: the completion scripts call it by name."""


def summary_signals(summary_file: Path) -> list[str | None]:
    return [entry["signal"] for entry in json.loads(summary_file.read_text())["attempts"][0]["workers"]]


def test_a_listed_signal_is_forwarded_as_itself_then_the_workers_are_stopped(
    tmp_path: Path, out_dir: Path, port: int
) -> None:
    """SIGALRM is no stop signal by default; listed, it ends the run as SIGTERM does (128+14)."""
    summary_file = tmp_path / "summary.json"
    launcher = start_signal_recorders(
        out_dir, ["--master_port", port, "--signals-to-handle", "SIGTERM,SIGALRM", "--summary-file", summary_file]
    )
    launcher.send_signal(signal.SIGALRM)
    result = finish(launcher)
    assert result.returncode == 128 + signal.SIGALRM, result.stderr
    assert summary_signals(summary_file) == ["SIGALRM", "SIGALRM"]  # the recorder leaves SIGALRM its default
    assert "received SIGALRM" in result.stderr


def test_usr1_listed_or_not_reaches_every_worker_and_the_run_goes_on(out_dir: Path, port: int) -> None:
    launcher = start_signal_recorders(out_dir, ["--master_port", port, "--signals_to_handle", "SIGINT,SIGUSR1"])
    launcher.send_signal(signal.SIGUSR1)
    launcher.send_signal(signal.SIGUSR2)
    wait_for(lambda: all(len(recorded_signals(out_dir, rank)) == 2 for rank in (0, 1)), "both signals at both workers")
    assert launcher.poll() is None, "the launcher stopped"
    launcher.send_signal(signal.SIGINT)
    result = finish(launcher)
    assert result.returncode == 128 + signal.SIGINT
    assert [recorded_signals(out_dir, rank)[-1] for rank in (0, 1)] == ["SIGINT", "SIGINT"]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=lambda number: number.name)
def test_a_signal_left_out_keeps_its_default_action_and_the_guard_takes_the_workers(
    out_dir: Path, port: int, number: signal.Signals
) -> None:
    """Not listed, the signal ends the launcher at once (no traceback, no teardown): the orphan guard
    then kills the workers, which never see the signal."""
    launcher = start_signal_recorders(
        out_dir,
        ["--master_port", port, "--signals-to-handle", "SIGHUP"],
        env={"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT"},
    )  # the flag wins
    pids = [read_pid(out_dir / f"{rank}.ready") for rank in (0, 1)]
    launcher.send_signal(number)
    result = finish(launcher)
    assert result.returncode == -number
    assert "Traceback" not in result.stderr
    wait_for(lambda: not any(is_alive(pid) for pid in pids), "the guard to kill the workers")
    assert recorded_signals(out_dir, 0) == recorded_signals(out_dir, 1) == []


@pytest.mark.parametrize(
    "grace",
    [
        ["--shutdown-timeout", "1"],
        ["--shutdown_timeout=1"],
        ["--kill-timeout", "1"],
        {"PET_SHUTDOWN_TIMEOUT": "1"},
        {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"},
    ],
    ids=["flag", "underscore", "xlarun's name", "PET", "torch's variable"],
)
def test_the_shutdown_grace_comes_from_the_flag_or_torchruns_variables(
    tmp_path: Path, out_dir: Path, port: int, grace: list[str] | dict[str, str]
) -> None:
    """A worker that ignores SIGTERM is killed after the 1 s asked for: the default 30 s would pass
    the launcher's own time limit here."""
    summary_file = tmp_path / "summary.json"
    flags, env = (grace, {}) if isinstance(grace, list) else ([], grace)
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        *flags,
        "--summary-file",
        summary_file,
        worker("signal_recorder.py"),
        out_dir,
        "--ignore-term",
        "--fail-rank",
        "1",
        "--code",
        "3",
        env=env,
        timeout=20,
    )
    assert result.returncode == 3, result.stderr
    assert summary_signals(summary_file) == ["SIGKILL", None]


def test_virtual_local_rank_gives_each_worker_local_rank_0_and_its_own_gpu(tmp_path: Path, port: int) -> None:
    for visible, expected in ((None, ["0", "1"]), (" 7, 9,3", ["7", "9"])):
        dump_dir = tmp_path / f"dump-{len(expected[0])}-{visible is None}"
        dump_dir.mkdir()
        env = {"DUMP_DIR": str(dump_dir), **({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})}
        result = run_xlarun(
            "--virtual-local-rank", "--nproc_per_node", "2", "--master_port", port, worker("dump_env.py"), env=env
        )
        assert result.returncode == 0, result.stderr
        envs = [json.loads((dump_dir / f"{rank}_0.json").read_text())["env"] for rank in (0, 1)]
        assert [env["LOCAL_RANK"] for env in envs] == ["0", "0"]
        assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == expected
        # The log layout still numbers the workers by their place on the node.
        assert [env["TORCHELASTIC_ERROR_FILE"].split("/")[-2] for env in envs] == ["0", "1"]


def test_virtual_local_rank_on_an_xla_device_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for flags in (["--dry-run"], []):
        result = run_xlarun(
            *flags, "--device", "xpu", "--virtual-local-rank", "--nproc_per_node", "2", worker("marker.py"), marker
        )
        if not flags and "needs torch_xla" in result.stderr:
            continue  # no torch_xla in this stack: the device is refused before the flag is read
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("xlarun: error: --virtual-local-rank gives each of")
        assert "Traceback" not in result.stderr
    assert not marker.exists()


def run_filtered(tmp_path: Path, port: int, *flags: object, failing_attempts: int = 0) -> tuple[Run, Path]:
    """``filtered_lines.py`` on two workers with ``flags``; the result and the run's log directory."""
    log_dir = tmp_path / "logs"
    result = run_xlarun(
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        "--log-dir",
        log_dir,
        *flags,
        worker("filtered_lines.py"),
        failing_attempts,
        tmp_path,
    )
    (run_dir,) = log_dir.iterdir()
    return result, run_dir


def filtered(run_dir: Path, attempt: int, stream: str) -> list[str]:
    """The filtered file's lines, in the order each rank wrote them (ranks may interleave)."""
    lines = (run_dir / f"attempt_{attempt}" / f"filtered_{stream}.log").read_text().splitlines()
    return sorted(lines, key=lambda line: line.split(" ")[0].split("]")[0])


def test_duplicate_filters_copy_the_matching_tee_lines_with_their_prefix(tmp_path: Path, port: int) -> None:
    result, run_dir = run_filtered(
        tmp_path, port, "--tee", "3", "--duplicate-stdout-filters", "loss,step", "--duplicate_stderr_filters", "warning"
    )
    assert result.returncode == 0, result.stderr
    assert filtered(run_dir, 0, "stdout") == [
        "[default0]:r0 a0 loss=1.5 step 1",
        "[default0]:r0 a0 progress 20% loss",
        "[default1]:r1 a0 loss=1.5 step 1",
        "[default1]:r1 a0 progress 20% loss",
    ]
    assert filtered(run_dir, 0, "stderr") == [
        "[default0]:r0 a0 warning: loss spike",
        "[default1]:r1 a0 warning: loss spike",
    ]


def test_a_comma_escaped_filter_and_the_prefix_template(tmp_path: Path, port: int) -> None:
    result, run_dir = run_filtered(
        tmp_path,
        port,
        "--tee",
        "1",
        "--log-line-prefix-template",
        "${hostname}|${rank}: ",
        "--duplicate-stdout-filters",
        "acc,, top1",
    )
    assert result.returncode == 0, result.stderr
    host = socket.gethostname()
    assert filtered(run_dir, 0, "stdout") == [f"{host}|0: r0 a0 acc, top1", f"{host}|1: r1 a0 acc, top1"]
    assert f"{host}|1: r1 a0 nothing to see\n" in result.stdout


def test_filters_follow_the_console_and_each_attempt_gets_its_file(tmp_path: Path, port: int) -> None:
    """Only what the console shows of tee'd streams is copied (rank 1 is filtered out, stderr not
    tee'd); the stderr file is made all the same, as torchrun makes it; a restart writes anew."""
    result, run_dir = run_filtered(
        tmp_path,
        port,
        "--tee",
        "1",
        "--local-ranks-filter",
        "0",
        "--max-restarts",
        "1",
        "--duplicate-stdout-filters",
        "step",
        "--duplicate-stderr-filters",
        "warning",
        failing_attempts=1,
    )
    assert result.returncode == 0, result.stderr
    for attempt in (0, 1):
        assert filtered(run_dir, attempt, "stdout") == [f"[default0]:r0 a{attempt} loss=1.5 step 1"]
        assert filtered(run_dir, attempt, "stderr") == []


def test_no_filters_no_files(tmp_path: Path, port: int) -> None:
    result, run_dir = run_filtered(tmp_path, port, "--tee", "3")
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (run_dir / "attempt_0").iterdir()) == ["0", "1"]


# ---- --print-completion


def completion_script(tmp_path: Path, shell: str) -> Path:
    result = run_xlarun("--print_completion", shell)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    path = tmp_path / f"xlarun.{shell}"
    path.write_text(result.stdout)
    return path


def shell_run(command: list[str]) -> str:
    env = clean_env({"PATH": SCRIPTS + os.pathsep + os.environ["PATH"]})
    completed = subprocess.run(command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def needs(shell: str) -> None:
    if shutil.which(shell) is None:
        # scripts/test.sh installs zsh and tcsh where it can; under CI a missing shell is a failure.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{shell} is not installed here (apt-get install {shell})"
        )


@pytest.mark.parametrize(
    "words, expected",
    [
        (["--nproc"], ["--nproc-per-node", "--nproc_per_node"]),
        (["--signals-to"], ["--signals-to-handle"]),
        (["--rdzv-backend", "c"], ["c10d"]),
        (["--device", "n"], ["neuron"]),
        (["--print-completion", ""], ["bash", "zsh", "tcsh"]),
    ],
)
def test_bash_completion_completes_flags_and_choices(tmp_path: Path, words: list[str], expected: list[str]) -> None:
    needs("bash")
    script = completion_script(tmp_path, "bash")
    words_text = " ".join(f"'{word}'" for word in ["xlarun", *words])
    shown = shell_run(
        [
            "bash",
            "--norc",
            "-c",
            f"source {script}; COMP_WORDS=({words_text}); "
            f"COMP_CWORD={len(words)}; _xlarun_completion xlarun; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        ]
    )
    assert shown.split() == expected


def test_zsh_completion_registers_itself_and_is_answered(tmp_path: Path) -> None:
    needs("zsh")
    script = completion_script(tmp_path, "zsh")
    assert (
        shell_run(
            ["zsh", "-f", "-c", f"autoload -U compinit; compinit -u; source {script}; print -r -- $_comps[xlarun]"]
        ).strip()
        == "_xlarun_completion"
    )
    # What the registered function asks xlarun for, and what it is answered.
    answer = shell_run(
        [
            "env",
            "COMP_WORDS=xlarun --virtual",
            "COMP_CWORD=1",
            "_XLARUN_COMPLETE=zsh_complete",
            sys.executable,
            "-m",
            "xlarun",
        ]
    ).splitlines()
    assert answer[:2] == ["plain", "--virtual-local-rank"]


def test_tcsh_completion_registers_every_flag(tmp_path: Path) -> None:
    needs("tcsh")
    script = completion_script(tmp_path, "tcsh")
    registered = shell_run(["tcsh", "-f", "-c", f"source {script}; complete xlarun"])
    for name in ("duplicate-stdout-filters", "shutdown_timeout", "kill-timeout", "print-completion"):
        assert f" {name} " in registered
    assert "n/--start-method/(spawn fork forkserver)/" in registered
