"""How a run ended, as one value: :class:`RunEnd`, whose root cause is a worker's
:class:`~xlarun.failures.FailureRecord`, a :class:`HangCause` or a node lost
(:class:`~xlarun.rendezvous.LostNode`).

Usage::

    end = Agent(config, rendezvous, environ, variables_for).run()
    sys.exit(end.exit_code)

The agent makes it; :func:`~xlarun.supervision.report.root_cause_report` prints its root cause,
:meth:`~xlarun.supervision.report.RunSummary.write` records it in the summary file, and the command
line exits with its code. Each way a run ends has its constructor, which works out the exit code:
the root cause's status (:func:`~xlarun.failures.exit_status`), 128+N for the launcher's signal N,
:data:`~xlarun.failures.HUNG_EXIT_CODE` for a hang, 1 for a node lost (torchrun's code for a lost agent:
:data:`~xlarun.rendezvous.LOST_NODE_EXIT_CODE`).
"""

from __future__ import annotations

from collections.abc import Sequence

from xlarun.exceptions import LaunchError
from xlarun.failures import HUNG_EXIT_CODE, FailureRecord, signal_exit_status
from xlarun.rendezvous import LostNode, NodeStacks
from xlarun.structs import Struct, replace

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Literal, TypeAlias

Result: TypeAlias = 'Literal["succeeded", "failed", "hung", "signalled", "launcher_error", "not_needed", "preempted"]'
"""The summary file's ``result``: ``not_needed`` is a node the job ended without (an elastic job
that finished before it was let in); ``preempted`` a run that did not succeed after the metadata server
said the VM stops (:meth:`RunEnd.preempted`)."""


class HangCause(Struct, frozen=True):
    """A hung run's root cause: what found the workers hung, and where the job's ranks stood."""

    message: str
    """What found them hung: ``no output for 600 s and no CPU use``, or another node's word for it."""
    nodes: tuple[NodeStacks, ...]
    """Each node's ranks and stacks files, by node rank: every node's on node 0, this node's alone elsewhere."""
    nnodes: int = 1
    missing: tuple[int, ...] = ()
    """The job's ranks no node told where they stood (looked for on node 0 of several only)."""

    @property
    def exit_status(self) -> int:
        return HUNG_EXIT_CODE

    @property
    def positions(self) -> dict[int, str]:
        """Where each rank stood, by global rank."""
        return dict(sorted((rank, where) for stacks in self.nodes for rank, where in stacks.positions.items()))

    @property
    def stacks_files(self) -> dict[int, str]:
        """The dump file of each rank whose stacks were taken (on its own node's host), node by node."""
        return {rank: path for stacks in self.nodes for rank, path in sorted(stacks.stacks_files.items())}


RootCause = FailureRecord | HangCause | LostNode


class RunEnd(Struct, frozen=True):
    """How the run ended; see the module docstring. Built by its constructors, which agree on the exit code."""

    result: Result
    exit_code: int
    root_cause: RootCause | None = None
    """The first failure observed (this node's or another's), the hang, or the node lost before the
    attempt ended; None where no worker is to blame."""
    launcher_signal: int | None = None
    """The signal that stopped the launcher, by number."""
    error: str | None = None
    """Why the launcher could not carry on, in one line."""
    other_failures: tuple[FailureRecord, ...] = ()
    """The failures observed after the root cause, in the order they were seen; the report lists them."""
    stopped_with_errors: tuple[str, ...] = ()
    """What each worker of this node that exited with an error while the group was being stopped last wrote
    to stderr (:func:`~xlarun.failures.stderr_excerpt`). Not failures (torchrun 2.9's report lists none of
    them), but their words can say why the attempt failed: the split CPU world (:mod:`xlarun.launching.node`)."""

    @classmethod
    def succeeded(cls) -> RunEnd:
        return cls("succeeded", 0)

    @classmethod
    def not_needed(cls) -> RunEnd:
        return cls("not_needed", 0)

    @classmethod
    def failed(cls, failures: Sequence[FailureRecord], stopped_with_errors: Sequence[str] = ()) -> RunEnd:
        """Workers failed, the root cause first; none: the group was stopped with no worker to blame (exit 1)."""
        if not failures:
            return cls("failed", 1)
        return cls(
            "failed",
            failures[0].exit_status,
            failures[0],
            other_failures=tuple(failures[1:]),
            stopped_with_errors=tuple(stopped_with_errors),
        )

    @classmethod
    def node_lost(cls, lost: LostNode, failures: Sequence[FailureRecord] = ()) -> RunEnd:
        """A node fell silent before the attempt ended; ``failures``: the workers that failed after it
        (their peers' collectives lost it), in the order they were seen."""
        return cls("failed", lost.exit_status, lost, other_failures=tuple(failures))

    @classmethod
    def hung(cls, cause: HangCause) -> RunEnd:
        return cls("hung", cause.exit_status, cause)

    @classmethod
    def signalled(cls, number: int) -> RunEnd:
        return cls("signalled", signal_exit_status(number), launcher_signal=number)

    @classmethod
    def launcher_error(
        cls, error: str, exit_code: int = LaunchError.exit_code, root_cause: RootCause | None = None
    ) -> RunEnd:
        """The launcher could not carry on; ``root_cause`` is what had already failed, if anything."""
        return cls("launcher_error", exit_code, root_cause, error=error)

    def preempted(self) -> RunEnd:
        """This end, after the metadata server said the VM stops: ``preempted``, with the same exit code and
        root cause, unless the run succeeded (or was not needed) all the same."""
        return self if self.result in ("succeeded", "not_needed") else replace(self, result="preempted")

    @property
    def failure(self) -> FailureRecord | None:
        """The failed worker at the root of the run's end, if that is how it ended."""
        return self.root_cause if isinstance(self.root_cause, FailureRecord) else None
