"""``--metrics-textfile PATH``: the launch's state as a Prometheus text exposition, for node_exporter.

Usage::

    EventBus([MetricsTextfile("/var/lib/node_exporter/textfile/xlarun.prom")])

node_exporter's textfile collector (``--collector.textfile.directory``) reads every ``*.prom`` file
of a directory at each scrape; no port and no HTTP server are involved. The file is rewritten at
each event, through a temporary file in the same directory that :func:`os.replace` puts in its
place, so a scrape reads the old exposition or the new one, never part of one (node_exporter's
README asks for exactly that); through a symbolic link, the file it names. A FIFO or a device node
at the path is written in place, each exposition whole or not at all, as the event log writes its
lines (:func:`~xlarun.supervision.sinkfiles.replace_whole`). No sample carries a timestamp:
node_exporter refuses a textfile whose samples have one (``collector/textfile.go``).

The text format (version 0.0.4) is written here rather than by ``prometheus_client``'s
``write_to_textfile``: importing ``prometheus_client`` 0.26.0 took 76 to 300 ms and 14 MB of memory
(it loads ``http.server``, ``email`` and ``wsgiref`` for its exposition module), more than the
launcher's own start-up, for eight gauges.
"""

from __future__ import annotations

from typing import cast

from xlarun.failures import event_returncode
from xlarun.structs import Struct, field
from xlarun.supervision.events import Event
from xlarun.supervision.sinkfiles import replace_whole

PREFIX = "xlarun_"

_HELP = {
    "up": "1 while the launch runs, 0 once it finished.",
    "attempt": "The worker group's attempt, 0 for the first start.",
    "restarts": "Restarts of the worker group so far (letting waiting nodes in spends none).",
    "workers_running": "This node's workers that started and have not exited.",
    "worker_exit_code": "Each worker's exit code in its last attempt (minus N for a signal N).",
    "worker_peak_rss_bytes": "Each worker's peak resident memory in its last attempt.",
    "launch_duration_seconds": "Seconds from the launch's start to its last event.",
    "last_event_timestamp_seconds": "Unix time of the launch's last event.",
    "exit_code": "The launcher's exit code, once the launch finished.",
}


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class MetricsTextfile(Struct):
    """Keeps the gauges the events move and rewrites the file at each one; see the module docstring."""

    path: str
    _values: dict[str, float] = field(default_factory=dict)
    _running: set[int] = field(default_factory=set)
    _exits: dict[int, tuple[int, int, float | None]] = field(default_factory=dict)
    """rank -> (local rank, exit code, peak RSS in bytes or None)."""
    _started_at: float | None = None

    def handle(self, event: Event) -> None:
        attributes = event.attributes
        if self._started_at is None:
            self._started_at = event.time
        values = self._values
        values.setdefault("up", 1)
        values.setdefault("restarts", 0)
        values["attempt"] = event.attempt
        if event.name == "worker.started":
            self._running.add(cast(int, attributes["rank"]))
        elif event.name == "worker.exited":
            rank = cast(int, attributes["rank"])
            self._running.discard(rank)
            rss = attributes.get("peak_rss_mib")
            self._exits[rank] = (
                cast(int, attributes["local_rank"]),
                event_returncode(attributes.get("process.exit.code"), attributes.get("signal")),
                float(rss) * 2**20 if isinstance(rss, (int, float)) else None,
            )
        elif event.name == "restart":
            values["restarts"] += 0 if attributes.get("admitting") else 1
            self._running.clear()
        elif event.name == "launch.finished":
            values["up"] = 0
            values["exit_code"] = cast(int, attributes.get("process.exit.code") or 0)
            self._running.clear()
        values["workers_running"] = len(self._running)
        values["launch_duration_seconds"] = event.time - self._started_at
        values["last_event_timestamp_seconds"] = event.time
        self._write(self.exposition(event))

    def __str__(self) -> str:
        return f"the metrics file {self.path}"

    def close(self) -> None:
        pass

    def exposition(self, event: Event) -> str:
        """The text format of the gauges, labelled with the run id and node rank of ``event``."""
        common = f'run_id="{_label_value(event.run_id)}"'
        if event.node_rank is not None:
            common += f',node_rank="{event.node_rank}"'
        lines: list[str] = []

        def gauge(name: str, samples: list[tuple[str, float]]) -> None:
            lines.extend((f"# HELP {PREFIX}{name} {_HELP[name]}", f"# TYPE {PREFIX}{name} gauge"))
            lines.extend(f"{PREFIX}{name}{{{common}{labels}}} {value!r}" for labels, value in samples)

        for name in (
            "up",
            "attempt",
            "restarts",
            "workers_running",
            "launch_duration_seconds",
            "last_event_timestamp_seconds",
            "exit_code",
        ):
            if name in self._values:
                gauge(name, [("", float(self._values[name]))])
        by_rank = sorted(self._exits.items())
        if by_rank:
            gauge(
                "worker_exit_code",
                [(f',rank="{rank}",local_rank="{local}"', float(code)) for rank, (local, code, _) in by_rank],
            )
        with_rss = [
            (f',rank="{rank}",local_rank="{local}"', rss) for rank, (local, _, rss) in by_rank if rss is not None
        ]
        if with_rss:
            gauge("worker_peak_rss_bytes", with_rss)
        return "\n".join(lines) + "\n"

    def _write(self, text: str) -> None:
        replace_whole(self.path, text.encode())
