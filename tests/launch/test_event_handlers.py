"""Telling other programs how a run goes: torchrun's console events, a metrics file for node_exporter,
systemd's readiness messages; each read back by the program that consumes it."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import finish, run_torchrun, run_xlarun, start_xlarun, worker

TORCHELASTIC_LINE = '{"name": "torchelastic.'


def torchelastic_events(stderr: str) -> list:
    """The lines of torchrun's event handler in ``stderr``, read back by torch's own ``Event``."""
    api = pytest.importorskip("torch.distributed.elastic.events.api")
    return [api.Event.deserialize(line) for line in stderr.splitlines() if line.startswith(TORCHELASTIC_LINE)]


def sequence(events: list) -> list[tuple[str, str, object]]:
    """What the order is made of: each event's name, source and worker rank."""
    return [(event.name, event.source.value, event.metadata["global_rank"]) for event in events]


SCENARIOS = {
    "succeeded": ("faults.py", ["exit:0:0", "exit:0:0"], []),
    "rank 1 fails": ("faults.py", ["exit:0:0", "exit:3:0.5"], []),
    "one restart": ("fail_attempts.py", ["1"], ["--max-restarts", "1"]),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_console_events_read_back_by_torch_in_torchruns_order(scenario: str, tmp_path: Path) -> None:
    script, script_args, flags = SCENARIOS[scenario]
    outcomes = {}
    for name, launch in (("xlarun", run_xlarun), ("torchrun", run_torchrun)):
        out = tmp_path / name
        out.mkdir()
        run = launch(
            "--event-log-handler", "console", *flags, "--nproc-per-node", "2", worker(script), out, *script_args
        )
        outcomes[name] = (run.returncode, torchelastic_events(run.stderr))
    (xlarun_code, ours), (torchrun_code, theirs) = outcomes["xlarun"], outcomes["torchrun"]
    assert (xlarun_code == 0) == (torchrun_code == 0)  # xlarun exits with the failed worker's code, torchrun 1
    assert sequence(ours) == sequence(theirs)
    for event in ours:
        assert event.timestamp > 0  # torchrun's are always 0
        assert set(event.metadata) == set(theirs[0].metadata)
    failed = [event for event in ours if event.name.endswith(".FAILED")]
    assert [event.metadata["global_rank"] for event in failed] == [1] * (scenario == "rank 1 fails")
    assert [event.metadata["agent_restarts"] for event in ours] == [
        event.metadata["agent_restarts"] for event in theirs
    ]


@pytest.mark.parametrize("handler", ["null", "dynamic_rendezvous"])
def test_torchruns_silent_handlers_write_no_event(handler: str, tmp_path: Path) -> None:
    run = run_xlarun(
        "--event-log-handler", handler, "--nproc-per-node", "2", worker("faults.py"), tmp_path, "exit:0:0", "exit:0:0"
    )
    assert run.returncode == 0
    assert TORCHELASTIC_LINE not in run.stderr


def test_unknown_handler_is_refused_in_one_line(tmp_path: Path) -> None:
    run = run_xlarun("--event-log-handler", "file", worker("faults.py"), tmp_path, "exit:0:0")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "xlarun: error: --event-log-handler='file' is invalid: expected one of null, console, dynamic_rendezvous"
    ]
    assert not (tmp_path / "0.pid").exists()


def test_metrics_file_is_a_whole_exposition_at_every_read(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    metrics = tmp_path / "textfile" / "xlarun.prom"
    reads: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                reads.append(metrics.read_text())
            except FileNotFoundError:
                pass
            time.sleep(0.001)  # as often as a scraper could, leaving the 2-core test machine to the launcher

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        launcher = start_xlarun(
            "--metrics-textfile",
            metrics,
            "--nproc-per-node",
            "2",
            worker("faults.py"),
            tmp_path,
            "exit:0:1",
            "exit:7:1.5",
        )
        run = finish(launcher)
    finally:
        stop.set()
        reader.join()
    reads.append(metrics.read_text())  # as the launcher left it: the reader may have stopped before it looked again
    assert run.returncode == 7, run.stderr
    samples = []
    for text in reads:
        assert text.endswith("\n")
        samples.append(
            {
                (sample.name, sample.labels.get("rank")): sample.value
                for family in parser.text_string_to_metric_families(text)
                for sample in family.samples
            }
        )
    assert any(read[("xlarun_up", None)] == 1 and read[("xlarun_workers_running", None)] == 2 for read in samples)
    last = samples[-1]
    assert last[("xlarun_up", None)] == 0, run.stderr
    assert last[("xlarun_exit_code", None)] == 7
    assert last[("xlarun_worker_exit_code", "0")] == 0
    assert last[("xlarun_worker_exit_code", "1")] == 7
    assert last[("xlarun_worker_peak_rss_bytes", "1")] > 1 << 20
    assert last[("xlarun_last_event_timestamp_seconds", None)] > 0
    assert os.listdir(metrics.parent) == ["xlarun.prom"]  # no temporary file left behind


def test_metrics_through_a_link_or_into_dev_null_leave_the_link_and_the_device(tmp_path: Path) -> None:
    """A link in node_exporter's directory keeps pointing at the file it names, which holds the run's last
    state; /dev/null stays the device (a real run, as root where the suite runs as root)."""
    parser = pytest.importorskip("prometheus_client.parser")
    kept, link = tmp_path / "kept" / "xlarun.prom", tmp_path / "textfile" / "xlarun.prom"
    kept.parent.mkdir()
    link.parent.mkdir()
    link.symlink_to(kept)
    null = os.stat(os.devnull)
    for path in (link, os.devnull):
        run = run_xlarun("--metrics-textfile", path, "--nproc-per-node", "1", worker("faults.py"), tmp_path, "exit:0:0")
        assert run.returncode == 0 and "dropped" not in run.stderr, run.stderr
    assert link.is_symlink() and os.readlink(link) == str(kept) and os.listdir(link.parent) == ["xlarun.prom"]
    [up] = [family for family in parser.text_string_to_metric_families(kept.read_text()) if family.name == "xlarun_up"]
    assert [sample.value for sample in up.samples] == [0]
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (null.st_ino, null.st_rdev)


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket as systemd binds for a Type=notify unit, and the NOTIFY_SOCKET naming it."""
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with tempfile.TemporaryDirectory(prefix="xlarun-notify-") as directory:  # short: sun_path holds 108 bytes
        if request.param == "path":
            name = os.path.join(directory, "notify")
            receiver.bind(name)
        else:
            name = f"@xlarun-test-notify-{os.getpid()}"
            receiver.bind("\0" + name[1:])
        yield receiver, name
        receiver.close()


def test_systemd_hears_ready_once_the_workers_run_and_each_change(
    notify_socket: tuple[socket.socket, str], tmp_path: Path
) -> None:
    receiver, name = notify_socket
    run = run_xlarun(
        "--nproc-per-node", "2", worker("faults.py"), tmp_path, "exit:0:0.5", "exit:0:0.5", env={"NOTIFY_SOCKET": name}
    )
    assert run.returncode == 0, run.stderr
    receiver.setblocking(False)
    messages = []
    while True:
        try:
            messages.append(receiver.recv(4096).decode())
        except BlockingIOError:
            break
    ready = [message for message in messages if "READY=1" in message.splitlines()]
    assert len(ready) == 1
    assert "STATUS=attempt 0: 2 of 2 workers running" in ready[0].splitlines()
    assert messages.index(ready[0]) < next(index for index, message in enumerate(messages) if "exited" in message)
    assert all(line.startswith(("READY=", "STATUS=", "STOPPING=")) for m in messages for line in m.splitlines())
    assert messages[-1].splitlines() == ["STOPPING=1", "STATUS=finished: succeeded, exit code 0"]
