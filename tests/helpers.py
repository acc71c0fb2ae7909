"""Shared helpers of the tests: run xlarun (and torchrun) as real processes, plan in-process.

- ``run_xlarun(*args, env=..., cwd=...)`` runs ``python -m xlarun ARGS`` to completion and
  returns ``Run(returncode, stdout, stderr)`` (a tuple).
- ``start_xlarun(...)`` starts it without waiting, for tests that signal the launcher (``start_torchrun``
  likewise); ``start_signal_recorders(out_dir, launcher_args)`` starts two ``signal_recorder.py``
  workers under one and returns once they are ready, ``recorded_signals(out_dir, rank)`` what each got.
- ``plan(*args, env=...)``: the JSON plan ``xlarun --dry-run ARGS`` prints.
- ``clean_env(extra)``: this process's environment without anything a launcher reads
  or sets (``PET_*``, ranks, ``TORCHELASTIC_*``, ``OMP_NUM_THREADS``...), so each test
  states what it depends on; device detection sees a CPU-only host.
- ``worker("name.py")``: the path of a worker script in ``tests/workers``.
- ``wait_for(check, what)``: polls ``check`` until true; its deadline is only a safety net.
- ``is_alive(pid)``: a live process (a zombie counts as dead).
- ``free_port()`` (and the ``port`` fixture of ``conftest.py``): a port nothing listens on, for ``--master_port``. A test
  that launches passes one (or ``--standalone``) rather than rely on a fixed port such as the
  default 29500 being free: other jobs on the machine may hold it.
- ``logical_lines(text)``: shell lines with backslash continuations joined (README and examples).
- ``prepare(*argv, env=...)``: the two steps a launch takes before anything starts
  (``parse_command_line`` and ``plan_launch``), in-process, on a CPU host; ``refusal(...)``:
  the one line they refuse ``argv`` with.

Launchers run as ``python -m ...`` with this interpreter, so xlarun and torchrun start
their workers with the same ``sys.executable``.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import psutil
import pytest

from xlarun.cli.command import parse_command_line
from xlarun.cli.options import read_options
from xlarun.exceptions import UsageError
from xlarun.planning.plan import LaunchPlan, plan_launch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKERS = TESTS / "workers"
CPU_HOST = TESTS / "fixtures" / "hosts" / "gce-cpu-vm"
PYTHON = sys.executable
XLARUN = [PYTHON, "-m", "xlarun"]
TORCHRUN = [PYTHON, "-m", "torch.distributed.run"]
# Safety nets only: a healthy run of these tiny workers ends long before.
RUN_TIMEOUT_S = 120
WAIT_TIMEOUT_S = 60
# `python -c pass` (bytecode cached) on the unloaded 2-core machine the suite's few duration bounds were written on.
REFERENCE_START_S = 0.010

# What a launcher reads or sets; a value inherited from the test runner would change the run.
LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHON_EXEC",
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "XLA_USE_SPMD",
    "LOGLEVEL",
)
# torchrun's per-worker contract with fixed values (the error file's path has a random part).
CONTRACT_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)
LAUNCHER_PREFIXES = ("PET_", "TORCHELASTIC_", "XLARUN_", "PJRT_", "XRT_", "SLURM_", "OMPI_", "PMI_", "TPU_")


_launcher_tmpdir: Path | None = None


def use_launcher_tmpdir(path: Path) -> None:
    """Where launchers started by :func:`clean_env`'s environment keep their temporary files."""
    global _launcher_tmpdir
    _launcher_tmpdir = path


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in LAUNCHER_VARIABLES and not name.startswith(LAUNCHER_PREFIXES)
    }
    # The launcher tests see a host without accelerators wherever they run (device detection
    # has its own tests), so ``--device auto`` means CPU as on a laptop or a CPU CI runner.
    env["XLARUN_HOST_ROOT"] = str(CPU_HOST)
    # Default log directories (and anything else temporary) land in pytest's own, pruned tree.
    if _launcher_tmpdir is not None:
        env["TMPDIR"] = str(_launcher_tmpdir)
    env.update(extra or {})
    return env


def run_command(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: os.PathLike | str | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> Run:
    completed = subprocess.run(
        list(command),
        env=clean_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )
    return Run(completed.returncode, completed.stdout, completed.stderr)


def run_xlarun(
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: os.PathLike | str | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> Run:
    """Run xlarun to completion; ``env`` adds to a clean environment."""
    return run_command([*XLARUN, *map(str, args)], env=env, cwd=cwd, timeout=timeout)


def plan(*args: object, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plan ``xlarun --dry-run ARGS`` prints, parsed; a refusal fails the test with xlarun's stderr.

    ``args`` are the flags and the script with its arguments (any value, passed as ``str``);
    ``env`` adds to a clean environment, as for ``run_xlarun``.
    """
    result = run_xlarun("--dry-run", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_torchrun(
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: os.PathLike | str | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> Run:
    return run_command([*TORCHRUN, *map(str, args)], env=env, cwd=cwd, timeout=timeout)


def start_xlarun(
    *args: object,
    env: Mapping[str, str] | None = None,
    cwd: os.PathLike | str | None = None,
    launcher: Sequence[str] = XLARUN,
) -> subprocess.Popen:
    """Start xlarun (or ``launcher``) in the background, its output captured as text; the caller waits for it."""
    return subprocess.Popen(
        [*launcher, *map(str, args)],
        env=clean_env(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_torchrun(
    *args: object, env: Mapping[str, str] | None = None, cwd: os.PathLike | str | None = None
) -> subprocess.Popen:
    return start_xlarun(*args, env=env, cwd=cwd, launcher=TORCHRUN)


def recorded_signals(out_dir: Path, rank: int) -> list[str]:
    """The signals ``signal_recorder.py`` of ``rank`` received, in order."""
    path = out_dir / f"{rank}.signals"
    return path.read_text().split() if path.exists() else []


def start_signal_recorders(
    out_dir: Path,
    launcher_args: Sequence[object] = (),
    worker_flags: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    start: Callable[..., subprocess.Popen] = start_xlarun,
) -> subprocess.Popen:
    """Two recording workers under ``start``'s launcher, started and ready for signals.

    ``launcher_args`` must give the port (``--master-port``). They run in ``out_dir``: a worker
    ended by SIGQUIT may leave a core file in its cwd.
    """
    launcher = start(
        "--nproc_per_node",
        "2",
        *launcher_args,
        worker("signal_recorder.py"),
        out_dir,
        *worker_flags,
        env=env,
        cwd=out_dir,
    )
    wait_for(files_exist(out_dir / "0.ready", out_dir / "1.ready"), "workers to install their handlers")
    return launcher


def finish(process: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> Run:
    """Wait for a started launcher; kill it if it outlives the safety net."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"launcher still running after {timeout} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return Run(process.returncode, stdout, stderr)


def worker(name: str) -> str:
    return str(WORKERS / name)


LOWEST_FREE_PORT = 10000
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The range the kernel takes a port from for an outgoing connection or a ``bind`` to port 0."""


def free_port() -> int:
    """A port nothing holds now, below the kernel's ephemeral range. A test hands it to a launcher that
    binds it a few seconds later (torchrun first imports torch); a port of the ephemeral range may meanwhile
    be taken by any connection on the machine (a worker's, another test run's), which fails the bind with
    EADDRINUSE. Picked at random, so that two test runs side by side rarely try the same one."""
    below = int(EPHEMERAL_PORTS.read_text().split()[0])
    while True:
        port = random.randrange(LOWEST_FREE_PORT, below)
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port


def wait_for(check: Callable[[], object], what: str, timeout: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def hold_open(path: os.PathLike | str, seconds: int) -> subprocess.Popen:
    """``sleep seconds`` with ``path`` open as its standard input, returned once its command line reads ``sleep
    seconds``: ``Popen`` returns as soon as the exec has replaced the child's memory, and the kernel lays out the new
    program's arguments after that, so a scan of ``/proc`` just after it may find the right name but no arguments."""
    with open(path) as handle:
        holder = subprocess.Popen(["sleep", str(seconds)], stdin=handle)
    wanted = f"sleep\0{seconds}\0".encode()
    try:
        wait_for(lambda: Path(f"/proc/{holder.pid}/cmdline").read_bytes() == wanted, f"sleep {seconds} to start")
    except BaseException:
        holder.kill()  # the caller never gets it to stop
        holder.wait()
        raise
    return holder


def read_until(stream: IO[str], text: str, timeout: float = WAIT_TIMEOUT_S) -> str:
    """What a started process wrote to ``stream`` (its stdout or stderr pipe) up to ``text`` and a little beyond,
    read from the pipe itself: what is left there stays for :func:`finish`, which reads the pipe the same way."""
    read = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in read:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"gave up waiting for {text!r}; read so far:\n{read.decode(errors='replace')}")
        if select.select([stream], [], [], remaining)[0]:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                pytest.fail(f"the stream ended before {text!r}; read:\n{read.decode(errors='replace')}")
            read += chunk
    return read.decode(errors="replace")


def slack_s(seconds: float) -> float:
    """``seconds`` of slack as they were on the reference machine, scaled by how many times slower this one starts
    an interpreter now (never less): the floor a duration bound is measured against, taken in the same run, so a
    bound that holds on an idle machine holds on one several times slower or beside a CPU hog."""
    starts = []
    for _ in range(5):
        began = time.monotonic()
        subprocess.run([PYTHON, "-c", "pass"], check=True)
        starts.append(time.monotonic() - began)
    return seconds * max(1.0, statistics.median(starts) / REFERENCE_START_S)


def pipe_is_full(read_fd: int) -> Callable[[], bool]:
    """Whether the pipe read at ``read_fd`` is full, so that its writers wait in their writes (or, writing
    without blocking, are refused): the pipe is not writable, as its writers' ``poll`` sees it.

    Bytes are no measure: the kernel fills a pipe in page-sized slots, and a write that does not fit in the
    rest of the last slot starts a new one, so a full 64 KiB pipe may hold far less than 64 KiB: 48,000 bytes
    where it was written 3,000 at a time. The check opens a write end of its own (``/proc/self/fd``), for a
    moment."""
    path = f"/proc/self/fd/{read_fd}"

    def full() -> bool:
        write_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return not select.select([], [write_fd], [], 0)[1]
        finally:
            os.close(write_fd)

    return full


def files_exist(*paths: os.PathLike | str) -> Callable[[], bool]:
    return lambda: all(os.path.exists(path) for path in paths)


def read_pid(path: os.PathLike | str) -> int:
    return int(Path(path).read_text())


def is_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def launcher_frames(stderr: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Traceback lines that point into xlarun's own modules (a launcher traceback leaked)."""
    frames = re.findall(r'File "[^"]*/xlarun/([^"]+)"', stderr)
    return [frame for frame in frames if frame not in allowed]


def kill_all(pids: Sequence[int]) -> None:
    """Cleanup after a failed test: nothing the test started may keep running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def logical_lines(text: str) -> Iterator[str]:
    """Lines with backslash continuations joined, as a shell reads them."""
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


HOST = {"XLARUN_HOST_ROOT": str(CPU_HOST)}


def prepare(*argv: str, env: dict[str, str] | None = None) -> LaunchPlan:
    command_line = parse_command_line(list(argv))
    assert command_line is not None
    environ = {**HOST, **(env or {})}
    return plan_launch(
        read_options(command_line.given, environ), command_line.script, command_line.script_args, environ
    )


def refusal(*argv: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as refused:
        prepare(*argv, env=env)
    message = str(refused.value)
    assert "\n" not in message
    return message
