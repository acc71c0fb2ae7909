"""c10d's seating in-process, with a fake of torch's handler and a store in memory: what each of torch's
rendezvous errors becomes for this node (one LaunchError line, or JobEnded), the counts the host reads,
and the attempt's number. No real store and no process group."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import pytest
from torch.distributed import DistNetworkError, DistStoreError
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from xlarun.config import LaunchConfig, WorkerCommand
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError
from xlarun.rendezvous import JobEnded
from xlarun.rendezvous.c10d import C10dSeating
from xlarun.rendezvous.joining import Member, Seat
from xlarun.rendezvous.store import Client, JobKeys

KEYS = JobKeys("job")
WHERE = "10.0.0.1:29400"
# Node 0 served the job's store in attempt 3, which this node ran in.
AFTER_ATTEMPT_3 = Seat(
    attempt=3,
    node_rank=1,
    nnodes=2,
    rank_offset=1,
    world_size=2,
    master_addr="10.0.0.1",
    master_port=1234,
    store_node=0,
    change="",
)
ME = Member(agent=5, host="host-b", nproc=1)


class MemoryStore:
    """The store calls the seating and the round's seating make, in one thread: every key waited on exists."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        raise AssertionError("the seating never compares and sets: torch's handler does, on its own connection")

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        assert self.check(keys), f"would wait forever for {keys}"

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)


@dataclass(frozen=True)
class FakeRound:
    store: MemoryStore
    rank: int = 0
    world_size: int = 1


class FakeHandler:
    """torch's handler: each round fails with ``error``, or (``None``) seats this node alone.

    While a round forms it notes what the host would read: the unseated count and the waiting nodes.
    """

    def __init__(self, error: Exception | None, job_store: MemoryStore) -> None:
        self.error = error
        self.job_store = job_store
        self.seating: C10dSeating | None = None
        self.unseated_meanwhile: list[int] = []
        self.waiting_meanwhile: list[int] = []

    def next_rendezvous(self) -> FakeRound:
        assert self.seating is not None and self.seating.nodes_waiting is not None
        self.unseated_meanwhile.append(self.job_store.add(KEYS("unseated"), 0))
        self.waiting_meanwhile.append(self.seating.nodes_waiting())
        if self.error is not None:
            raise self.error
        return FakeRound(MemoryStore())

    def num_nodes_waiting(self) -> int:
        return 2

    def set_closed(self) -> None:
        raise AssertionError("only the host closes the round, when it leaves")


def no_connection(host: str, port: int, timeout: float) -> Client:
    raise AssertionError("off a terminal, the seating opens no connection of its own")


def joined_seating(error: Exception | None) -> tuple[C10dSeating, FakeHandler, MemoryStore]:
    """The seating of a node that joined a job of 2 to 4 nodes at WHERE (``join_timeout`` 30 s)."""
    config = LaunchConfig(
        command=WorkerCommand("train.py", ()),
        min_nodes=2,
        max_nodes=4,
        rdzv_backend="c10d",
        rdzv_endpoint=WHERE,
        rdzv_id="job",
        rdzv_conf={"join_timeout": "30"},
    )
    status = StatusLine()
    status.tty = False
    store = MemoryStore()
    handler = FakeHandler(error, store)
    seating = C10dSeating(config, KEYS, status, no_connection, lambda *_: handler)
    handler.seating = seating
    seating.joined(store, "10.0.0.1", 29400, 5, {"rounds": MemoryStore()})
    return seating, handler, store


def never_lead(attempt: int, members: list[Member]) -> list[Seat]:
    raise AssertionError("no round formed: nobody leads")


def seat_error(error: Exception, previous: Seat | None) -> BaseException:
    """What this node's seating raises when torch's round fails with ``error``; always one line."""
    seating, _, store = joined_seating(error)
    with pytest.raises((LaunchError, JobEnded)) as raised:
        seating.seat(store, ME, previous, never_lead)
    assert raised.value.__suppress_context__, "torch's error must not follow the line as a traceback"
    return raised.value


def test_a_first_round_that_times_out_counts_the_nodes_that_came() -> None:
    error = seat_error(RendezvousTimeoutError(), None)

    assert type(error) is LaunchError
    assert str(error) == (
        f"1 of 2 nodes joined in 30 s at {WHERE} (run id 'job'): start the missing nodes "
        "with the same --rdzv-endpoint and --rdzv-id"
    )


def test_a_later_round_that_times_out_says_too_few_came_back() -> None:
    error = seat_error(RendezvousTimeoutError(), AFTER_ATTEMPT_3)

    assert type(error) is LaunchError
    assert str(error) == "fewer than 2 nodes (the minimum of --nnodes) came back within 30 s after attempt 3"


@pytest.mark.parametrize("closed", [RendezvousClosedError, RendezvousGracefulExitError])
def test_a_round_closed_before_this_node_had_a_seat_ends_it_with_nothing_to_run(closed: type[Exception]) -> None:
    error = seat_error(closed(), None)

    assert type(error) is JobEnded
    assert str(error) == (
        f"the job of run id 'job' at {WHERE} ended while this node waited for a place in it; nothing to run"
    )


@pytest.mark.parametrize("closed", [RendezvousClosedError, RendezvousGracefulExitError])
def test_a_round_closed_after_this_node_ran_is_a_failure(closed: type[Exception]) -> None:
    error = seat_error(closed(), AFTER_ATTEMPT_3)

    assert type(error) is LaunchError
    assert str(error) == f"the rendezvous of run id 'job' at {WHERE} is closed: its job has ended"


def connection_error(cause: Exception | None) -> RendezvousConnectionError:
    """As torch raises it: a message that points at the inner exception, if there is one."""
    error = RendezvousConnectionError("The connection to the C10d store has failed. See inner exception for details.")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("cause", "said"),
    [
        (DistNetworkError("Connection reset by peer"), "Connection reset by peer"),
        (DistStoreError("Socket Timeout\nException raised from recvBytes"), "Socket Timeout"),
        (None, "The connection to the C10d store has failed. See inner exception for details."),
    ],
)
@pytest.mark.parametrize(
    ("previous", "node"), [(None, "the node hosting it"), (AFTER_ATTEMPT_3, "node 0, which hosted it,")]
)
def test_a_lost_connection_says_what_the_store_said_and_which_node_hosted_it(
    cause: Exception | None, said: str, previous: Seat | None, node: str
) -> None:
    error = seat_error(connection_error(cause), previous)

    assert type(error) is LaunchError
    assert str(error) == f"lost the rendezvous store at {WHERE} ({said}): {node} stopped"


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (RendezvousStateError("The rendezvous state is corrupt.\nDetails follow."), "The rendezvous state is corrupt."),
        (RendezvousError(), "RendezvousError"),
    ],
)
def test_any_other_rendezvous_error_is_one_line_at_the_endpoint(error: Exception, detail: str) -> None:
    raised = seat_error(error, None)

    assert type(raised) is LaunchError
    assert str(raised) == f"rendezvous at {WHERE} failed: {detail}"


def lead_alone(attempt: int, members: list[Member]) -> list[Seat]:
    return [AFTER_ATTEMPT_3]


def test_a_node_counts_as_unseated_only_while_it_waits_for_its_first_seat() -> None:
    seating, handler, store = joined_seating(None)
    first = seating.seat(store, ME, None, lead_alone)
    seating.seat(store, ME, first, lead_alone)

    assert handler.unseated_meanwhile == [1, 0]
    assert store.add(KEYS("unseated"), 0) == 0


def test_a_node_whose_first_round_failed_no_longer_counts_as_unseated() -> None:
    seating, handler, store = joined_seating(RendezvousTimeoutError())
    with pytest.raises(LaunchError):
        seating.seat(store, ME, None, never_lead)

    assert handler.unseated_meanwhile == [1]
    assert store.add(KEYS("unseated"), 0) == 0


def test_the_monitor_reads_no_waiting_nodes_while_a_round_forms() -> None:
    seating, handler, store = joined_seating(RendezvousTimeoutError())
    assert seating.nodes_waiting is not None
    with pytest.raises(LaunchError):
        seating.seat(store, ME, None, never_lead)

    assert handler.waiting_meanwhile == [0]
    assert seating.nodes_waiting() == 2


def test_each_rounds_leader_numbers_the_attempt_from_the_jobs_count() -> None:
    seating, _, store = joined_seating(None)
    numbers: list[int] = []

    def lead(attempt: int, members: list[Member]) -> list[Seat]:
        numbers.append(attempt)
        assert members == [ME]
        return [AFTER_ATTEMPT_3]

    previous = None
    for _ in range(2):
        previous = seating.seat(store, ME, previous, lead)

    assert numbers == [0, 1]
    assert store.add(KEYS("attempts"), 0) == 2
