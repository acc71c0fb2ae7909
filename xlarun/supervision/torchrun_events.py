"""torchrun's ``--event-log-handler console``: its ``torchelastic.worker.status.*`` events, one JSON line each.

Usage::

    sink = TorchrunConsoleSink(TorchrunIdentity.of(config), stream_fd=2)
    EventBus([sink])    # the launch's events, retold as torchrun's agent tells them

What torchrun 2.9 to 2.15 writes (``torch/distributed/elastic/agent/server/api.py``,
``_construct_event``, ``record_duration``, ``_record_worker_events``; ``launcher/api.py``), in
its order: per attempt ``RENDEZVOUS`` (AGENT, ``duration_ms``) and ``ASSIGN_WORKER_RANKS``
(AGENT), one ``START`` (WORKER) per worker; once the run ends, the last attempt's workers by
rank, ``SUCCEEDED``, or ``FAILED`` for each worker that failed and ``TERMINATED`` for the others
of a failed group, then ``SUCCEEDED`` (AGENT) when the agent returned, whatever the workers did, or
``FAILED`` (AGENT) alone when a signal or an error ended it. Workers of an attempt that was
restarted get no end event. Each line is ``Event.serialize()``'s shape,
``{name, source, timestamp, metadata}``, with the inner ``metadata`` JSON inside a string and
one-element lists as torchrun writes them, so ``torch.distributed.elastic.events.api.Event.deserialize``
reads it back. Unlike torchrun, ``timestamp`` is the event's time in milliseconds (torchrun's is
always 0), and the lines go through the launcher's own stderr writer, whole lines, never split by
the workers' relayed output. ``ASSIGN_WORKER_RANKS`` takes no time of its own (ranks are computed
with the rendezvous), so its ``duration_ms`` is 0. This module writes the JSON itself: torch is
never imported by the launcher of a single node.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import cast

from xlarun.config import LaunchConfig
from xlarun.failures import event_returncode
from xlarun.structs import Struct, field
from xlarun.supervision.events import Event

_NO_ERROR_FILE = {"message": "<NONE>", "errorTraits": {"category": "system_terminated_error", "retryability": "False"}}
"""torchrun's ``raw_error`` for a worker that exited non-zero without an error file (``ProcessFailure``)."""
_SIGNALLED = {"message": "<NONE>"}
"""torchrun's ``raw_error`` for a worker a signal ended without an error file."""


class TorchrunIdentity(Struct, frozen=True):
    """What torchrun's events say of the launch that no event carries: its spec."""

    role: str
    entry_point: str
    """``WorkerSpec.get_entrypoint_name()``: the basename of the Python (or of the program under --no-python)."""
    rdzv_backend: str
    max_restarts: int
    nproc_per_node: int

    @staticmethod
    def of(config: LaunchConfig) -> TorchrunIdentity:
        command = config.command
        # torchrun --standalone, and a lone node from torchrun 2.12 on, run on c10d.
        backend = "c10d" if config.standalone else config.rdzv_backend
        return TorchrunIdentity(
            role=config.role,
            entry_point=os.path.basename(command.script if command.no_python else command.python),
            rdzv_backend=backend,
            max_restarts=config.max_restarts,
            nproc_per_node=config.nproc_per_node,
        )


class _Worker(Struct):
    rank: int
    local_rank: int
    pid: int
    exit: Event | None = None


class TorchrunConsoleSink(Struct):
    """Retells the launch's events as torchrun's ``console`` handler lines; see the module docstring."""

    identity: TorchrunIdentity
    write: Callable[[bytes], None]
    """Takes one whole line (the launcher's stderr writer)."""
    _group_rank: int | None = None
    _group_world_size: int | None = None
    _restarts: int = 0
    _started_at: float | None = None
    _workers: dict[int, _Worker] = field(default_factory=dict)
    _hostname: str = ""

    def handle(self, event: Event) -> None:
        attributes = event.attributes
        if self._started_at is None:
            self._started_at = event.time
        if event.name == "rendezvous.completed":
            # torchrun's agent tells both before it records the round's outcome on its worker group.
            self._emit(event, "RENDEZVOUS", "AGENT", duration_ms=cast(float, attributes["duration_s"]) * 1000)
            self._emit(event, "ASSIGN_WORKER_RANKS", "AGENT", duration_ms=0.0)
            self._group_rank = event.node_rank if event.node_rank is not None else 0
            self._group_world_size = cast(int, attributes["members"])
        elif event.name == "restart":
            # Letting waiting nodes in restarts the workers without spending a restart, as in torchrun.
            self._restarts += 0 if attributes.get("admitting") else 1
            self._workers = {}
        elif event.name == "worker.started":
            worker = _Worker(
                cast(int, attributes["rank"]), cast(int, attributes["local_rank"]), cast(int, attributes["process.pid"])
            )
            self._workers[worker.rank] = worker
            self._emit(event, "START", "WORKER", worker=worker)
        elif event.name == "worker.exited":
            exited = self._workers.get(cast(int, attributes["rank"]))
            if exited is not None:
                exited.exit = event
        elif event.name == "launch.finished":
            self._tell_end(event)

    def __str__(self) -> str:
        return "--event-log-handler console"

    def close(self) -> None:
        pass

    def _tell_end(self, event: Event) -> None:
        result = event.attributes.get("result")
        run_time = int(event.time - (self._started_at or event.time))
        if result in ("signalled", "launcher_error", "refused") or (not self._workers and result != "not_needed"):
            # torchrun's agent.run() raised: no worker events, the agent FAILED. A node the job ended
            # without returns, as torchrun's on RendezvousGracefulExitError.
            reason = event.attributes.get("root_cause")
            self._emit(
                event,
                "FAILED",
                "AGENT",
                run_time=run_time,
                raw_error=json.dumps(reason) if reason is not None else f"xlarun: {result}",
            )
            return
        # A hung group, or one another node's failure stopped, failed though none of its workers did.
        group_failed = result != "succeeded" or any(
            worker.exit is None or not worker.exit.attributes.get("expected") for worker in self._workers.values()
        )
        for worker in sorted(self._workers.values(), key=lambda w: w.rank):
            failed = worker.exit is None or not worker.exit.attributes.get("expected")
            if not group_failed:
                self._emit(event, "SUCCEEDED", "WORKER", worker=worker, run_time=run_time)
            elif not failed:
                self._emit(event, "TERMINATED", "WORKER", worker=worker, run_time=run_time)
            else:
                exit_code, raw_error = _failure(worker)
                self._emit(
                    event,
                    "FAILED",
                    "WORKER",
                    worker=worker,
                    run_time=run_time,
                    raw_error=raw_error,
                    exit_code=exit_code,
                    worker_pid=worker.pid,
                )
        self._emit(event, "SUCCEEDED", "AGENT", run_time=run_time)

    def _emit(
        self,
        event: Event,
        state: str,
        source: str,
        *,
        worker: _Worker | None = None,
        run_time: int = 0,
        raw_error: str | None = None,
        duration_ms: float | None = None,
        exit_code: int | None = None,
        worker_pid: int | None = None,
    ) -> None:
        identity = self.identity
        inner: dict[str, object] = {"group_world_size": self._group_world_size, "entry_point": identity.entry_point}
        if worker is not None:
            world_size = (self._group_world_size or 1) * identity.nproc_per_node
            inner.update(
                local_rank=[worker.local_rank],
                role_rank=[worker.rank],
                role_world_size=[world_size],
                exit_code=[exit_code],
                worker_pid=[worker_pid],
            )
        if not self._hostname:
            self._hostname = socket.getfqdn(socket.gethostname())  # torchrun's _get_fq_hostname; on this thread
        metadata = {
            "run_id": event.run_id,
            "global_rank": worker.rank if worker is not None else None,
            "group_rank": self._group_rank,
            "worker_id": str(worker.pid) if worker is not None else None,
            "role": identity.role,
            "hostname": self._hostname,
            "state": state,
            "total_run_time": run_time,
            "rdzv_backend": identity.rdzv_backend,
            "raw_error": raw_error,
            "metadata": json.dumps(inner),
            "agent_restarts": self._restarts,
            "duration_ms": duration_ms,
        }
        line = json.dumps(
            {
                "name": f"torchelastic.worker.status.{state}",
                "source": source,
                "timestamp": int(event.time * 1000),
                "metadata": metadata,
            }
        )
        self.write((line + "\n").encode())


def _failure(worker: _Worker) -> tuple[int, str]:
    """The exit code (minus N for a signal N, as torchrun's) and torchrun's ``raw_error`` of a failed worker."""
    assert worker.exit is not None
    attributes = worker.exit.attributes
    error_type = attributes.get("error.type")
    exit_code = event_returncode(attributes.get("process.exit.code"), attributes.get("signal"))
    if error_type:
        return exit_code, json.dumps({"message": str(error_type)})
    return exit_code, json.dumps(_SIGNALLED if exit_code < 0 else _NO_ERROR_FILE)
