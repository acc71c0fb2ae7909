"""The sinks that retell the run's events to other programs, fed events directly: torchrun's console
lines, the metrics file, systemd's notifications."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from xlarun.supervision.events import Event, describe
from xlarun.supervision.metrics import MetricsTextfile
from xlarun.supervision.systemd import SystemdNotify, socket_address
from xlarun.supervision.torchrun_events import TorchrunConsoleSink, TorchrunIdentity

IDENTITY = TorchrunIdentity(
    role="trainer", entry_point="python3", rdzv_backend="c10d", max_restarts=1, nproc_per_node=2
)


def event(name: str, attempt: int = 0, time: float = 1000.0, **attributes: object) -> Event:
    return Event(
        name=name, time=time, seq=0, attempt=attempt, attributes=attributes, run_id="job 1", node_rank=0, host="h"
    )


def exited(rank: int, code: int, expected: bool) -> Event:
    """As the agent tells it: a signal by its name, the exit code then null."""
    signal_name = signal.Signals(-code).name if code < 0 else None
    attributes = {
        "rank": rank,
        "local_rank": rank,
        "process.pid": 100 + rank,
        "process.exit.code": None if signal_name else code,
        "error.type": None,
        "signal": signal_name,
        "expected": expected,
        "peak_rss_mib": 12.5,
        "cpu_s": 0.1,
    }
    return Event(
        name="worker.exited",
        time=1002.5,
        seq=0,
        attempt=0,
        attributes=attributes,
        run_id="job 1",
        node_rank=0,
        host="h",
    )


def run_of(events: list[Event]) -> list[dict]:
    lines: list[bytes] = []
    sink = TorchrunConsoleSink(IDENTITY, lines.append)
    for each in events:
        sink.handle(each)
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    return [json.loads(line) for line in lines]


def started(rank: int, attempt: int = 0) -> Event:
    return event("worker.started", attempt, time=1000.5, rank=rank, local_rank=rank, **{"process.pid": 100 + rank})


def test_torchrun_lines_of_a_failed_group() -> None:
    lines = run_of(
        [
            event("launch.started"),
            event("rendezvous.completed", round=0, members=1, duration_s=0.25),
            started(0),
            started(1),
            exited(1, 3, False),
            exited(0, -15, True),
            event("launch.finished", time=1003.0, result="failed", **{"process.exit.code": 3}),
        ]
    )
    assert [(line["name"].rsplit(".", 1)[1], line["source"], line["metadata"]["global_rank"]) for line in lines] == [
        ("RENDEZVOUS", "AGENT", None),
        ("ASSIGN_WORKER_RANKS", "AGENT", None),
        ("START", "WORKER", 0),
        ("START", "WORKER", 1),
        ("TERMINATED", "WORKER", 0),
        ("FAILED", "WORKER", 1),
        ("SUCCEEDED", "AGENT", None),
    ]
    assert lines[0]["timestamp"] == 1000000 and lines[0]["metadata"]["duration_ms"] == 250.0
    failed = lines[5]["metadata"]
    assert json.loads(failed["metadata"]) == {
        "group_world_size": 1,
        "entry_point": "python3",
        "local_rank": [1],
        "role_rank": [1],
        "role_world_size": [2],
        "exit_code": [3],
        "worker_pid": [101],
    }
    assert json.loads(failed["raw_error"])["message"] == "<NONE>"
    assert json.loads(lines[4]["metadata"]["metadata"])["exit_code"] == [None]  # a TERMINATED worker has none
    assert (failed["worker_id"], failed["role"], failed["run_id"], failed["total_run_time"]) == (
        "101",
        "trainer",
        "job 1",
        3,
    )


def test_torchrun_lines_after_a_restart_tell_only_the_last_attempts_ends() -> None:
    lines = run_of(
        [
            event("rendezvous.completed", round=0, members=1, duration_s=0.1),
            started(0),
            started(1),
            exited(0, 5, False),
            exited(1, -15, True),
            event("restart", restarts_left=0, admitting=False),
            event("rendezvous.completed", 1, round=1, members=1, duration_s=0.1),
            started(0, 1),
            started(1, 1),
            exited(0, 0, True),
            exited(1, 0, True),
            event("launch.finished", 1, result="succeeded", **{"process.exit.code": 0}),
        ]
    )
    states = [line["metadata"]["state"] for line in lines]
    assert states == ["RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START", "START"] * 2 + ["SUCCEEDED"] * 3
    assert [line["metadata"]["agent_restarts"] for line in lines] == [0] * 4 + [1] * 7


def test_torchrun_agent_fails_alone_when_a_signal_ends_the_run() -> None:
    lines = run_of(
        [
            event("rendezvous.completed", round=0, members=1, duration_s=0.1),
            started(0),
            started(1),
            exited(0, -15, True),
            exited(1, -15, True),
            event("launch.finished", result="signalled", **{"process.exit.code": 143}),
        ]
    )
    assert [line["metadata"]["state"] for line in lines][-1:] == ["FAILED"]
    assert lines[-1]["source"] == "AGENT" and len(lines) == 5  # the rendezvous pair, two starts, the agent


def test_torchrun_workers_of_a_hung_group_read_terminated() -> None:
    lines = run_of(
        [
            event("rendezvous.completed", round=0, members=1, duration_s=0.1),
            started(0),
            started(1),
            exited(0, -15, True),
            exited(1, -15, True),
            event("launch.finished", result="hung", **{"process.exit.code": 124}),
        ]
    )
    assert [line["metadata"]["state"] for line in lines][4:] == ["TERMINATED", "TERMINATED", "SUCCEEDED"]


def test_metrics_exposition_parses_and_escapes_labels(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    path = tmp_path / "new" / "m.prom"
    sink = MetricsTextfile(str(path))
    odd = Event(
        name="worker.started",
        time=5.0,
        seq=1,
        attempt=0,
        attributes={"rank": 0, "local_rank": 0},
        run_id='a "b"\\c\nd',
        node_rank=None,
        host="h",
    )
    sink.handle(odd)
    families = {family.name: family for family in parser.text_string_to_metric_families(path.read_text())}
    [sample] = families["xlarun_workers_running"].samples
    assert sample.value == 1 and sample.labels == {"run_id": 'a "b"\\c\nd'}
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_notify_socket_abstract_names() -> None:
    assert socket_address("@sd/notify") == "\0sd/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert SystemdNotify.from_environ({}, 1) is None
    assert SystemdNotify.from_environ({"NOTIFY_SOCKET": "vsock:2:1"}, 1) is None


def test_ready_goes_once_when_every_worker_of_the_node_started() -> None:
    with tempfile.TemporaryDirectory() as directory:
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.bind(os.path.join(directory, "n"))
        sink = SystemdNotify(os.path.join(directory, "n"), nproc_per_node=2)
        for each in (
            started(0),
            started(1),
            exited(0, 1, False),
            event("restart", restarts_left=0),
            started(0, 1),
            started(1, 1),
        ):
            sink.handle(each)
        sink.close()
        receiver.setblocking(False)
        messages = [receiver.recv(4096).decode() for _ in range(6)]
        receiver.close()
    assert [message.startswith("READY=1\n") for message in messages] == [False, True, False, False, False, False]


def test_a_killed_worker_reads_as_torchrun_and_python_tell_it(tmp_path: Path) -> None:
    killed = [
        event("rendezvous.completed", round=0, members=1, duration_s=0.1),
        started(0),
        started(1),
        exited(0, -9, False),
        exited(1, 0, True),
        event("launch.finished", result="failed", **{"process.exit.code": 137}),
    ]
    failed = run_of(killed)[4]["metadata"]
    assert failed["state"] == "FAILED" and json.loads(failed["metadata"])["exit_code"] == [-9]
    assert json.loads(failed["raw_error"]) == {"message": "<NONE>"}
    sink = MetricsTextfile(str(tmp_path / "m.prom"))
    for each in killed:
        sink.handle(each)
    text = (tmp_path / "m.prom").read_text()
    assert 'xlarun_worker_exit_code{run_id="job 1",node_rank="0",rank="0",local_rank="0"} -9.0' in text
    assert 'xlarun_exit_code{run_id="job 1",node_rank="0"} 137.0' in text


def test_a_drop_line_names_each_sink() -> None:
    assert describe(MetricsTextfile("m.prom")) == "the metrics file m.prom"
    assert describe(SystemdNotify("/run/notify", 1)) == "systemd's NOTIFY_SOCKET"
    assert describe(TorchrunConsoleSink(IDENTITY, print)) == "--event-log-handler console"


STARTED = Event(
    name="worker.started",
    time=5.0,
    seq=1,
    attempt=0,
    attributes={"rank": 0, "local_rank": 0},
    run_id="job",
    node_rank=0,
    host="h",
)


def exposition_in_a_file(tmp_path: Path) -> str:
    """What a regular metrics file holds after :data:`STARTED`."""
    plain = tmp_path / "plain" / "m.prom"
    MetricsTextfile(str(plain)).handle(STARTED)
    return plain.read_text()


def test_metrics_through_a_link_replace_the_file_it_names_and_the_link_stays(tmp_path: Path) -> None:
    """A link in node_exporter's directory to a file elsewhere, and one to a file not there yet."""
    elsewhere, textfile = tmp_path / "elsewhere", tmp_path / "textfile"
    elsewhere.mkdir()
    textfile.mkdir()
    (elsewhere / "old.prom").write_text("# old\n")
    for name, points_to in (("old.prom", elsewhere / "old.prom"), ("new.prom", Path("../elsewhere/new.prom"))):
        (textfile / name).symlink_to(points_to)
        MetricsTextfile(str(textfile / name)).handle(STARTED)
        assert (textfile / name).is_symlink() and os.readlink(textfile / name) == str(points_to)
        assert (elsewhere / name).read_text() == exposition_in_a_file(tmp_path)
    assert sorted(os.listdir(elsewhere)) == ["new.prom", "old.prom"]  # no temporary file left beside them
    assert sorted(os.listdir(textfile)) == ["new.prom", "old.prom"]


def test_metrics_into_a_fifo_are_each_exposition_whole_to_its_reader_and_the_fifo_stays(tmp_path: Path) -> None:
    path = tmp_path / "m.fifo"
    os.mkfifo(path)
    sink = MetricsTextfile(str(path))
    with pytest.raises(OSError) as nobody:  # no reader yet: that event is dropped, never waited for
        sink.handle(STARTED)
    assert nobody.value.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(path).st_mode)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        sink.handle(STARTED)
        read = b""
        while chunk := os.read(reader, 1 << 16):  # to the end: each exposition is a writer's whole output
            read += chunk
    finally:
        os.close(reader)
    assert read.decode() == exposition_in_a_file(tmp_path)
    assert stat.S_ISFIFO(os.stat(path).st_mode) and sorted(os.listdir(tmp_path)) == ["m.fifo", "plain"]


def test_metrics_into_dev_null_leave_it_the_device_it_is() -> None:
    before = os.stat("/dev/null")
    MetricsTextfile("/dev/null").handle(STARTED)
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) and writing beside them needs root")
@pytest.mark.parametrize("device, minor", [("null", 3), ("full", 7)])
def test_metrics_into_a_device_node_write_it_in_place(tmp_path: Path, device: str, minor: int) -> None:
    """Nodes of the memory devices /dev/null (1, 3) and /dev/full (1, 7), made in a directory root may write
    in, as /dev is to root: the node is written, never replaced with a file. /dev/full refuses the write
    (ENOSPC): the event is dropped."""
    path = tmp_path / device
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    sink = MetricsTextfile(str(path))
    if device == "full":
        with pytest.raises(OSError) as full:
            sink.handle(STARTED)
        assert full.value.errno == errno.ENOSPC
    else:
        sink.handle(STARTED)
    assert stat.S_ISCHR(os.stat(path).st_mode) and os.stat(path).st_rdev == os.makedev(1, minor)
    assert os.listdir(tmp_path) == [device]
