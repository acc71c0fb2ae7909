"""The tests' fixtures and collection rules; the helpers they use are in ``helpers.py``.

- ``out_dir``: an empty directory that workers write their records to.
- ``port``: a free port for ``--master-port``.
- ``nodes``: the multi-node agents a test starts (:class:`multinode.Nodes`); whatever is left of
  them is killed at teardown.
- ``foreground_signals``: for every test, the stop signals' dispositions of a process started in a
  shell's foreground, however the suite was started (see the fixture).
- ``slurm_env``: a session fixture, the environment for ``srun`` on the Slurm test cluster, which
  it stops at the end of the session unless another session still uses it. Tests that use it
  carry the ``slurm`` marker, so ``-m "not slurm"`` never starts the cluster.
- ``kill_witness``: the session's record of the SIGKILLs and SIGTERMs sent on the machine, and by whom
  (:mod:`kill_witness`), which also ends a failing test's report; the test skips where there is none.
- ``ssh_hosts``: a session fixture, the private OpenSSH server on loopback with its three hosts
  ``h1``, ``h2``, ``h3`` (:class:`sshd.SshHosts`), stopped at the end of the session. Tests that
  use it carry the ``ssh`` marker.

Every test under ``tests/unit/`` carries the ``unit`` marker (in-process, no launcher started)
and every test under ``tests/launch/`` the ``launch`` marker (real processes), given here by
folder; the launch files of :data:`TORCH_FREE` carry ``torch_free`` as well, and those of
:data:`FAN_OUT` ``fan_out``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from helpers import TESTS, free_port, use_launcher_tmpdir
from kill_witness import KillWitness
from multinode import Nodes
from sshd import SshHosts
from sshd import ssh_hosts as private_sshd

UNIT = TESTS / "unit"
LAUNCH = TESTS / "launch"
TORCH_FREE = frozenset(
    {
        "test_bad_input.py",
        "test_detach.py",
        "test_exit_codes.py",
        "test_faults.py",
        "test_input_bounds.py",
        "test_kill_witness.py",
        "test_metadata.py",
        "test_notebook.py",
        "test_orphans.py",
        "test_preemption.py",
        "test_restarts.py",
        "test_signals.py",
        "test_stalls.py",
        "test_untrusted_input.py",
        "test_worker_hook.py",
    }
)
"""The launch files whose launchers and workers never import torch and whose outcome no installed
package decides (a refusal made before the device plan, signals, exit codes, faults, orphans,
restarts, hostile error files: plain Python workers): a second stack with another torch release
could not make them differ, so scripts/test.sh runs them on one."""
FAN_OUT = frozenset(
    {
        "test_hosts.py",
        "test_hosts_preflight.py",
        "test_hosts_ssh.py",
        "test_tpu_pod.py",
    }
)
"""The launch files of jobs on several hosts from one command: the launcher's side (the fan-out) imports
no torch, and each host runs the node that the multi-node tests run on both stacks, so scripts/test.sh
runs them on one."""


@pytest.fixture(scope="session", autouse=True)
def launcher_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("launcher-tmp")
    use_launcher_tmpdir(path)
    return path


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """An empty directory that workers write their records to."""
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


@pytest.fixture
def port() -> int:
    return free_port()


FOREGROUND_DISPOSITIONS: dict[signal.Signals, Callable[..., object] | signal.Handlers] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGQUIT: signal.SIG_DFL,
}
"""What Python starts with where its shell left the stop signals alone: SIGINT raises
``KeyboardInterrupt``, the others take their default action."""


@pytest.fixture(autouse=True)
def foreground_signals() -> Iterator[None]:
    """Every test runs with the stop signals as a process started in a shell's foreground has them, and so
    do the launchers it starts (a Python handler becomes the default action at ``exec``): a test's outcome
    does not depend on how the suite was started.

    A suite started in the background (``nohup … &`` from a script) inherits SIGINT and SIGQUIT
    ignored, and SIGHUP too under ``nohup``, and every process it starts inherits them so in turn: a
    launcher would ignore the signals a test sends it, as a Ctrl-C that ``xlarun --attach`` never sees,
    and a test of what a signal left out of ``--signals-to-handle`` does would see nothing happen.
    """
    previous = {number: signal.signal(number, handler) for number, handler in FOREGROUND_DISPOSITIONS.items()}
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:  # None: installed outside Python, which it cannot be given back to
                signal.signal(number, handler)


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment for ``srun`` on the two-node Slurm test cluster (see ``tests/slurm.py``).

    Session-scoped, so the cluster starts at most once per session and stops when the session
    ends, unless another session still uses it: a cluster left behind keeps four daemons busy
    and disturbs later runs.
    """
    from slurm import slurm_cluster

    with slurm_cluster() as env:
        yield env


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[SshHosts]:
    """The private sshd on 127.0.0.2-4 and the client configuration that reaches it as ``h1``-``h3``
    (see ``tests/sshd.py``), started once per session and stopped with every session it served."""
    with private_sshd() as hosts:
        yield hosts


WITNESS = pytest.StashKey[KillWitness | None]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[WITNESS] = KillWitness.open()


def pytest_sessionfinish(session: pytest.Session) -> None:
    witness = session.config.stash.get(WITNESS, None)
    if witness is not None:
        witness.close()


@pytest.fixture
def kill_witness(request: pytest.FixtureRequest) -> KillWitness:
    """The session's :class:`~kill_witness.KillWitness`; the test skips where the session has none."""
    witness = request.config.stash.get(WITNESS, None)
    if witness is None:
        pytest.skip("this session has no kill witness (it takes root and tracefs)")
    return witness


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test's report ends with the SIGKILLs and SIGTERMs sent on the machine while it ran, and by
    whom (:mod:`kill_witness`), where the session has a witness."""
    report = yield
    witness = item.config.stash.get(WITNESS, None)
    if report.failed and witness is not None:
        # CallInfo keeps wall-clock times; the trace keeps the monotonic clock's.
        to_monotonic = time.monotonic() - time.time()
        sent = witness.sent_between(call.start + to_monotonic, call.stop + to_monotonic)
        report.sections.append(("SIGKILL and SIGTERM sent while it ran (s before its end)", "\n".join(sent) or "none"))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the layers by folder and the launch files of :data:`TORCH_FREE` and :data:`FAN_OUT`, leave out the markers ``XLARUN_TESTS_LEAVE_OUT`` names, and
    refuse a test that uses ``slurm_env`` without the ``slurm`` marker (or ``ssh_hosts`` without
    ``ssh``): ``-m "not slurm"`` would select it and start the cluster that the marker promises to
    leave alone.

    ``XLARUN_TESTS_LEAVE_OUT`` (markers, comma-separated) is how ``scripts/test.sh`` keeps the
    newer stack to the tests that need no torch_xla. It holds whatever ``-m`` is given as well,
    where a second ``-m`` would replace the first.
    """
    for item in items:
        if item.path.is_relative_to(UNIT):
            item.add_marker(pytest.mark.unit)
        elif item.path.is_relative_to(LAUNCH):
            item.add_marker(pytest.mark.launch)
            if item.path.name in TORCH_FREE:
                item.add_marker(pytest.mark.torch_free)
            if item.path.name in FAN_OUT:
                item.add_marker(pytest.mark.fan_out)
    left_out = {marker for marker in os.environ.get("XLARUN_TESTS_LEAVE_OUT", "").split(",") if marker}
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if left_out & {mark.name for mark in item.iter_markers()} else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    for fixture, marker in (("slurm_env", "slurm"), ("ssh_hosts", "ssh")):
        unmarked = [
            item.nodeid
            for item in items
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
        ]
        if unmarked:
            raise pytest.UsageError(f"tests using {fixture} need @pytest.mark.{marker}: " + ", ".join(unmarked))


@pytest.fixture
def nodes(out_dir: Path) -> Iterator[Nodes]:
    started = Nodes(out_dir)
    try:
        yield started
    finally:
        started.cleanup()
