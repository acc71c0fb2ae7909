"""The agent: runs attempts of the worker group until it succeeds, fails for good or is stopped.

Usage::

    end = Agent(config, rendezvous, environ, variables_for).run()    # a RunEnd: end.exit_code, end.root_cause

``variables_for(node, local_rank, error_file)`` gives what xlarun sets for one worker (the
planning layer's :func:`~xlarun.planning.environment.worker_variables`, bound to the device
plan); the agent calls it at each attempt, as the ranks may have changed.

One attempt is: meet the other nodes (a no-op on one node), build the worker specs,
supervise the group. A failed attempt with restarts left starts the group again with
``TORCHELASTIC_RESTART_COUNT`` one higher and a fresh ``attempt_<n>`` log directory.
"""

from __future__ import annotations

import os
import re
import selectors
import threading
import time
from collections.abc import Callable, Mapping

from xlarun import structs
from xlarun.config import LaunchConfig
from xlarun.console import say
from xlarun.contract import read_error_file
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import FailureRecord, signal_name, stderr_excerpt
from xlarun.host.devices import has_metadata_server
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import JobEnded, NodeStacks, Rendezvous
from xlarun.structs import Struct
from xlarun.supervision.end import HangCause, RootCause, RunEnd
from xlarun.supervision.events import NO_EVENTS, EventBus
from xlarun.supervision.group import GroupOutcome, Hang, WorkerGroup, WorkerResult
from xlarun.supervision.guard import OrphanGuard
from xlarun.supervision.logs import make_run_log_dir, plan_attempt_logs, plan_worker_logs
from xlarun.supervision.process import WorkerSpec
from xlarun.supervision.relay import STEPS_FILE, step_log_on
from xlarun.supervision.report import RunSummary, failure_of, host_name, print_root_cause, root_cause_record
from xlarun.supervision.signals import SUSPEND_SIGNAL, SignalInbox, suspend_self
from xlarun.supervision.watches import NoticeWatch

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")


WorkerVariables = Callable[[NodeAssignment, int, str], Mapping[str, str]]
"""What xlarun sets for one worker, from its node's assignment, its local rank and its error file."""


class Agent:
    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: Rendezvous,
        environ: Mapping[str, str],
        variables_for: WorkerVariables,
        events: EventBus = NO_EVENTS,
        end_facts: Callable[[], Mapping[str, Any]] | None = None,
    ):
        self.config = config
        self.end_facts = end_facts
        """What the launch adds to its last event and the summary once the run ended (a compile cache's
        entries after the run)."""
        self.events = events
        """Where the run's events go; the agent closes it at the run's end, before the summary counts its drops."""
        self._attempt = 0
        """The attempt under way, as the events number it."""
        self.rendezvous = rendezvous
        self.environ = dict(environ)
        self.variables_for = variables_for
        self._summary: RunSummary | None = None
        """The run's attempts, from the first; the summary file's record with the run's end."""
        self._root_cause: RootCause | None = None
        """The run's root cause, from the moment it is known (a fault while it is reported keeps it)."""
        self._run_dir = ""
        self._notices: NoticeWatch | None = None
        """The metadata server's preemption and maintenance notices, where this host has one."""

    def run(self) -> RunEnd:
        """Run the attempts; how the run ended. A launcher fault is raised as a :class:`LaunchError`
        once the summary file has its record."""
        guard = OrphanGuard().start()
        self._notices = self._watch_notices()
        try:
            with SignalInbox(self.config.signals_to_handle.signals) as inbox:
                end = self._attempts(inbox, guard)
        except LaunchError as error:
            # The run ends in one line from the CLI; CI scripts still get their record.
            self._finish(RunEnd.launcher_error(str(error), error.exit_code, self._root_cause))
            raise
        except UsageError:
            if self._notices is not None:
                self._notices.end()
            raise  # bad input found late (a --log-dir that is a file): one line, exit 2
        except Exception as error:
            # A fault of the launcher's own (a bug; a disk full where it writes): the worker group
            # tore itself down before the exception left it, so only the record and the code remain:
            # the root cause's, where a worker failed before the fault.
            fault = LaunchError(f"internal error: {type(error).__name__}: {error}")
            if self._root_cause is not None:
                fault.exit_code = self._root_cause.exit_status
            self._finish(RunEnd.launcher_error(str(fault), fault.exit_code, self._root_cause))
            raise fault from error
        finally:
            guard.release()
            self.rendezvous.close()
        return self._finish(end)

    def _watch_notices(self) -> NoticeWatch | None:
        """The metadata server's notices, watched where this host has one: elsewhere nothing is loaded or started."""
        if not has_metadata_server(self.environ):
            return None
        from xlarun.host.metadata import Notice, Notices

        def tell(notice: Notice, sent: int | None) -> None:
            self.events.emit(
                "preemption",
                self._attempt,
                notice=f"instance/{notice.key}",
                value=notice.value,
                stops=notice.stops,
                signal=signal_name(sent) if sent is not None else None,
            )

        return NoticeWatch(Notices(self.environ), self.config.preemption_signal, tell)

    def _finish(self, end: RunEnd) -> RunEnd:
        """The run's last event, the event sinks flushed (within :data:`EVENTS_FLUSH_S`), then the summary file;
        the end as they record it (preempted where the metadata server said the VM stops)."""
        if self._notices is not None:
            self._notices.end()
            if self._notices.stopping_notice is not None:
                end = end.preempted()
        events_dropped = None
        facts = self.end_facts() if self.end_facts is not None else {}
        if self.events.active:
            root_cause = None if end.root_cause is None else root_cause_record(end.root_cause)
            self.events.emit(
                "launch.finished",
                self._attempt,
                **{"process.exit.code": end.exit_code},
                result=end.result,
                root_cause=root_cause,
                **facts,
            )
            self.events.close(EVENTS_FLUSH_S)
            events_dropped = self.events.dropped
        if self.config.summary_file:
            (self._summary or RunSummary(run_id=self.config.rdzv_id)).write(
                self.config.summary_file, end, events_dropped, facts
            )
        return end

    def _attempts(self, inbox: SignalInbox, guard: OrphanGuard) -> RunEnd:
        attempt = restarts = 0
        while True:
            began = time.monotonic()
            self.events.emit("rendezvous.started", attempt, round=attempt)
            try:
                node = wait_interruptibly(
                    inbox, self.rendezvous.waits, self.rendezvous.assign, attempt, self.config.nproc_per_node
                )
            except JobEnded as ended:
                say(str(ended))
                return RunEnd.not_needed()
            if isinstance(node, Interrupted):
                return self._stopped_by_signal(node.signal_number, "while waiting for the other nodes")
            # Several nodes number attempts for the whole job: a node that joins late takes the job's number.
            attempt = self._attempt = node.restart_count
            self.events.identify(run_id=node.run_id, node_rank=node.node_rank)
            self.events.emit(
                "rendezvous.completed",
                attempt,
                round=attempt,
                members=node.nnodes,
                duration_s=round(time.monotonic() - began, 6),
            )
            if self._summary is None:
                self._summary = RunSummary(run_id=node.run_id)
                self._run_dir = make_run_log_dir(self.config.log_dir, node.run_id)
            self._summary.restarts = attempt
            records: list[FailureRecord] = []
            group = WorkerGroup(
                self._specs(node, attempt),
                kill_timeout=self.config.shutdown_timeout,
                guard=guard,
                on_failure=self._publisher(node, records),
                hang_timeout=self.config.hang_timeout,
                on_hang=self._hang_announcer(attempt),
                on_stacks=self._stacks_publisher(node, attempt),
                on_start=self._start_events(attempt),
                on_exit=self._exit_events(attempt),
                watches=() if self._notices is None else (self._notices,),
            )
            self.rendezvous.watch(group.request_stop)
            outcome = group.run(inbox)
            self._summary.add_attempt(attempt, outcome.results, self.rendezvous.attempt_record())
            if outcome.launcher_signal is not None:
                return self._stopped_by_signal(outcome.launcher_signal)
            attempt_end = wait_interruptibly(
                inbox, self.rendezvous.waits, self.rendezvous.finish_attempt, outcome.succeeded
            )
            if isinstance(attempt_end, Interrupted):
                return self._stopped_by_signal(attempt_end.signal_number, "while waiting for the other nodes")
            if attempt_end.succeeded:
                return RunEnd.succeeded()
            attempt += 1
            if attempt_end.admitting:
                self.events.emit(
                    "restart", attempt - 1, restarts_left=self.config.max_restarts - restarts, admitting=True
                )
                continue  # torchrun's rule: letting waiting nodes in spends no restart
            failures = self._failures(records, node)
            lost = attempt_end.lost_node
            if lost is not None:
                self.events.emit(
                    "node.lost", attempt - 1, node_rank=lost.node_rank, host=lost.host, reason=lost.message
                )
            # A failure the lost node itself published came before it went silent: that stays the root cause.
            if lost is not None and failures and failures[0].node_rank == lost.node_rank:
                lost = None
            if restarts >= self.config.max_restarts:
                if outcome.hang is not None:
                    return self._hung(node, outcome.hang)
                if lost is not None:
                    return self._reported(RunEnd.node_lost(lost, failures))
                if attempt_end.lost and not failures:
                    raise LaunchError(attempt_end.lost)
                return self._fail(failures, outcome)
            restarts += 1
            self.events.emit("restart", attempt - 1, restarts_left=self.config.max_restarts - restarts, admitting=False)
            if outcome.hang is not None:
                how = f"hung ({outcome.hang.reason})"
                if outcome.hang.positions:
                    from xlarun.supervision.stacks import describe_positions  # loaded only when a run hangs

                    say(f"where the ranks of attempt {attempt - 1} stood: {describe_positions(outcome.hang.positions)}")
            else:
                why = (
                    lost.message
                    if lost is not None
                    else describe(failures[0])
                    if failures
                    else attempt_end.lost or outcome.stop_reason or "stopped"
                )
                how = f"failed ({why})"
            say(
                f"attempt {attempt - 1} {how}; restarting the worker group "
                f"(restart {restarts} of {self.config.max_restarts})"
            )

    def _publisher(self, node: NodeAssignment, records: list[FailureRecord]) -> Callable[[WorkerResult], None]:
        """Adds a local failure to this attempt's ``records`` the moment it is seen (so in the order
        the group saw them) and tells the other nodes (if any)."""

        def publish(result: WorkerResult) -> None:
            if result.oom_killed:
                self.events.emit("oom.killed", node.restart_count, rank=result.rank, peak_rss_mib=result.peak_rss_mib)
            record = failure_of(result, node.node_rank, node.nnodes)
            records.append(record)
            self.rendezvous.publish_failure(record)

        return publish

    def _stacks_publisher(self, node: NodeAssignment, attempt: int) -> Callable[[Hang], None]:
        """Shares where this node's ranks stood in a hung attempt, the moment their stacks are taken."""

        def publish(hang: Hang) -> None:
            self.events.emit(
                "hang.stacks", attempt, stacks_files={str(rank): path for rank, path in hang.stacks_files.items()}
            )
            self.rendezvous.publish_stacks(node_stacks(node, hang))

        return publish

    def _hang_announcer(self, attempt: int) -> Callable[[str], None]:
        """Tells the other nodes this node found the job hung."""

        def announce(reason: str) -> None:
            self.events.emit("hang.suspected", attempt, reason=reason)
            self.rendezvous.announce_hang(reason)

        return announce

    def _start_events(self, attempt: int) -> Callable[[WorkerResult], None] | None:
        if not self.events.active:
            return None

        def started(result: WorkerResult) -> None:
            self.events.emit(
                "worker.started", attempt, rank=result.rank, local_rank=result.local_rank, **{"process.pid": result.pid}
            )

        return started

    def _exit_events(self, attempt: int) -> Callable[[WorkerResult, bool], None] | None:
        if not self.events.active:
            return None

        def exited(result: WorkerResult, failed: bool) -> None:
            number = result.signal_number  # a signal's end has no exit code, as in the summary file
            recorded = read_error_file(result.error_file) if result.returncode else None
            self.events.emit(
                "worker.exited",
                attempt,
                rank=result.rank,
                local_rank=result.local_rank,
                **{
                    "process.pid": result.pid,
                    "process.exit.code": None if number else result.returncode,
                    "error.type": recorded and error_type(recorded.message),
                },
                signal=signal_name(number) if number else None,
                expected=not failed,
                peak_rss_mib=result.peak_rss_mib,
                cpu_s=result.cpu_s,
            )

        return exited

    def _specs(self, node: NodeAssignment, attempt: int) -> list[WorkerSpec]:
        specs = []
        try:
            matching = plan_attempt_logs(self.config, self._run_dir, attempt)
            logs_by_rank = [
                plan_worker_logs(
                    self.config, self._run_dir, attempt, local_rank, node.global_rank(local_rank), matching
                )
                for local_rank in range(node.local_world_size)
            ]
        except OSError as error:
            raise LaunchError(
                f"cannot make the log directory of attempt {attempt} in {self._run_dir}: {error.strerror or error}"
            ) from None
        for local_rank, logs in enumerate(logs_by_rank):
            rank = node.global_rank(local_rank)
            variables = self.variables_for(node, local_rank, logs.error_file)
            env = {**self.environ, **variables}
            if step_log_on(variables):
                # The step log xlarun asked for: its lines are counted, and kept out of the console and the logs.
                # Its count is kept beside the worker's logs, for xlarun --status.
                steps_file = os.path.join(os.path.dirname(logs.error_file), STEPS_FILE)
                stderr = structs.replace(logs.stderr, relay=True, step_log=True, steps_file=steps_file)
                logs = structs.replace(logs, stderr=stderr)
            specs.append(
                WorkerSpec(
                    local_rank=local_rank, rank=rank, argv=self.config.command.argv(local_rank), env=env, logs=logs
                )
            )
        return specs

    def _failures(self, local: list[FailureRecord], node: NodeAssignment) -> list[FailureRecord]:
        first = self.rendezvous.first_failure()
        # Another node's failure came first: it is the root cause here too.
        if first is not None and first.node_rank != node.node_rank:
            return [first, *local]
        return local

    def _fail(self, failures: list[FailureRecord], outcome: GroupOutcome) -> RunEnd:
        if not failures:
            say(f"workers stopped: {outcome.stop_reason or 'stop requested'}")
            if outcome.start_failed and outcome.stop_reason is not None:
                return RunEnd.launcher_error(outcome.stop_reason)
            return RunEnd.failed([])
        stopped_with_errors = [
            stderr_excerpt(result.stderr_tail)
            for result in outcome.results
            if result.stderr_tail and all(result is not failed for failed in outcome.failures)
        ]
        return self._reported(RunEnd.failed(failures, stopped_with_errors))

    def _hung(self, node: NodeAssignment, hang: Hang) -> RunEnd:
        """The end of a hung attempt: where every rank stood (the job's, on node 0), and their stacks."""
        own = node_stacks(node, hang)
        nodes = self.rendezvous.job_stacks(own, STACKS_WAIT) if node.node_rank == 0 else [own]
        stood = {rank for stacks in nodes for rank in stacks.positions}
        missing = sorted(set(range(node.world_size)) - stood) if node.node_rank == 0 and node.nnodes > 1 else []
        return self._reported(RunEnd.hung(HangCause(hang.reason, tuple(nodes), node.nnodes, tuple(missing))))

    def _reported(self, end: RunEnd) -> RunEnd:
        """``end``, its root cause printed; that is the run's root cause from now on, should printing it fail."""
        self._root_cause = end.root_cause
        print_root_cause(end, self.config.command.script)
        return end

    def _stopped_by_signal(self, number: int, when: str = "") -> RunEnd:
        say(f"received {signal_name(number)} {when or 'and stopped the workers'}")
        return RunEnd.signalled(number)


EVENTS_FLUSH_S = 2.0
"""How long the run's end waits for the event sinks to take what is queued: a sink that cannot
(a stalled disk) costs its events, counted, not a late exit."""
_EXCEPTION_TYPE = r"([A-Za-z_][\w.]*):"
"""torch's ``@record`` writes the message as ``f"{type(e).__name__}: {e}"``."""


def error_type(message: str) -> str | None:
    """The exception type an error file's message opens with (``ValueError: ...``), or None."""
    match = re.match(_EXCEPTION_TYPE, message)
    return match.group(1) if match else None


STACKS_WAIT = 10.0
"""How long node 0 waits for the other nodes' stacks of a hung attempt: each takes them the moment it hears."""


def node_stacks(node: NodeAssignment, hang: Hang) -> NodeStacks:
    return NodeStacks(
        node_rank=node.node_rank, host=host_name(), positions=hang.positions, stacks_files=hang.stacks_files
    )


class Interrupted(Struct, frozen=True):
    signal_number: int


def wait_interruptibly(inbox: SignalInbox, waits: bool, call: Callable[..., T], *args: Any) -> T | Interrupted:
    """Run a rendezvous step so a stop signal still ends the launcher: one that ``waits`` for other nodes in a
    helper thread, watched with the signals; one that never does (a single node's) here, its signals read
    once it returned, without a thread to start.

    SIGUSR1/SIGUSR2 have no workers to go to here and are dropped.
    """
    if not waits:
        value = call(*args)
        stop = stop_received(inbox)
        return value if stop is None else Interrupted(stop)
    box: dict[str, Any] = {}
    done_read, done_write = os.pipe()

    def target() -> None:
        try:
            box["value"] = call(*args)
        except BaseException as error:  # re-raised in the caller's thread
            box["error"] = error
        finally:
            try:
                os.write(done_write, b"x")
            except OSError:  # the caller stopped waiting (a signal) and closed its end
                pass
            os.close(done_write)

    threading.Thread(target=target, name="xlarun-rendezvous-call", daemon=True).start()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(done_read, selectors.EVENT_READ)
            selector.register(inbox.fd, selectors.EVENT_READ)
            while True:
                selector.select()
                stop = stop_received(inbox)
                if stop is not None:
                    return Interrupted(stop)
                if "value" in box or "error" in box:
                    break
    finally:
        os.close(done_read)
    if "error" in box:
        raise box["error"]
    return box["value"]


def stop_received(inbox: SignalInbox) -> int | None:
    """The first stop signal the inbox got, if any; Ctrl-Z suspends the launcher (no workers to take along)."""
    received = inbox.drain()
    if SUSPEND_SIGNAL in received:
        suspend_self()
    stops = [number for number in received if number in inbox.stop_signals]
    return stops[0] if stops else None


def describe(failure: FailureRecord) -> str:
    if failure.signal is not None:
        how = f"was killed by {failure.signal}"
    else:
        how = f"exited with code {failure.returncode}"
    where = f" on node {failure.node_rank}" if failure.node_rank else ""
    return f"rank {failure.rank}{where} {how}"
