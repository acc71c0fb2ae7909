"""Joining: who may take part (the job check, node ranks), and the seats of each attempt.

Every attempt seats its nodes the same way, whatever decided who they are (``static``:
the node ranks given; ``c10d``: a round of torch's ``DynamicRendezvousHandler``). Each node
posts one record (its agent id, host and worker count) and bumps one counter; the node
that completes the count sets one key. The attempt's leader (node rank 0), waiting on that
key, reads every record in one request, decides ranks and the workers' store, and writes
every node's seat in one request; each node waits on its own seat's key. Joining thus
costs a few requests per node and O(N) for the whole job, with no polling.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from xlarun.console import StatusLine
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import flag
from xlarun.rendezvous.store import Client, JobKeys, StoreRole, Timeouts, token_digest, wait_for_key
from xlarun.structs import Struct, asdict

# How many membership changes one line names before it counts the rest.
NAMED_CHANGES = 3


class FinishedJob(LaunchError):
    """The store this node reached serves a launch of its run id whose last attempt had ended before the node
    came, and that launch closed its rendezvous: a launch before this one (a container restarted in place, a
    Slurm requeue), still ending. Not a job this node has a place in: it waits for the next launch's store
    (:meth:`~xlarun.rendezvous.node.NodeRendezvous.assign`), and the line is its error where none comes in time.
    """


class Member(Struct, frozen=True):
    """One agent taking part in an attempt."""

    agent: int
    """The agent's id in this job, unique per agent process (a replacement gets a new one)."""
    host: str
    nproc: int
    place: int | None = None
    """Where the node belongs in the job's order, where its host says (its worker number in a TPU
    slice): an attempt whose every node has one ranks them by it instead of the round's order."""


class Roster(Struct, frozen=True):
    """An attempt's nodes, in node-rank order."""

    members: tuple[Member, ...]

    def encode(self) -> str:
        return json.dumps({"members": [[m.agent, m.host, m.nproc] for m in self.members]})

    @classmethod
    def decode(cls, raw: bytes) -> Roster:
        fields = json.loads(raw)
        return cls(tuple(Member(*member) for member in fields["members"]))

    def describe(self) -> list[dict[str, Any]]:
        """The nodes as the summary file lists them."""
        return [{"node_rank": rank, "host": m.host, "nproc": m.nproc} for rank, m in enumerate(self.members)]


def read_roster(client: Client, keys: JobKeys, attempt: int) -> Roster:
    return Roster.decode(client.get(keys.attempt(attempt, "roster")))


def membership_change(before: Roster, after: Roster) -> str:
    """What changed between two attempts' nodes, e.g. ``node 2 (host-c) left``; empty when nothing did."""
    kept = {member.agent for member in before.members} & {member.agent for member in after.members}
    left = [f"node {rank} ({m.host}) left" for rank, m in enumerate(before.members) if m.agent not in kept]
    joined = [f"{m.host} joined as node {rank}" for rank, m in enumerate(after.members) if m.agent not in kept]
    changes = left + joined
    if len(changes) > NAMED_CHANGES:
        changes = changes[:NAMED_CHANGES] + [f"{len(changes) - NAMED_CHANGES} more changes"]
    return ", ".join(changes)


class Seat(Struct, frozen=True):
    """One node's place in one attempt, as the attempt's leader decided it."""

    attempt: int
    node_rank: int
    nnodes: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    store_node: int | None
    change: str
    job_started_ns: int = 0
    """When the job's first attempt was seated: one id for the whole job, the same on every node."""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Seat:
        return cls(**json.loads(raw))


Lead = Callable[[list[Member]], list[Seat]]
"""The leader's decision: from every node's record, in node-rank order, to every node's seat."""

LeadAttempt = Callable[[int, list[Member]], list[Seat]]
"""The same for attempt number ``n``, which the backend decides (the store's count of attempts)."""


class Seating(Protocol):
    """What a backend decides: who serves the store, who takes part, and who they are in each attempt.

    One per node, chosen by the backend (:mod:`~xlarun.rendezvous.static`, :mod:`~xlarun.rendezvous.c10d`);
    the rest of a node's life in the job is :class:`~xlarun.rendezvous.node.NodeRendezvous`'s. The
    job's store client is handed to each call rather than kept: the host's store stops with the
    last reference to it, and the node drops its own when it leaves (torch's c10d handler keeps one).
    """

    timeouts: Timeouts
    store_host_node: int | None
    """The node serving the job's store until an attempt's seats say which (``None``: no rank says)."""
    connections: tuple[str, ...]
    """Connections of its own, by role, opened with the node's before the agent counts as joined."""
    nodes_waiting: Callable[[], int] | None
    """How many nodes wait to join, for the monitor to let them in by a restart (``None``: none can)."""

    def store_role(self, host: str) -> StoreRole:
        """Whether this agent serves the job's store at ``host`` or reaches it."""

    def joined(self, store: Client, host: str, port: int, agent: int, connections: Mapping[str, Client]) -> None:
        """This agent (id ``agent``) reached the store at ``host:port`` and beats: take part."""

    def seat(self, store: Client, me: Member, previous: Seat | None, lead: LeadAttempt) -> Seat:
        """This node's seat in the attempt after ``previous`` (``None``: the first it takes part in).

        ``lead`` runs on the attempt's node rank 0, with the attempt's number and every node's record.
        Raises :class:`FinishedJob` where the store's job had ended before this node came.
        """

    def worker_store_host(self, attempt: int) -> str | None:
        """Where node rank 0's agent serves the workers' store for ``attempt`` (``None``: the job's store does)."""

    def leave_as_host(self, client: Client) -> None:
        """The agent serving the store leaves, after every node of the last attempt left or was lost."""


def take_seat(
    board: Client,
    prefix: str,
    rank: int,
    nnodes: int,
    me: Member,
    lead: Lead,
    deadline: float,
    status: StatusLine,
    waiting: str,
    reached: str,
) -> Seat:
    """Post this node's record under ``prefix`` on ``board`` and wait for its seat (see the module docstring).

    A timeout names the node ranks whose records never came (``reached`` words what they
    did not do, e.g. ``joined``).
    """
    board.set(f"{prefix}node/{rank}", json.dumps([me.agent, me.host, me.nproc, me.place]))
    if int(board.add(f"{prefix}arrived", 1)) >= nnodes:
        board.set(f"{prefix}complete", "1")

    def show() -> None:
        status.update(
            f"{waiting}: {min(int(board.add(f'{prefix}arrived', 0)), nnodes)}/{nnodes} "
            f"({time.monotonic() - started:.0f} s)"
        )

    started = time.monotonic()
    # Only a terminal gets a status line, and only then is the wait broken up to redraw it.
    tick = show if status.tty else None
    if rank == 0:
        if not wait_for_key(board, f"{prefix}complete", deadline, tick):
            raise missing(board, prefix, nnodes, deadline - started, status, reached)
        records = board.multi_get([f"{prefix}node/{node}" for node in range(nnodes)])
        seats = lead([Member(*json.loads(record)) for record in records])
        board.multi_set([f"{prefix}seat/{node}" for node in range(nnodes)], [seat.encode() for seat in seats])
    if not wait_for_key(board, f"{prefix}seat/{rank}", deadline, tick):
        raise missing(board, prefix, nnodes, deadline - started, status, reached)
    status.clear()
    return Seat.decode(board.get(f"{prefix}seat/{rank}"))


def seat_attempt(
    store: Client, keys: JobKeys, attempt: int, members: list[Member], master_addr: str, master_port: int
) -> list[Seat]:
    """The leader's decision: publish ``attempt``'s roster and give every node its seat, in the
    order of ``members`` (the round's).

    Node ranks follow that order, or the members' places where every one has one (a TPU slice's
    worker numbers, which libtpu maps to chips). The seats name the workers' store
    (``master_addr:master_port``), the node that serves the job's store, what changed since the
    attempt before, and when the job started (set once, by the first attempt's leader).
    """
    order = list(range(len(members)))
    if all(member.place is not None for member in members):
        order.sort(key=lambda index: members[index].place or 0)
    ranked = [members[index] for index in order]
    node_rank = {index: rank for rank, index in enumerate(order)}
    host_agent = store.get(keys("host_agent")).decode()
    store_node = next((rank for rank, m in enumerate(ranked) if str(m.agent) == host_agent), None)
    started = int(store.compare_set(keys("started_ns"), "", str(time.time_ns())).decode())
    roster = Roster(tuple(ranked))
    change = ""
    previous = keys.attempt(attempt - 1, "roster")
    if attempt > 0 and store.check([previous]):
        change = membership_change(Roster.decode(store.get(previous)), roster)
    store.set(keys.attempt(attempt, "roster"), roster.encode())
    # The monitor follows the latest attempt seated.
    store.set(keys("published"), str(attempt + 1))
    # As torchrun: the workers of the nodes ranked before come first.
    offsets = [0, *itertools.accumulate(m.nproc for m in ranked)]
    world_size = offsets[-1]
    return [
        Seat(
            attempt=attempt,
            node_rank=node_rank[index],
            nnodes=len(members),
            rank_offset=offsets[node_rank[index]],
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            store_node=store_node,
            change=change,
            job_started_ns=started,
        )
        for index in range(len(members))
    ]


def missing(board: Client, prefix: str, nnodes: int, waited: float, status: StatusLine, reached: str) -> LaunchError:
    """The timeout's one line: which node ranks never came. Reads one key per node, once."""
    status.clear()
    absent = [node for node in range(nnodes) if not board.check([f"{prefix}node/{node}"])]
    if not absent:
        return LaunchError(f"timed out after {waited:.0f} s waiting for node 0 to seat the nodes")
    return LaunchError(
        f"{nnodes - len(absent)} of {nnodes} nodes {reached} in {waited:.0f} s; "
        f"missing node ranks: {', '.join(map(str, absent))}"
    )


class NodePlan(Struct, frozen=True):
    """The job a node plans: its node count (``min_nodes:max_nodes`` where elastic) and, for a
    multislice job, its TPU slices. Every node of a job plans the same one, or the nodes would wait
    out the join timeout for nodes that never come."""

    min_nodes: int
    max_nodes: int
    slices: int = 1

    # A record another process wrote is read only within these (a node count of torchrun's range).
    LIMIT = 1 << 20

    def describe(self) -> str:
        """E.g. ``6 nodes (3 slices x 2 hosts)``, ``2:4 nodes``."""
        nodes = f"{self.max_nodes}" if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"
        if self.slices == 1:
            return f"{nodes} nodes"
        hosts = f" x {self.max_nodes // self.slices} hosts" if self.max_nodes % self.slices == 0 else ""
        return f"{nodes} nodes ({self.slices} slices{hosts})"

    def encode(self) -> list[int]:
        return [self.min_nodes, self.max_nodes, self.slices]

    @classmethod
    def read(cls, value: object) -> NodePlan | None:
        """The plan in a job record, None where it is not one xlarun wrote (anyone may write the store)."""
        if (
            not isinstance(value, list)
            or len(value) != 3
            or not all(type(n) is int and 1 <= n <= cls.LIMIT for n in value)
        ):
            return None
        plan = cls(*value)
        return plan if plan.min_nodes <= plan.max_nodes else None


def check_job(
    client: Client,
    serving: bool,
    run_id: str,
    token: str,
    plan: NodePlan,
    names: tuple[str, str],
    where: str,
    deadline: float,
    status: StatusLine,
) -> int:
    """Refuse to mix with an agent of another job (run id), one without the job's token, or one that
    plans the job otherwise than the store's host (a usage error: the nodes were given different
    counts). ``names`` words this node and the store's host, e.g. ``("node 2", "node 0")``.

    Returns how many agents were refused before this one came (not news to it).
    """
    mine = json.dumps({"run_id": run_id, "token": token_digest(token), "plan": plan.encode()}, sort_keys=True)
    if serving:
        # Only the agent serving the store names its job, so a stray agent that reaches the
        # store first cannot claim it.
        client.set(JobKeys.JOB, mine)
        found = mine
    else:
        status.update(f"waiting for the store's host to name its job at {where}")
        if not wait_for_key(client, JobKeys.JOB, deadline):
            raise LaunchError(f"timed out waiting for the store's host at {where} to name its job")
        status.clear()
        found = client.get(JobKeys.JOB).decode("utf-8", "replace")  # anyone may have written it
    if found == mine:
        return int(client.add(JobKeys.REFUSED, 0))
    try:
        theirs = json.loads(found)
    except (ValueError, RecursionError):
        theirs = {}
    if not isinstance(theirs, dict):
        theirs = {}
    same_job = theirs.get("run_id") == run_id and theirs.get("token") == token_digest(token)
    if theirs.get("run_id") != run_id:
        reason = f"the store at {where} serves run id {theirs.get('run_id')!r}, not {run_id!r}"
    elif not same_job:
        reason = f"this node's rendezvous token does not match the job's at {where}"
    else:
        reason = plan_mismatch(plan, NodePlan.read(theirs.get("plan")), names)
    client.set(JobKeys.REFUSED_LAST, f"{socket.gethostname()} (pid {os.getpid()}): {reason}")
    client.add(JobKeys.REFUSED, 1)
    if same_job:
        raise UsageError(reason)
    raise LaunchError(f"refused: {reason} (check {flag('rdzv_id')} and {flag('rdzv_conf')} token / XLARUN_RDZV_TOKEN)")


def plan_mismatch(mine: NodePlan, theirs: NodePlan | None, names: tuple[str, str]) -> str:
    """Why two nodes' plans of one job disagree, e.g. ``node 2 plans 6 nodes (3 slices x 2 hosts) but
    node 0 plans 4 (2 slices x 2 hosts): every slice must have the same hosts``."""
    me, host = names
    if theirs is None:
        return f"{host} plans the job in a record xlarun did not write"
    theirs_text = theirs.describe().replace(" nodes", "", 1)
    fix = (
        "every slice must have the same hosts"
        if mine.slices > 1 or theirs.slices > 1
        else f"give every node the same {flag('nnodes')}"
    )
    return f"{me} plans {mine.describe()} but {host} plans {theirs_text}: {fix}"


def claim_node_rank(
    client: Client, keys: JobKeys, rank: int, agent: int, patience: float, interval: float, status: StatusLine
) -> None:
    """Take static node rank ``rank`` for this agent, or refuse a second agent for a rank in use.

    A rank whose agent is gone (left, or declared lost by the monitor) passes to this one:
    a node restarted with the same rank rejoins the job. A holder whose heartbeat moves is
    alive, and this agent is refused; one that stays silent for ``patience`` seconds without
    being declared lost still holds its rank.
    """
    key = keys("node", rank)
    mine = str(agent)
    holder = client.compare_set(key, "", mine).decode()
    deadline = time.monotonic() + patience
    first_beat: bytes | None = None
    while holder != mine:
        if client.check([keys("gone", holder)]):
            holder = client.compare_set(key, holder, mine).decode()
            continue
        beat = client.get(keys.heartbeat(int(holder)))
        if first_beat is None:
            first_beat = beat
        if beat != first_beat or time.monotonic() >= deadline:
            raise LaunchError(
                f"node rank {rank} already joined run {keys.run_id!r}: give each node its own {flag('node_rank')}"
            )
        status.update(f"node rank {rank} is held by another agent; waiting to see whether it is gone")
        time.sleep(interval)
    status.clear()


def current_attempt(client: Client, keys: JobKeys, deadline: float, status: StatusLine) -> int:
    """The attempt a newly joined static node takes part in: the next one the job will start.

    A node that joins while an attempt runs (it replaces a node that was lost) waits for
    that attempt to end.
    """
    published = int(client.add(keys("published"), 0))
    if published:
        status.update(f"waiting for attempt {published - 1} to end before joining")
        if not wait_for_key(client, keys.attempt(published - 1, "end"), deadline):
            raise LaunchError(
                f"attempt {published - 1} of run {keys.run_id!r} did not end in time for this node to join"
            )
        status.clear()
    return published


def announce_change(change: str, nnodes: int, min_nodes: int, max_nodes: int, status: StatusLine) -> None:
    """One line per change of membership: ``node 2 (host-c) left; restarting with 2 nodes (2..3)``."""
    bounds = f" ({min_nodes}..{max_nodes})" if min_nodes != max_nodes else ""
    status.say(f"{change}; restarting with {nnodes} node{'s' if nnodes != 1 else ''}{bounds}")
