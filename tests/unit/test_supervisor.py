"""The supervisor's event loop against stand-in processes: no process is started.

Each :class:`FakeProcess` is driven through pipes: its "pidfd" becomes readable when the test
(or a signal sent to its group) ends it, and its stderr is a pipe the test writes to.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from xlarun.console import flush_consoles
from xlarun.host.metadata import NOTICES, Notice
from xlarun.supervision.group import GroupOutcome, WorkerGroup, WorkerResult
from xlarun.supervision.process import StreamTarget, Usage, WorkerSpec
from xlarun.supervision.relay import StreamPlan, WorkerLogPlan
from xlarun.supervision.signals import RELAYED_SIGNALS
from xlarun.supervision.stacks import UNKNOWN
from xlarun.supervision.watches import NoticeWatch

_pids = itertools.count(100000)


class FakeProcess:
    """A worker that exits at once with ``exit_code`` (when given), with 0 when ``finishes_on`` reaches
    its group, or dies of any other signal but SIGUSR1, SIGUSR2 and those it ``ignores``."""

    def __init__(
        self,
        spec: WorkerSpec,
        stdout: StreamTarget,
        stderr: StreamTarget,
        *,
        exit_code: int | None = None,
        ignores: tuple[int, ...] = (),
        finishes_on: int | None = None,
        stderr_text: bytes = b"",
    ):
        self.pid = next(_pids)
        self.spec = spec
        self.signals: list[int] = []
        self.ignores = ignores
        self.finishes_on = finishes_on
        self.returncode: int | None = None
        self.usage: Usage | None = None  # the kernel counts nothing for a stand-in
        self._exit_read, self._exit_write = os.pipe()
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._stderr_write: int | None = None
        if stderr == subprocess.PIPE:
            read, self._stderr_write = os.pipe()
            self.stderr = os.fdopen(read, "rb", buffering=0)
            os.write(self._stderr_write, stderr_text)
        if exit_code is not None:
            self.end(exit_code)

    def end(self, returncode: int) -> None:
        if self.returncode is not None:
            return
        self.returncode = returncode
        if self._stderr_write is not None:
            os.close(self._stderr_write)
        os.write(self._exit_write, b"x")
        os.close(self._exit_write)

    def open_pidfd(self) -> int:
        return os.dup(self._exit_read)

    def reap(self) -> int:
        assert self.returncode is not None, "reaped before it ended"
        os.close(self._exit_read)
        return self.returncode

    def signal_group(self, number: int) -> bool:
        if number == 0:
            return self.returncode is None
        self.signals.append(number)
        if number == self.finishes_on:
            self.end(0)
        elif number not in self.ignores and number not in RELAYED_SIGNALS:
            self.end(-number)
        return True

    def open_straggler_pidfds(self) -> list[int]:
        return []


class FakeInbox:
    """The launcher's signals as the loop reads them, without installing handlers in the test process."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        self.pending: list[int] = []

    def send(self, number: int) -> None:
        self.pending.append(number)
        os.write(self._write, bytes([number]))

    def drain(self) -> list[int]:
        try:
            os.read(self.fd, 512)
        except BlockingIOError:
            pass
        received, self.pending = self.pending, []
        return received


def spec(local_rank: int) -> WorkerSpec:
    quiet = StreamPlan()
    logs = WorkerLogPlan(
        directory="", error_file=f"/nonexistent/{local_rank}/error.json", stdout=quiet, stderr=StreamPlan(relay=True)
    )
    return WorkerSpec(local_rank=local_rank, rank=local_rank, argv=["train.py"], env={}, logs=logs)


def run_group(
    behaviour: dict[int, dict[str, object]],
    *,
    inbox: FakeInbox | None = None,
    kill_timeout: float = 30.0,
    count: int = 2,
    failures: list[WorkerResult] | None = None,
    before_run: Callable[[WorkerGroup], None] | None = None,
    **group_options: Any,
) -> tuple[GroupOutcome, list[FakeProcess]]:
    """Run ``count`` fake workers; ``behaviour[local_rank]`` holds FakeProcess's keyword arguments
    (or ``{"cannot_start": True}``); ``group_options`` go to the group, which ``before_run`` sees first."""
    started: list[FakeProcess] = []

    def start(worker_spec: WorkerSpec, stdout: StreamTarget, stderr: StreamTarget) -> FakeProcess:
        options = dict(behaviour.get(worker_spec.local_rank, {}))
        if options.pop("cannot_start", False):
            raise FileNotFoundError(2, "No such file or directory")
        process = FakeProcess(worker_spec, stdout, stderr, **options)  # type: ignore[arg-type]
        started.append(process)
        return process

    group = WorkerGroup(
        [spec(rank) for rank in range(count)],
        kill_timeout=kill_timeout,
        on_failure=None if failures is None else failures.append,
        start_process=start,
        **group_options,
    )
    if before_run is not None:
        before_run(group)
    return group.run(inbox or FakeInbox()), started  # type: ignore[arg-type]


def test_a_failure_stops_the_peers_and_is_the_only_failure_reported() -> None:
    reported: list[WorkerResult] = []
    outcome, (first, second) = run_group(
        {1: {"exit_code": 3, "stderr_text": b"boom\nRuntimeError: bad\n"}}, failures=reported
    )
    assert [result.returncode for result in outcome.results] == [-signal.SIGTERM, 3]
    assert [result.local_rank for result in outcome.failures] == [1] == [result.local_rank for result in reported]
    assert outcome.failures[0].stderr_tail == ["boom", "RuntimeError: bad"]
    assert first.signals == [signal.SIGTERM]
    assert outcome.launcher_signal is None and not outcome.succeeded


def test_success_when_every_worker_exits_zero() -> None:
    outcome, processes = run_group({0: {"exit_code": 0}, 1: {"exit_code": 0}})
    assert outcome.succeeded
    assert [result.returncode for result in outcome.results] == [0, 0]
    # Teardown still reaches the groups: children that exited workers left behind end with them.
    assert all(process.signals == [signal.SIGTERM] for process in processes)


def test_a_worker_that_ignores_sigterm_gets_sigkill_at_the_deadline() -> None:
    outcome, (stubborn, _) = run_group({0: {"ignores": (signal.SIGTERM,)}, 1: {"exit_code": 1}}, kill_timeout=0.05)
    assert stubborn.signals == [signal.SIGTERM, signal.SIGKILL]
    assert [result.returncode for result in outcome.results] == [-signal.SIGKILL, 1]


def test_a_stop_signal_is_forwarded_and_recorded() -> None:
    inbox = FakeInbox()
    inbox.send(signal.SIGTERM)
    outcome, processes = run_group({}, inbox=inbox)
    assert outcome.launcher_signal == signal.SIGTERM
    assert outcome.failures == []
    assert all(process.signals == [signal.SIGTERM] for process in processes)


def test_sigusr1_reaches_every_worker_and_the_run_goes_on() -> None:
    inbox = FakeInbox()
    inbox.send(signal.SIGUSR1)
    # Both finish once the signal reached them: the run was not stopped on its account.
    outcome, processes = run_group(
        {0: {"finishes_on": signal.SIGUSR1}, 1: {"finishes_on": signal.SIGUSR1}}, inbox=inbox
    )
    assert outcome.succeeded
    assert all(process.signals == [signal.SIGUSR1, signal.SIGTERM] for process in processes)


def test_a_worker_that_cannot_start_stops_those_already_started() -> None:
    outcome, started = run_group({1: {"cannot_start": True}}, count=3)
    assert [process.spec.local_rank for process in started] == [0]
    assert started[0].signals == [signal.SIGTERM]
    assert outcome.stop_reason == "cannot start local rank 1: train.py: No such file or directory"
    assert [result.local_rank for result in outcome.results] == [0]


@pytest.mark.parametrize("second_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_second_stop_signal_skips_the_grace_period(second_signal: int) -> None:
    inbox = FakeInbox()
    inbox.send(signal.SIGTERM)
    inbox.send(second_signal)
    outcome, (stubborn, _) = run_group({0: {"ignores": (signal.SIGTERM,)}}, inbox=inbox, kill_timeout=600)
    assert stubborn.signals == [signal.SIGTERM, signal.SIGKILL]
    assert outcome.launcher_signal == signal.SIGTERM


def test_a_stop_asked_for_after_the_group_is_gone_writes_nowhere(tmp_path: Path) -> None:
    """A rendezvous watcher may pass on news after the loop closed its stop pipe."""
    group = WorkerGroup(
        [spec(0)],
        start_process=lambda worker_spec, stdout, stderr: FakeProcess(worker_spec, stdout, stderr, exit_code=0),
    )
    assert group.run(FakeInbox()).succeeded  # type: ignore[arg-type]
    bystander = tmp_path / "bystander"
    with open(bystander, "wb"):  # it may get the pipe's descriptor numbers, now free
        group.request_stop("news that came late")
    assert bystander.read_bytes() == b""


class BrokenInbox(FakeInbox):
    """An inbox whose reading fails, as any fault inside the loop would."""

    def drain(self) -> list[int]:
        raise RuntimeError("the loop broke")


def test_a_fault_in_the_loop_tears_the_group_down_before_it_leaves() -> None:
    started: list[FakeProcess] = []

    def start(worker_spec: WorkerSpec, stdout: StreamTarget, stderr: StreamTarget) -> FakeProcess:
        options = {"ignores": (signal.SIGTERM,)} if worker_spec.local_rank == 0 else {}
        started.append(FakeProcess(worker_spec, stdout, stderr, **options))  # type: ignore[arg-type]
        return started[-1]

    inbox = BrokenInbox()
    inbox.send(signal.SIGUSR1)
    group = WorkerGroup([spec(0), spec(1)], kill_timeout=0.05, start_process=start)
    with pytest.raises(RuntimeError, match="the loop broke"):
        group.run(inbox)  # type: ignore[arg-type]
    stubborn, obedient = started
    assert stubborn.signals == [signal.SIGTERM, signal.SIGKILL] and stubborn.returncode == -signal.SIGKILL
    assert obedient.signals[0] == signal.SIGTERM and obedient.returncode == -signal.SIGTERM


def test_a_silent_idle_group_is_found_hung_told_first_then_stopped() -> None:
    """Stand-ins use no CPU and, after their first line, say nothing: hung once the timeout passes.
    They never armed a stack dump, so none is asked of them."""
    heard: list[object] = []
    outcome, workers = run_group(
        {0: {"stderr_text": b"started\n"}}, hang_timeout=0.2, on_hang=heard.append, on_stacks=heard.append
    )
    assert outcome.hang is not None and outcome.hang.found_here
    assert outcome.hang.positions == {0: UNKNOWN, 1: UNKNOWN} and outcome.hang.stacks_files == {}
    assert heard == [outcome.hang.reason, outcome.hang] and outcome.hang.reason.startswith("no output for ")
    assert outcome.stop_reason == outcome.hang.reason and not outcome.failures and not outcome.succeeded
    assert [worker.signals for worker in workers] == [[signal.SIGTERM], [signal.SIGTERM]]
    assert [result.position for result in outcome.results] == [UNKNOWN, UNKNOWN]


def test_a_hang_another_node_found_takes_the_stacks_and_stops_without_telling_again() -> None:
    heard: list[object] = []
    outcome, workers = run_group(
        {},
        on_hang=heard.append,
        on_stacks=heard.append,
        before_run=lambda group: group.request_stop("node 1: no output", hung=True),
    )
    assert outcome.hang is not None and not outcome.hang.found_here
    assert heard == [outcome.hang] and outcome.stop_reason == "node 1: no output"
    assert [worker.signals for worker in workers] == [[signal.SIGTERM], [signal.SIGTERM]]


def test_a_worker_that_ended_before_a_stop_was_asked_failed_on_its_own() -> None:
    """The exit and the stop request reach the loop in one batch, the request first (it was sent
    before the worker started): the exit is still read first, as the failure it was."""
    outcome, (peer, _) = run_group({1: {"exit_code": 3}}, before_run=lambda group: group.request_stop("node 1 failed"))
    assert [result.local_rank for result in outcome.failures] == [1]
    assert [result.returncode for result in outcome.results] == [-signal.SIGTERM, 3]
    assert peer.signals == [signal.SIGTERM]


def test_without_a_timeout_a_silent_group_runs_on() -> None:
    timers: list[threading.Timer] = []

    def stop_later(group: WorkerGroup) -> None:
        timers.append(threading.Timer(0.5, group.request_stop, ["stopped from outside"]))
        timers[0].start()

    outcome, _ = run_group({}, before_run=stop_later)
    timers[0].join()
    assert outcome.hang is None and outcome.stop_reason == "stopped from outside"


@pytest.mark.parametrize(
    "kill_timeout, hang_timeout",
    [(1e308, None), (float("inf"), None), (30.0, float("inf")), (30.0, 1e308)],
    ids=["huge-grace", "endless-grace", "endless-hang-timeout", "huge-hang-timeout"],
)
def test_huge_or_endless_durations_are_waited_out_in_bounded_waits(
    kill_timeout: float, hang_timeout: float | None
) -> None:
    """``select`` refuses a wait past about 24 days: the loop waits in bounded steps."""
    outcome, (peer, _) = run_group({1: {"exit_code": 3}}, kill_timeout=kill_timeout, hang_timeout=hang_timeout)
    assert [result.returncode for result in outcome.results] == [-signal.SIGTERM, 3]
    assert peer.signals == [signal.SIGTERM]


def test_the_teardown_after_a_fault_sends_sigkill_whatever_its_grace() -> None:
    """A fault breaks the loop (here, reporting a failure); the teardown's wait, with a grace of
    1e308 s, must not fail before SIGKILL went out to every group."""
    started: list[FakeProcess] = []

    def start(worker_spec: WorkerSpec, stdout: StreamTarget, stderr: StreamTarget) -> FakeProcess:
        options = {"exit_code": 3} if worker_spec.local_rank == 1 else {}
        started.append(FakeProcess(worker_spec, stdout, stderr, **options))  # type: ignore[arg-type]
        return started[-1]

    def broken_report(result: WorkerResult) -> None:
        raise RuntimeError("the report broke")

    group = WorkerGroup([spec(0), spec(1)], kill_timeout=1e308, on_failure=broken_report, start_process=start)
    with pytest.raises(RuntimeError, match="the report broke"):
        group.run(FakeInbox())  # type: ignore[arg-type]
    assert [process.signals[-1] for process in started] == [signal.SIGKILL, signal.SIGKILL]


class EndsBeforeItsPipe(FakeProcess):
    """A worker whose exit is seen before the end of its stderr, as when a child it left holds the
    pipe a moment longer: both come in one batch of events, the exit first."""

    def end(self, returncode: int) -> None:
        if self.returncode is not None:
            return
        self.returncode = returncode
        os.write(self._exit_write, b"x")
        os.close(self._exit_write)
        if self._stderr_write is not None:
            os.close(self._stderr_write)


def test_a_pipe_closed_by_an_earlier_event_of_the_same_batch_is_not_read() -> None:
    """The exit drains the worker's pipes to their end and closes them; the pipe's own event, next
    in the batch, must not read the closed descriptor (EBADF, or another file under its number)."""
    started: list[FakeProcess] = []

    def start(worker_spec: WorkerSpec, stdout: StreamTarget, stderr: StreamTarget) -> FakeProcess:
        started.append(EndsBeforeItsPipe(worker_spec, stdout, stderr))
        return started[-1]

    inbox = FakeInbox()
    inbox.send(signal.SIGTERM)
    outcome = WorkerGroup([spec(0), spec(1)], start_process=start).run(inbox)  # type: ignore[arg-type]
    assert outcome.launcher_signal == signal.SIGTERM
    assert [result.returncode for result in outcome.results] == [-signal.SIGTERM, -signal.SIGTERM]


class FakeNotices:
    """The metadata server's notices as a watch reads them: a real pipe, the notices themselves in memory."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        self.pending: list[Notice] = []

    def send(self, notice: Notice) -> None:
        self.pending.append(notice)
        os.write(self._write, b"n")

    def read(self) -> list[Notice]:
        try:
            os.read(self.fd, 512)
        except BlockingIOError:
            pass
        received, self.pending = self.pending, []
        return received

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write)


def test_a_notice_that_the_vm_stops_sends_the_preemption_signal_to_every_worker(
    capfd: pytest.CaptureFixture[str],
) -> None:
    flush_consoles()  # the console writes from a thread of its own: what earlier tests said goes first
    capfd.readouterr()
    notices, told = FakeNotices(), []
    watch = NoticeWatch(notices, signal.SIGUSR1, lambda notice, sent: told.append((notice, sent)))  # type: ignore[arg-type]
    notices.send(NOTICES[0])
    # The workers save their work on SIGUSR1 and end.
    outcome, processes = run_group(
        {0: {"finishes_on": signal.SIGUSR1}, 1: {"finishes_on": signal.SIGUSR1}}, watches=[watch]
    )
    # First the notice's signal (the teardown of every group that follows sends SIGTERM to what is left).
    assert outcome.succeeded and [process.signals[0] for process in processes] == [signal.SIGUSR1] * 2
    assert told == [(NOTICES[0], signal.SIGUSR1)] and watch.stopping_notice == NOTICES[0]
    flush_consoles()
    assert "this VM is preempted and stops in about 30 s; sent SIGUSR1 to every worker" in capfd.readouterr().err
    watch.end()


def test_a_notice_between_two_groups_is_told_at_the_runs_end_with_no_signal() -> None:
    notices, told = FakeNotices(), []
    watch = NoticeWatch(notices, signal.SIGUSR1, lambda notice, sent: told.append((notice, sent)))  # type: ignore[arg-type]
    outcome, _ = run_group({0: {"exit_code": 0}, 1: {"exit_code": 0}}, watches=[watch])
    assert outcome.succeeded
    notices.send(NOTICES[1])
    watch.end()
    assert told == [(NOTICES[1], None)] and watch.stopping_notice == NOTICES[1]
