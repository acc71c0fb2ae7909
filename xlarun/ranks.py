"""Rank arithmetic: pure functions from a node's place in the world to worker numbers."""

from __future__ import annotations

from xlarun.structs import Struct


class NodeAssignment(Struct, frozen=True):
    """This node's place in the world for one attempt: what a rendezvous decides.

    ``rank_offset`` is the global rank of this node's local rank 0 (the sum of
    the local world sizes of the nodes ranked before it), so nodes may run
    different numbers of workers, as under torchrun.
    """

    run_id: str
    node_rank: int
    nnodes: int
    local_world_size: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    restart_count: int = 0
    agent_store: bool = False
    hosts: tuple[str, ...] = ()
    """Every node's address in node-rank order, as the rendezvous learnt them, where the launch asked
    for them (TorchTPU's address list across hosts); empty otherwise."""
    worker_ports: tuple[int, ...] = ()
    """Ports picked free on this host for the attempt, one per local rank, where the device needs
    ports of its own (TorchTPU on one host); empty otherwise."""
    job_started_ns: int = 0
    """When the job's first attempt was seated (``time.time_ns()``), the same on every node and every
    attempt: one id for the whole job (TorchTPU's profiling session)."""

    def global_rank(self, local_rank: int) -> int:
        return self.rank_offset + local_rank

    @classmethod
    def single_node(
        cls,
        run_id: str,
        nproc: int,
        master_addr: str,
        master_port: int,
        node_rank: int = 0,
        nnodes: int = 1,
        restart_count: int = 0,
    ) -> NodeAssignment:
        """Static assignment where every node runs ``nproc`` workers."""
        return cls(
            run_id=run_id,
            node_rank=node_rank,
            nnodes=nnodes,
            local_world_size=nproc,
            rank_offset=node_rank * nproc,
            world_size=nnodes * nproc,
            master_addr=master_addr,
            master_port=master_port,
            restart_count=restart_count,
        )
