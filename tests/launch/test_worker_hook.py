"""The stack-dump hook and the step log take only what is xlarun's: the worker's ``sys.path`` stays
plain Python's, a dump lands in its own file or nowhere, ``xlarun --stacks`` reads only the
caller's own launches and shows their text escaped, and a step log the user asked for stays theirs.

Real launchers and plain Python workers; the ``nobody`` process of the ``--stacks`` test needs root.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, XLARUN, clean_env, finish, run_command, start_xlarun, wait_for, worker

from xlarun.contract import STACKS_SIGNAL, STACKS_VARIABLE

SHOW_PATH = """\
import builtins, json, os, sys
print(json.dumps({"json": json.__file__, "sys_path": sys.path,
                  "cwd_sitecustomize": getattr(builtins, "CWD_SITECUSTOMIZE", False),
                  "PYTHONPATH": os.environ.get("PYTHONPATH") or None}))
"""
"""What the worker's Python took from where: ``json``, ``sys.path``, whether a ``sitecustomize`` of
the working directory ran. An empty ``PYTHONPATH`` counts as none, as Python counts it."""


@pytest.mark.parametrize("pythonpath", ["", "/opt/site:", "/opt/site::/opt/more", ":/opt/site"])
def test_the_workers_sys_path_is_plain_pythons(pythonpath: str, tmp_path: Path, port: int) -> None:
    """An empty PYTHONPATH adds no directory; the user's own empty entries are kept, and no other."""
    cwd, scripts = tmp_path / "cwd", tmp_path / "scripts"
    cwd.mkdir()
    scripts.mkdir()
    (cwd / "json.py").write_text("raise SystemExit('the json.py of the working directory was imported')\n")
    (cwd / "sitecustomize.py").write_text("import builtins\nbuiltins.CWD_SITECUSTOMIZE = True\n")
    script = scripts / "show_path.py"
    script.write_text(SHOW_PATH)
    env = {"PYTHONPATH": pythonpath}

    plain = run_command([PYTHON, str(script)], env=env, cwd=cwd)
    # -P: the launcher's own imports do not come from the working directory, as an installed xlarun's do not.
    launched = run_command(
        [PYTHON, "-P", "-m", "xlarun", "--nproc-per-node", "1", "--master-port", str(port), str(script)],
        env=env,
        cwd=cwd,
    )

    assert launched.returncode == plain.returncode, launched.stderr
    if plain.returncode == 0:
        assert json.loads(launched.stdout) == json.loads(plain.stdout)
    if not pythonpath:
        assert plain.returncode == 0, plain.stderr
        assert not json.loads(launched.stdout)["cwd_sitecustomize"]


@pytest.mark.parametrize("mode", ["reuse", "fill"])
def test_a_dump_lands_in_its_own_file_or_nowhere(mode: str, out_dir: Path, port: int) -> None:
    """A worker that closed the dump's descriptor and holds its own file there keeps that file whole."""
    launcher = start_xlarun("--nproc-per-node", "1", "--master-port", port, worker("descriptors.py"), out_dir, mode)
    try:
        wait_for(lambda: (out_dir / "ready").exists(), "the worker to open its checkpoint")
        shown = run_command([*XLARUN, "--stacks", str(launcher.pid)])
    finally:
        (out_dir / "release").touch()
    run = finish(launcher)

    assert run.returncode == 0, run.stderr
    assert (out_dir / "checkpoint.bin").read_bytes() == b"weights"
    assert shown.returncode == 0, shown.stderr
    if mode == "reuse":  # the dump's descriptor was out of the range closed
        assert "in <module>" in shown.stdout, shown.stdout
    else:
        assert re.search(r"^rank 0 \(local rank 0, pid \d+\):\n  no stack ", shown.stdout, re.M), shown.stdout


def test_stacks_finds_every_worker_under_virtual_local_rank(out_dir: Path, port: int) -> None:
    """Every worker's LOCAL_RANK is 0 there; each dump file still lies in its own local rank's directory."""
    launcher = start_xlarun(
        "--nproc-per-node",
        "2",
        "--virtual-local-rank",
        "--master-port",
        port,
        worker("descriptors.py"),
        out_dir,
        "keep",
    )
    checkpoint = out_dir / "checkpoint.bin"
    try:
        wait_for(
            lambda: checkpoint.exists() and checkpoint.stat().st_size == 2 * len(b"weights"),
            "both workers to open the checkpoint",
        )
        shown = run_command([*XLARUN, "--stacks", str(launcher.pid)])
    finally:
        (out_dir / "release").touch()
    finish(launcher)

    assert shown.returncode == 0, shown.stderr
    assert f"xlarun launch {launcher.pid}: 2 workers" in shown.stdout
    assert shown.stdout.count("in <module>") == 2, shown.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process of another user needs root")
def test_stacks_ignores_another_users_process(tmp_path: Path) -> None:
    """A process of ``nobody`` carrying the stacks variable is no launch of root's, named by PID or not."""
    secret = tmp_path / "secret"
    secret.write_text("root's own line\n")
    secret.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    catching = f"trap : {int(STACKS_SIGNAL)}; while :; do sleep 0.1; done"
    process = subprocess.Popen(
        ["bash", "-c", catching],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        cwd="/",
        env=clean_env({STACKS_VARIABLE: f"{int(STACKS_SIGNAL)}:{secret}"}),
    )
    try:
        wait_for(lambda: _catches_stacks_signal(process.pid), "the nobody process to catch the signal")
        named = run_command([*XLARUN, "--stacks", str(os.getpid())])
        anywhere = run_command([*XLARUN, "--stacks"])
    finally:
        process.kill()
        process.wait()

    assert named.returncode == 1, named.stdout
    assert named.stderr == f"xlarun: process {os.getpid()} is not an xlarun launcher with running workers\n"
    assert f"pid {process.pid}" not in anywhere.stdout and "root's own line" not in anywhere.stdout


def _catches_stacks_signal(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (int(STACKS_SIGNAL) - 1) & 1)


def test_stacks_shows_control_characters_escaped(out_dir: Path, port: int, tmp_path: Path) -> None:
    """A stack's text (here the script's own file name) reaches the terminal with its escapes written out."""
    script = tmp_path / "retitle\x1b]0;owned\x07.py"
    script.write_text(Path(worker("descriptors.py")).read_text())
    launcher = start_xlarun("--nproc-per-node", "1", "--master-port", port, script, out_dir, "keep")
    try:
        wait_for(lambda: (out_dir / "ready").exists(), "the worker to start")
        shown = run_command([*XLARUN, "--stacks", str(launcher.pid)])
    finally:
        (out_dir / "release").touch()
    finish(launcher)

    assert shown.returncode == 0, shown.stderr
    assert "retitle\\x1b]0;owned\\x07.py" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout


def test_a_step_log_the_user_asked_for_stays_in_the_output(port: int, tmp_path: Path) -> None:
    """Without --hang-timeout xlarun asked for no step log: the user's own XLA_EMIT_STEPLOG=1 lines stay theirs."""
    run = run_command(
        [
            *XLARUN,
            "--nproc-per-node",
            "1",
            "--master-port",
            str(port),
            "--tee",
            "3",
            "--log-dir",
            str(tmp_path / "logs"),
            worker("step_lines.py"),
        ],
        env={"XLA_EMIT_STEPLOG": "1"},
    )

    assert run.returncode == 0, run.stderr
    (stderr_log,) = tmp_path.glob("logs/*/attempt_0/0/stderr.log")
    assert stderr_log.read_text() == "before the step\ntorch_xla.torch_xla::sync\nafter the step\n"
    assert "[default0]:torch_xla.torch_xla::sync\n" in run.stderr
