"""torchrun 2.10 to 2.15's flags under xlarun and under the installed torch's own torchrun, side by side.

Each test runs only where the installed torchrun has the flags it compares (read from its
``torch/distributed/run.py``, without importing torch), and skips with the torch version otherwise:
on the torch 2.9 stack they all skip, on the newest stack (``.venv-next``) they run. They compare
what workers get (``parity.assert_same_contract``), the files and lines of the log directory, what
the console shows, and how each launcher ends, where xlarun ends as torchrun does; where it ends
otherwise on purpose (the README's table of differences), the test pins both outcomes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    RUN_TIMEOUT_S,
    Run,
    finish,
    free_port,
    is_alive,
    kill_all,
    read_pid,
    recorded_signals,
    run_torchrun,
    run_xlarun,
    start_signal_recorders,
    start_torchrun,
    start_xlarun,
    wait_for,
    worker,
)
from parity import assert_same_contract, launch_both

_TORCH = importlib.util.find_spec("torch")
_RUN_PY = (
    Path(_TORCH.submodule_search_locations[0]) / "distributed" / "run.py"
    if _TORCH and _TORCH.submodule_search_locations
    else None
)
TORCHRUN_SOURCE = _RUN_PY.read_text() if _RUN_PY is not None and _RUN_PY.exists() else ""
TORCH_VERSION = importlib.metadata.version("torch") if _TORCH else "none"
QUIET = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
"""Keeps torch_tpu (on the newest stack) from loading libtpu in torchrun's launcher; both launchers
get it, so the workers' environments stay comparable."""


def torchrun_has(*flags: str) -> pytest.MarkDecorator:
    missing = [flag for flag in flags if f'"{flag}"' not in TORCHRUN_SOURCE]
    return pytest.mark.skipif(
        bool(missing), reason=f"the installed torch {TORCH_VERSION}'s torchrun has no {', '.join(missing)}"
    )


# ---- what the workers get


def contract_cases(port: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    script, two = worker("dump_env.py"), ["--nproc_per_node", "2", "--master_port", str(port)]
    return {
        "virtual local rank": (["--virtual-local-rank", *two, script], {}),
        "virtual local rank, the launcher's CUDA_VISIBLE_DEVICES": (
            ["--virtual_local_rank", *two, script],
            {"CUDA_VISIBLE_DEVICES": " 5,3 ,1"},
        ),
        "PET_VIRTUAL_LOCAL_RANK": ([*two, script], {"PET_VIRTUAL_LOCAL_RANK": "1"}),
        "signals to handle, the launcher's own list overwritten": (
            ["--signals-to-handle", "SIGTERM, SIGUSR1", *two, script],
            {"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGHUP"},
        ),
        "PET_SIGNALS_TO_HANDLE": ([*two, script], {"PET_SIGNALS_TO_HANDLE": "SIGINT,SIGUSR2"}),
        "default signals": ([*two, script], {}),
        "shutdown timeout": (["--shutdown-timeout", "5", *two, script], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}),
    }


@torchrun_has("--virtual-local-rank", "--signals-to-handle", "--shutdown-timeout")
@pytest.mark.parametrize("case", list(contract_cases(0)))
def test_workers_get_the_newer_torchruns_contract(tmp_path: Path, case: str) -> None:
    args, env = contract_cases(free_port())[case]
    torchrun, xlarun = launch_both(tmp_path, args, {**QUIET, **env})
    assert_same_contract(torchrun, xlarun)
    assert {dump["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] for dump in xlarun.values()} == {
        dump["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] for dump in torchrun.values()
    }


# ---- log files and the console


def run_logged(
    launch: Callable[..., Run],
    tmp_path: Path,
    name: str,
    flags: list[str],
    env: dict[str, str],
    failing_attempts: int = 0,
) -> tuple[Run, Path]:
    """``filtered_lines.py`` on two workers under ``launch``; the result and the run's log directory."""
    log_dir, marks = tmp_path / name, tmp_path / f"{name}-marks"
    marks.mkdir()
    result = launch(
        "--nproc_per_node",
        "2",
        "--master_port",
        free_port(),
        "--log-dir",
        log_dir,
        *flags,
        worker("filtered_lines.py"),
        failing_attempts,
        marks,
        env={**QUIET, **env},
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = log_dir.iterdir()
    return result, run_dir


def log_tree(run_dir: Path) -> dict[str, list[str]]:
    """Every file of the run's log directory, by path: a filtered file's lines as a multiset (ranks
    interleave in it at their own pace), a worker's log as it is."""
    tree = {}
    for path in sorted(run_dir.rglob("*")):
        if path.is_file():
            lines = path.read_text().splitlines()
            tree[str(path.relative_to(run_dir))] = sorted(lines) if path.name.startswith("filtered_") else lines
    return tree


LOG_CASES = {
    "filters on both streams, a template with the host name": (
        [
            "--tee",
            "3",
            "--duplicate-stdout-filters",
            "step,acc,, top1",
            "--duplicate_stderr_filters",
            "warning",
            "--log-line-prefix-template",
            "${hostname}:${role_name}:${rank}:${local_rank}| ",
        ],
        {},
        0,
    ),
    "the console's filter, stderr not tee'd, a restart": (
        [
            "--tee",
            "1",
            "--local-ranks-filter",
            "0",
            "--max-restarts",
            "1",
            "--duplicate-stdout-filters",
            "loss",
            "--duplicate-stderr-filters",
            "warning",
        ],
        {},
        1,
    ),
    "PET variables, an empty filter": (
        ["--tee", "3"],
        {
            "PET_DUPLICATE_STDOUT_FILTERS": "",
            "PET_DUPLICATE_STDERR_FILTERS": "fine",
            "PET_LOG_LINE_PREFIX_TEMPLATE": "<${rank}> ",
        },
        0,
    ),
    "torchrun's template variable": (
        ["--tee", "1"],
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${hostname}/${rank} "},
        0,
    ),
}


@torchrun_has("--duplicate-stdout-filters", "--duplicate-stderr-filters", "--log-line-prefix-template")
@pytest.mark.parametrize("case", list(LOG_CASES))
def test_the_same_log_files_with_the_same_lines_and_the_same_console(tmp_path: Path, case: str) -> None:
    flags, env, failing_attempts = LOG_CASES[case]
    torchrun, torchrun_dir = run_logged(run_torchrun, tmp_path, "torchrun", flags, env, failing_attempts)
    xlarun, xlarun_dir = run_logged(run_xlarun, tmp_path, "xlarun", flags, env, failing_attempts)
    tree = log_tree(xlarun_dir)
    assert tree == log_tree(torchrun_dir)
    copied = "--duplicate-stdout-filters" in flags or "PET_DUPLICATE_STDOUT_FILTERS" in env
    assert any(name.endswith("filtered_stdout.log") for name in tree) == copied
    # A progress bar's carriage return ends a console line under both; xlarun keeps it as drawn.
    assert sorted(xlarun.stdout.splitlines()) == sorted(torchrun.stdout.splitlines())


# ---- how each launcher ends


@torchrun_has("--shutdown-timeout")
@pytest.mark.parametrize(
    "grace", [["--shutdown-timeout", "1"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"}], ids=["flag", "torch's variable"]
)
def test_the_shutdown_grace_ends_sigterm_ignoring_workers_under_both(
    tmp_path: Path, grace: list[str] | dict[str, str]
) -> None:
    """Stopped by SIGTERM, both launchers kill the workers that ignore it after 1 s (30 s would pass
    the time limit). torchrun uses the grace only there: a worker's failure still waits 30 s; xlarun
    uses it for every teardown (``test_newer_torchrun_flags.py``)."""
    flags, env = (grace, {}) if isinstance(grace, list) else ([], grace)
    for name, start in (("torchrun", start_torchrun), ("xlarun", start_xlarun)):
        out_dir = tmp_path / name
        out_dir.mkdir()
        launcher = start_signal_recorders(
            out_dir, ["--master_port", free_port(), *flags], ["--ignore-term"], env={**QUIET, **env}, start=start
        )
        pids = [read_pid(out_dir / f"{rank}.ready") for rank in (0, 1)]
        launcher.send_signal(signal.SIGTERM)
        finish(launcher, timeout=20)
        assert [recorded_signals(out_dir, rank) for rank in (0, 1)] == [["SIGTERM"], ["SIGTERM"]], name
        assert not any(is_alive(pid) for pid in pids), name


@torchrun_has("--signals-to-handle", "--shutdown-timeout")
def test_a_listed_sigusr1_reaches_every_worker_under_both(tmp_path: Path) -> None:
    """torchrun then stops the workers and fails; xlarun keeps its documented behaviour: the run goes on."""
    flags = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout", "1"]
    ended = {}
    for name, start in (("torchrun", start_torchrun), ("xlarun", start_xlarun)):
        out_dir = tmp_path / name
        out_dir.mkdir()
        launcher = start_signal_recorders(out_dir, ["--master_port", free_port(), *flags], env=QUIET, start=start)
        launcher.send_signal(signal.SIGUSR1)
        wait_for(
            lambda: all(recorded_signals(out_dir, rank) == ["SIGUSR1"] for rank in (0, 1)),  # noqa: B023
            f"SIGUSR1 at {name}'s workers",
        )
        if name == "xlarun":
            assert launcher.poll() is None, "xlarun stopped"
            (out_dir / "finish").write_text("")
        ended[name] = finish(launcher).returncode
    assert ended["torchrun"] != 0 and ended["xlarun"] == 0


@torchrun_has("--signals-to-handle")
def test_a_signal_left_out_ends_both_launchers_by_its_default_action(tmp_path: Path) -> None:
    """torchrun's workers outlive it then (a documented difference); xlarun's orphan guard kills them."""
    survivors = {}
    for name, start in (("torchrun", start_torchrun), ("xlarun", start_xlarun)):
        out_dir = tmp_path / name
        out_dir.mkdir()
        launcher = start_signal_recorders(
            out_dir, ["--master_port", free_port(), "--signals-to-handle", "SIGHUP"], env=QUIET, start=start
        )
        pids = [read_pid(out_dir / f"{rank}.ready") for rank in (0, 1)]
        launcher.send_signal(signal.SIGTERM)
        # Not finish(): torchrun's surviving workers hold its output pipes open.
        assert launcher.wait(timeout=RUN_TIMEOUT_S) == -signal.SIGTERM, name
        if name == "xlarun":
            wait_for(lambda: not any(is_alive(pid) for pid in pids), "the guard to kill xlarun's workers")  # noqa: B023
        survivors[name] = [pid for pid in pids if is_alive(pid)]
        kill_all(pids)
        finish(launcher)
    assert len(survivors["torchrun"]) == 2 and survivors["xlarun"] == []


@torchrun_has("--virtual-local-rank")
def test_too_few_visible_gpus_for_the_virtual_local_rank_start_no_worker_under_both(tmp_path: Path) -> None:
    """torchrun fails once its rendezvous is done (exit 1, a traceback); xlarun refuses first (exit 2, a line)."""
    codes = {}
    for name, launch in (("torchrun", run_torchrun), ("xlarun", run_xlarun)):
        marker = tmp_path / f"{name}.ran"
        result = launch(
            "--virtual-local-rank",
            "--nproc_per_node",
            "3",
            "--master_port",
            free_port(),
            worker("marker.py"),
            marker,
            env={**QUIET, "CUDA_VISIBLE_DEVICES": "0,1"},
        )
        codes[name] = result.returncode
        assert not marker.exists(), name
    assert codes == {"torchrun": 1, "xlarun": 2}


@torchrun_has("--signals-to-handle")
def test_a_signal_name_torchrun_cannot_handle(tmp_path: Path) -> None:
    """torchrun warns and runs without it; xlarun refuses the launch in one line."""
    marker = tmp_path / "ran"
    args = ["--signals-to-handle", "SIGTERM,SIGFOO", "--master_port", free_port(), worker("marker.py"), marker]
    torchrun = run_torchrun(*args, env=QUIET)
    assert torchrun.returncode == 0 and "SIGFOO" in torchrun.stderr and marker.exists()
    marker.unlink()
    xlarun = run_xlarun(*args, env=QUIET)
    assert xlarun.returncode == 2 and xlarun.stderr.strip().endswith(
        "'SIGFOO' is no signal name): expected signal names such as SIGTERM,SIGUSR1"
    )
    assert not marker.exists()


@torchrun_has("--print-completion")
def test_a_shell_neither_completes_is_refused_by_both() -> None:
    codes = {
        name: launch("--print-completion", "fish", env=QUIET).returncode
        for name, launch in (("torchrun", run_torchrun), ("xlarun", run_xlarun))
    }
    assert codes == {"torchrun": 2, "xlarun": 2}


@torchrun_has("--print-completion")
def test_both_print_a_bash_script_that_registers_its_completion() -> None:
    torchrun = run_torchrun("--print-completion", "bash", env=QUIET)
    if torchrun.returncode == 1 and "shtab" in torchrun.stderr:
        pytest.skip("torchrun's --print-completion needs shtab, which is not installed with this torch")
    xlarun = run_xlarun("--print-completion", "bash")
    assert torchrun.returncode == xlarun.returncode == 0
    assert "complete " in torchrun.stdout and "torchrun" in torchrun.stdout
    assert "complete " in xlarun.stdout and "xlarun" in xlarun.stdout


def test_the_skips_follow_the_installed_torch() -> None:
    """The skips above read torch's own source: 2.10 and newer have the flags, 2.9 has none."""
    release = tuple(int(part) for part in TORCH_VERSION.split("+")[0].split(".")[:2]) if _TORCH else (0, 0)
    assert ('"--virtual-local-rank"' in TORCHRUN_SOURCE) == (release >= (2, 10))
