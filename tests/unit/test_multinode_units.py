"""The multi-node rendezvous's parts in-process, against an in-memory store: seating, the news of an
attempt's end, the monitor's judgement of silence, heartbeats that fail or hang, membership lines."""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
import time
from collections.abc import Iterator

import pytest

from xlarun import structs
from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import FailureRecord
from xlarun.rendezvous import AttemptEnd, LostNode, NodeStacks
from xlarun.rendezvous.joining import (
    Member,
    NodePlan,
    Roster,
    Seat,
    check_job,
    membership_change,
    read_roster,
    seat_attempt,
    take_seat,
)
from xlarun.rendezvous.node import failure_record
from xlarun.rendezvous.store import JobKeys, token_digest
from xlarun.rendezvous.watching import Heartbeat, Monitor, News, Watchdog, announce

KEYS = JobKeys("job")


class MemoryStore:
    """The store calls the rendezvous makes, in memory; ``wait`` blocks until the keys exist."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.stall = 0.0
        self.hang = threading.Event()

    def _put(self, key: str, value: bytes) -> None:
        with self.changed:
            self.data[key] = value
            self.changed.notify_all()

    def set(self, key: str, value: str) -> None:
        self._put(key, value.encode())

    def get(self, key: str) -> bytes:
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        if self.hang.is_set():
            threading.Event().wait()
        with self.changed:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.changed.notify_all()
            return value

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.changed:
            current = self.data.get(key)
            if (current is None and expected == "") or current == expected.encode():
                self.data[key] = desired.encode()
                self.changed.notify_all()
            return self.data[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.check(keys), timeout.total_seconds()):
                raise TimeoutError(f"no {keys}")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        time.sleep(self.stall)
        return [self.data[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        for key, value in zip(keys, values, strict=True):
            self._put(key, value.encode())


def wait_until(check, what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def test_every_node_gets_its_seat_from_the_leader_in_node_rank_order() -> None:
    store = MemoryStore()
    seats: dict[int, Seat] = {}
    # Node 1 runs three workers, the others one: global ranks follow node ranks.
    members = {0: Member(7, "host-a", 1), 1: Member(3, "host-b", 3), 2: Member(9, "host-c", 1)}

    def lead(records: list[Member]) -> list[Seat]:
        assert records == [members[0], members[1], members[2]]
        offsets = [0, 1, 4]
        return [
            Seat(
                attempt=0,
                node_rank=rank,
                nnodes=3,
                rank_offset=offsets[rank],
                world_size=5,
                master_addr="a",
                master_port=1,
                store_node=0,
                change="",
            )
            for rank in range(3)
        ]

    def node(rank: int) -> None:
        seats[rank] = take_seat(
            store,
            "attempt_0/",
            rank,
            3,
            members[rank],
            lead,
            time.monotonic() + 30,
            StatusLine(),
            "waiting for nodes",
            "joined",
        )

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (2, 0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [(seats[rank].node_rank, seats[rank].rank_offset, seats[rank].world_size) for rank in range(3)] == [
        (0, 0, 5),
        (1, 1, 5),
        (2, 4, 5),
    ]


def test_nodes_with_places_in_a_tpu_slice_are_ranked_by_them_not_by_the_rounds_order() -> None:
    store = MemoryStore()
    store.set(KEYS("host_agent"), "9")
    # The round's order: host-c, host-a, host-b; their worker numbers in the slice: 2, 0, 1.
    members = [Member(9, "host-c", 4, place=2), Member(7, "host-a", 4, place=0), Member(3, "host-b", 4, place=1)]
    seats = seat_attempt(store, KEYS, 0, members, "host-c", 1234)
    assert [(seat.node_rank, seat.rank_offset, seat.world_size) for seat in seats] == [
        (2, 8, 12),
        (0, 0, 12),
        (1, 4, 12),
    ]
    assert [member.host for member in read_roster(store, KEYS, 0).members] == ["host-a", "host-b", "host-c"]
    assert seats[0].store_node == 2
    # Without a place for every node the round's order stands; the job's start is set once, for every attempt.
    later = seat_attempt(store, KEYS, 1, [*members[:2], Member(4, "host-d", 4)], "host-c", 1234)
    assert [seat.node_rank for seat in later] == [0, 1, 2]
    assert {seat.job_started_ns for seat in [*seats, *later]} == {seats[0].job_started_ns} != {0}


def test_the_first_news_of_an_attempt_is_the_one_every_node_reads() -> None:
    store = MemoryStore()
    announce(store, KEYS, 3, News("failure", "rank 2 on node 1 failed (exit code 3)"))
    announce(store, KEYS, 3, News("done"))
    news = News.decode(store.get(KEYS.attempt(3, "end")))

    assert news == News("failure", "rank 2 on node 1 failed (exit code 3)")
    assert news.end() == AttemptEnd(succeeded=False)
    assert News.decode(News("done").encode().encode()).end() == AttemptEnd(succeeded=True)
    assert News("lost", "node 2 stopped responding").end() == AttemptEnd(False, lost="node 2 stopped responding")
    assert News("admit", "1 node waiting to join").end() == AttemptEnd(False, admitting=True)


def test_membership_changes_name_the_nodes_that_left_and_came() -> None:
    before = Roster((Member(1, "a", 1), Member(2, "b", 1), Member(3, "c", 1)))
    after = Roster((Member(1, "a", 1), Member(2, "b", 1)))
    late = Roster((Member(1, "a", 1), Member(4, "d", 1), Member(2, "b", 1)))

    assert membership_change(before, after) == "node 2 (c) left"
    assert membership_change(after, late) == "d joined as node 1"
    assert membership_change(before, before) == ""
    assert Roster.decode(late.encode().encode()) == late


@contextlib.contextmanager
def watching(store: MemoryStore, *beats: threading.Event) -> Iterator[Monitor]:
    """A monitor of attempt 0 (:func:`start_monitor`) for the block's length; then the ``beats`` stop too."""
    monitor = start_monitor(store)
    try:
        yield monitor
    finally:
        for beat in beats:
            beat.set()
        monitor.stop()


def start_monitor(store: MemoryStore, timeout: float = 0.25, interval: float = 0.02) -> Monitor:
    """A monitor of attempt 0, whose nodes are agents 1 (node 0) and 2 (node 1)."""
    roster = Roster((Member(1, "a", 1), Member(2, "b", 1)))
    store.set(KEYS.attempt(0, "roster"), roster.encode())
    store.add(KEYS("published"), 1)
    for agent in (1, 2):
        store.add(KEYS.heartbeat(agent), 1)
    monitor = Monitor(store, KEYS, timeout, interval, StatusLine(), 0)
    monitor.start()
    return monitor


def beating(store: MemoryStore, agent: int, stop: threading.Event, interval: float = 0.02) -> threading.Thread:
    def beat() -> None:
        while not stop.wait(interval):
            store.add(KEYS.heartbeat(agent), 1)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread


def test_a_silent_node_is_declared_lost_once_and_its_rank_set_free() -> None:
    store = MemoryStore()
    stop = threading.Event()
    beating(store, 1, stop)
    with watching(store, stop) as monitor:
        wait_until(lambda: store.check([KEYS.attempt(0, "end")]), "the monitor to end the attempt")

    lost = LostNode(node_rank=1, host="b", silent_for=0.25)
    assert lost.message == (
        "node 1 (b) stopped responding: no heartbeat for 0.25 s "
        "(its launcher is gone, or its host stopped or was cut off)"
    )
    assert News.decode(store.get(KEYS.attempt(0, "end"))) == News("lost", lost.message)
    # Silent before the attempt ended: the root cause, for every node's report.
    assert LostNode.from_json(store.get(KEYS.attempt(0, "lost"))) == lost
    assert store.check([KEYS.attempt(0, "settled", rank) for rank in (0, 1)])
    assert store.check([KEYS("gone", 2)]) and not store.check([KEYS("gone", 1)])
    assert monitor.gone_from(0) == 1


def test_a_node_lost_after_the_attempt_ended_is_not_its_root_cause() -> None:
    store = MemoryStore()
    stop, late = threading.Event(), threading.Event()
    beating(store, 1, stop)
    beating(store, 2, late)
    with watching(store, stop) as monitor:
        store.set(KEYS.attempt(0, "end"), News("failure", "rank 0 on node 0 failed (exit code 3)").encode())
        time.sleep(0.3)  # node 1 beats on after the end, then falls silent
        late.set()
        wait_until(lambda: monitor.gone_from(0) == 1, "the monitor to find node 1 silent")

    assert not store.check([KEYS.attempt(0, "lost")])


def test_a_value_xlarun_did_not_write_is_named_and_the_watch_goes_on(capfd: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    stop = threading.Event()
    beating(store, 1, stop)
    # A refusal whose words are not UTF-8 and carry an escape sequence that would clear the screen.
    store.set(JobKeys.REFUSED, "1")
    store._put(JobKeys.REFUSED_LAST, b"\xff\x1b[2J")
    with watching(store, stop):
        wait_until(lambda: store.check([KEYS.attempt(0, "end")]), "the monitor to end the attempt")

    assert News.decode(store.get(KEYS.attempt(0, "end"))).kind == "lost"
    assert "xlarun: refused an agent: \\xff\\x1b[2J\n" in capfd.readouterr().err


def test_time_the_store_took_to_answer_is_nobodys_silence() -> None:
    # The store answers each read after 0.4 s, longer than the heartbeat timeout; the nodes beat on.
    store = MemoryStore()
    store.stall = 0.4
    stop = threading.Event()
    for agent in (1, 2):
        beating(store, agent, stop)
    monitor = start_monitor(store)
    time.sleep(1.3)
    stop.set()
    monitor.stop()

    assert not store.check([KEYS.attempt(0, "end")])


def test_a_node_that_left_on_purpose_is_not_silent() -> None:
    store = MemoryStore()
    stop = threading.Event()
    beating(store, 1, stop)
    monitor = start_monitor(store)
    store.set(KEYS.heartbeat(2), "left")
    time.sleep(0.5)
    stop.set()
    monitor.stop()

    assert not store.check([KEYS.attempt(0, "end")])


@pytest.mark.parametrize("failure", ["raises", "hangs"])
def test_a_store_that_fails_or_hangs_a_heartbeat_is_reported_lost_once(failure: str) -> None:
    store = MemoryStore()
    lost: list[BaseException] = []
    if failure == "raises":
        # Calling it raises TypeError, as a closed connection raises its error.
        store.add = None  # type: ignore[method-assign,assignment]
    else:
        store.hang.set()
    beat = Heartbeat(
        store, KEYS.heartbeat(1), interval=0.02, limit=0.2, on_lost=lost.append, watchdog=Watchdog(check_interval=0.05)
    )
    beat.start()
    wait_until(lambda: lost, "the heartbeat to report the store lost")
    # Past the watchdog's next looks: the loss is reported once.
    time.sleep(0.2)

    assert len(lost) == 1
    if failure == "raises":
        assert isinstance(lost[0], TypeError)
        beat.stop()
    else:
        assert isinstance(lost[0], TimeoutError) and str(lost[0]) == "no answer to a heartbeat for 0.2 s"


def test_the_seat_round_trips_through_the_store() -> None:
    seat = Seat(
        attempt=2,
        node_rank=1,
        nnodes=3,
        rank_offset=4,
        world_size=9,
        master_addr="10.0.0.1",
        master_port=41000,
        store_node=None,
        change="node 2 (c) left",
    )
    assert Seat.decode(seat.encode().encode()) == seat
    assert json.loads(seat.encode())["store_node"] is None


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe", b"{}", b'{"kind": "reboot", "reason": "x"}', b'{"kind": "hung", "reason": 3}', b"[1, 2"]
)
def test_an_end_record_xlarun_did_not_write_stops_the_attempt_and_says_so(raw: bytes) -> None:
    news = News.decode(raw)

    assert news.kind == "stopped" and news.reason.startswith("the attempt's end record in the store is not one xlarun")
    assert not any(character in news.reason for character in "\x1b\xff")


def test_a_forged_hang_reaches_no_terminal_raw() -> None:
    news = News.decode(json.dumps({"kind": "hung", "reason": "node 1: \x1b]0;owned\x07\x1b[2J"}).encode())

    assert news == News("hung", r"node 1: \x1b]0;owned\x07\x1b[2J")


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        b"{}",
        b'{"node_rank": "x", "host": "h", "silent_for": 3}',
        b'{"node_rank": 1, "host": 5, "silent_for": 3}',
        b'{"node_rank": 1, "host": "h", "silent_for": NaN}',
    ],
)
def test_a_lost_node_record_xlarun_did_not_write_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="not a lost node's record"):
        LostNode.from_json(raw)


def test_a_stacks_record_is_checked_and_escaped() -> None:
    stacks = NodeStacks(node_rank=1, host="b", positions={2: "train.py:9 \x1b[2J"}, stacks_files={2: "/r/2/stacks"})

    assert NodeStacks.from_json(stacks.to_json().encode()).positions == {2: r"train.py:9 \x1b[2J"}
    with pytest.raises(ValueError, match="not a node's stacks record"):
        NodeStacks.from_json(b'{"node_rank": 1, "host": "b", "positions": [], "stacks_files": {}}')


@pytest.mark.parametrize(
    "change", [{"rank": "1"}, {"returncode": 10**6}, {"host": None}, {"time": "now"}, {"surprise": 1}]
)
def test_a_failure_record_xlarun_did_not_write_is_none(change: dict[str, object]) -> None:
    record = structs.asdict(FailureRecord(rank=1, local_rank=0, returncode=3, pid=9, time=1.0, host="b\x1b[2J"))

    assert failure_record(json.dumps(record).encode()) == FailureRecord(
        rank=1, local_rank=0, returncode=3, pid=9, time=1.0, host=r"b\x1b[2J"
    )
    assert failure_record(json.dumps({**record, **change}).encode()) is None
    assert failure_record(b"\xff{") is None


def join_job(store: MemoryStore, serving: bool, plan: NodePlan, token: str = "", node: int = 0) -> int:
    return check_job(
        store, serving, "job", token, plan, (f"node {node}", "node 0"), "h:1", time.monotonic() + 5, StatusLine()
    )


def test_a_node_that_plans_other_slices_than_the_store_host_is_refused_as_a_usage_error() -> None:
    store = MemoryStore()
    join_job(store, True, NodePlan(4, 4, slices=2))

    assert join_job(store, False, NodePlan(4, 4, slices=2), node=1) == 0
    with pytest.raises(UsageError) as refused:
        join_job(store, False, NodePlan(6, 6, slices=3), node=2)

    line = (
        "node 2 plans 6 nodes (3 slices x 2 hosts) but node 0 plans 4 (2 slices x 2 hosts): "
        "every slice must have the same hosts"
    )
    assert str(refused.value) == line
    # The store's host hears of it as of any refused agent.
    assert store.data[JobKeys.REFUSED] == b"1"
    assert store.data[JobKeys.REFUSED_LAST].decode().endswith(line)


def test_a_node_that_plans_another_node_count_is_told_to_give_every_node_the_same() -> None:
    store = MemoryStore()
    join_job(store, True, NodePlan(2, 2))

    with pytest.raises(
        UsageError,
        match=r"^node 1 plans 3 nodes but node 0 plans 2: give every node the "
        r"same --nnodes$",
    ):
        join_job(store, False, NodePlan(3, 3), node=1)


def test_a_token_mismatch_stays_a_launcher_refusal_whatever_the_plan() -> None:
    store = MemoryStore()
    join_job(store, True, NodePlan(2, 2), token="a")

    with pytest.raises(LaunchError, match="token does not match"):
        join_job(store, False, NodePlan(3, 3), token="b", node=1)


@pytest.mark.parametrize("plan", [None, "4", [4, 4], [0, 4, 1], [4, 2, 1], [1, 2**40, 1], [1, True, 1], [1.0, 2, 1]])
def test_a_plan_xlarun_did_not_write_is_named_so(plan: object) -> None:
    store = MemoryStore()
    store.set(JobKeys.JOB, json.dumps({"run_id": "job", "token": token_digest(""), "plan": plan}))

    assert NodePlan.read(plan) is None
    with pytest.raises(UsageError, match="node 0 plans the job in a record xlarun did not write"):
        join_job(store, False, NodePlan(2, 2), node=1)
