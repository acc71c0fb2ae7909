"""Unit layer: what the world hands the launcher is untrusted, in-process.

A worker's error file may hold anything (timestamps out of range, JSON too deep, megabytes,
terminal escapes, a link); the summary file goes where others may write; a run id names a
directory; a store may not be there. ``tests/launch/test_untrusted_input.py`` launches the same
faults for real.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import WAIT_TIMEOUT_S, free_port, prepare, refusal, slack_s

from xlarun.contract import MAX_ERROR_FILE_BYTES, read_error_file
from xlarun.exceptions import LaunchError, UsageError
from xlarun.failures import NOT_AVAILABLE, FailureRecord
from xlarun.supervision.end import RunEnd
from xlarun.supervision.group import WorkerResult
from xlarun.supervision.logs import make_run_log_dir
from xlarun.supervision.report import MAX_QUOTED_BYTES, RunSummary, failure_of, format_report, keep_end


def write_record(path: Path, traceback: str = "Traceback\nRuntimeError: boom", timestamp: object = None) -> Path:
    extra: dict[str, object] = {"py_callstack": traceback}
    if timestamp is not None:
        extra["timestamp"] = timestamp
    path.write_text(json.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": extra}}))
    return path


def failed_worker(error_file: Path | str = "", stderr_tail: list[str] | None = None) -> WorkerResult:
    now = time.time()
    return WorkerResult(
        local_rank=0,
        rank=0,
        pid=4242,
        started_at=now - 1,
        returncode=3,
        ended_at=now,
        error_file=str(error_file),
        stderr_tail=stderr_tail or ["RuntimeError: from stderr"],
    )


# ---- the error file's timestamp, shape and size


@pytest.mark.parametrize(
    "timestamp",
    ["inf", "-inf", "nan", "1e20", "-5e15", "1e400", 10**400, "946684799", str(int(time.time()) + 2 * 86400)],
    ids=["inf", "-inf", "nan", "1e20", "-5e15", "1e400", "huge-int", "1999", "day-after-tomorrow"],
)
def test_a_timestamp_out_of_range_gives_way_to_the_workers_exit_time(tmp_path: Path, timestamp: object) -> None:
    result = failed_worker(write_record(tmp_path / "error.json", timestamp=timestamp))
    failure = failure_of(result)
    assert failure.time == result.ended_at
    assert failure.traceback == "Traceback\nRuntimeError: boom"
    assert "  exitcode  : 3 (pid: 4242)" in format_report("train.py", [failure]).split("\n")


def test_a_plausible_timestamp_is_kept(tmp_path: Path) -> None:
    stamp = int(time.time()) - 60
    assert failure_of(failed_worker(write_record(tmp_path / "error.json", timestamp=str(stamp)))).time == stamp


def test_an_error_file_mtime_out_of_range_gives_way_too(tmp_path: Path) -> None:
    path = write_record(tmp_path / "error.json")
    os.utime(path, (1e11, 1e11))  # the year 5138: no record written then
    result = failed_worker(path)
    assert failure_of(result).time == result.ended_at


def test_json_nested_too_deep_is_no_record(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text('{"message": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert read_error_file(str(path)) is None
    failure = failure_of(failed_worker(path))
    assert (failure.error_file, failure.traceback) == (NOT_AVAILABLE, "RuntimeError: from stderr")


def test_bytes_that_are_not_utf8_still_show(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_bytes(b'{"message": "bad \xff byte"}')
    record = read_error_file(str(path))
    assert record is not None and record.message == "bad \ufffd byte"


def test_a_file_over_the_bound_is_not_read_and_the_report_quotes_stderr(tmp_path: Path) -> None:
    path = write_record(tmp_path / "error.json", "x" * MAX_ERROR_FILE_BYTES)
    assert read_error_file(str(path)) is None
    assert failure_of(failed_worker(path)).traceback == "RuntimeError: from stderr"


def test_a_link_at_the_error_file_is_not_followed(tmp_path: Path) -> None:
    secret = write_record(tmp_path / "secret.json", "TOP SECRET")
    link = tmp_path / "error.json"
    link.symlink_to(secret)
    assert read_error_file(str(link)) is None
    assert "TOP SECRET" not in failure_of(failed_worker(link)).traceback


def test_a_fifo_at_the_error_file_does_not_block_the_launcher(tmp_path: Path) -> None:
    fifo = tmp_path / "error.json"
    os.mkfifo(fifo)
    answers: list[object] = []
    reader = threading.Thread(target=lambda: answers.append(read_error_file(str(fifo))), daemon=True)
    reader.start()
    reader.join(timeout=WAIT_TIMEOUT_S)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go
        pytest.fail("reading a FIFO error file blocked")
    assert answers == [None]


# ---- what a record quotes, and how the report shows it


def test_a_long_traceback_keeps_its_last_64_kib_and_says_how_much_was_cut(tmp_path: Path) -> None:
    lines = [f"  frame {number:07d}" for number in range(100_000)]
    text = "\n".join(lines) + "\nRuntimeError: the end"
    failure = failure_of(failed_worker(write_record(tmp_path / "error.json", text)))
    marker, kept = failure.traceback.split("\n", 1)
    assert marker == f"[... {len(text) - MAX_QUOTED_BYTES} bytes cut ...]"
    assert len(kept.encode()) == MAX_QUOTED_BYTES and text.endswith(kept)
    assert failure.traceback.endswith("RuntimeError: the end")


def test_a_long_stderr_tail_is_cut_too() -> None:
    tail = ["y" * 60_000 for _ in range(20)]
    failure = failure_of(failed_worker(stderr_tail=tail))
    assert failure.traceback.startswith(f"[... {20 * 60_001 - 1 - MAX_QUOTED_BYTES} bytes cut ...]\n")


def test_a_cut_never_splits_a_character() -> None:
    text = "é" * MAX_QUOTED_BYTES  # two bytes each: the cut lands inside one unless it is moved
    marker, kept = keep_end(text + "!").split("\n", 1)
    assert set(kept[:-1]) == {"é"} and kept.endswith("!")
    assert len(kept.encode()) in (MAX_QUOTED_BYTES, MAX_QUOTED_BYTES - 1)
    assert marker == f"[... {len(text.encode()) + 1 - len(kept.encode())} bytes cut ...]"


def test_short_text_is_quoted_whole() -> None:
    assert keep_end("RuntimeError: boom") == "RuntimeError: boom"


def test_the_report_shows_control_characters_escaped_but_newlines_and_tabs() -> None:
    failure = FailureRecord(
        rank=0,
        local_rank=0,
        returncode=3,
        pid=1,
        time=time.time(),
        host="h",
        traceback="a\x1b[2J\x1b]0;title\x07\r\x9b1m\x00\x7f\tb\nRuntimeError: \ud800end",
    )
    report = format_report("train.py", [failure])
    assert not set(report) & {"\x1b", "\x07", "\r", "\x9b", "\x00", "\x7f", "\ud800"}
    assert "  traceback : a\\x1b[2J\\x1b]0;title\\x07\\r\\x9b1m\\x00\\x7f\tb\n  RuntimeError: \\ud800end" in report


# ---- the summary file


def test_a_link_planted_at_the_old_temporary_name_is_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    summary = tmp_path / "summary.json"
    planted = tmp_path / f"summary.json.tmp{os.getpid()}"
    planted.symlink_to(victim)
    RunSummary(run_id="job").write(str(summary), RunEnd("failed", 3))
    assert victim.read_text() == "precious"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert not summary.is_symlink() and json.loads(summary.read_text())["exit_code"] == 3
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["summary.json", planted.name, "victim"]


def test_the_summary_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        RunSummary(run_id="job").write(str(tmp_path / "summary.json"), RunEnd.succeeded())
    finally:
        os.umask(umask)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "path",
    ["/proc/1/summary.json", "/proc/1/reports/ci/summary.json"],
    ids=["its-directory", "the-nearest-directory-that-exists"],
)
def test_a_summary_file_in_a_directory_nobody_may_write_is_refused(path: str) -> None:
    assert not os.access("/proc/1", os.W_OK)
    assert f"--summary-file='{path}' is invalid (/proc/1 is not writable)" in refusal(
        "--summary-file", path, "train.py"
    )


# ---- the run id


@pytest.mark.parametrize(
    "run_id", ["../../esc", "a/b", "/abs", "a\nb", "a\x00b", "\x1b[2J", "tab\tbed", "\x85", ".", ".."]
)
def test_a_run_id_that_is_not_one_directory_name_is_refused(run_id: str) -> None:
    # A master port given: without one, torchrun 2.12 and newer run a lone node on a fresh run id.
    message = refusal("--rdzv-id", run_id, "--master-port", "29500", "train.py")
    assert message.startswith(f"--rdzv-id={run_id!r} cannot be a run id: ")
    assert "'/'" in message and "control character" in message


def test_a_run_id_from_the_environment_is_checked_too() -> None:
    assert "--rdzv-id (from PET_RDZV_ID)='../x' cannot be a run id" in refusal(
        "train.py", env={"PET_RDZV_ID": "../x", "PET_MASTER_PORT": "29500"}
    )


@pytest.mark.parametrize("run_id", ["job-42.1", "._hidden", "...", "élan", "a b"])
def test_a_run_id_that_is_one_directory_name_is_taken(run_id: str) -> None:
    assert prepare("--rdzv-id", run_id, "--master-port", "29500", "train.py").config.rdzv_id == run_id


@pytest.mark.parametrize("run_id", ["../../esc", "x/..", "a/b"])
def test_the_run_log_directory_is_never_outside_the_log_dir(tmp_path: Path, run_id: str) -> None:
    base = tmp_path / "a" / "b" / "logs"
    with pytest.raises(UsageError, match="outside --log-dir"):
        make_run_log_dir(str(base), run_id)
    assert list(tmp_path.rglob("*")) == []


def test_the_run_log_directory_of_a_plain_run_id_is_inside(tmp_path: Path) -> None:
    directory = Path(make_run_log_dir(str(tmp_path / "logs"), ".."))
    assert directory.parent == tmp_path / "logs" and directory.name.startswith(".._")


# ---- reaching the store


class SlowConnector:
    """A connector as torch's is on a port that refuses: it gives up only after its whole timeout."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []

    def __call__(self, host: str, port: int, timeout: float) -> object:
        from torch.distributed import DistNetworkError

        self.calls.append((host, port, timeout))
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                return "client"
        time.sleep(timeout)
        raise DistNetworkError("The client socket has timed out")


def connect(connector: SlowConnector, port: int, timeout: float) -> object:
    from xlarun.console import StatusLine
    from xlarun.rendezvous.store import connect_client

    return connect_client(connector, "127.0.0.1", port, timeout, 30.0, StatusLine())  # type: ignore[arg-type]


def test_a_store_that_is_not_there_is_given_up_at_the_join_timeout() -> None:
    import torch.distributed  # noqa: F401  (loaded before the clock starts: it takes seconds)

    connector = SlowConnector()
    started = time.monotonic()
    with pytest.raises(LaunchError) as refused:
        connect(connector, free_port(), 1.2)
    waited = time.monotonic() - started
    assert 1.2 <= waited < 1.2 + slack_s(1), waited
    assert "cannot reach the rendezvous store at 127.0.0.1:" in str(refused.value)
    # The time waited, rounded: 1.2 s and at most a few hundredths more.
    assert " after 1 s (Connection refused)" in str(refused.value)
    assert connector.calls == []


def test_a_store_that_comes_late_is_reached_with_the_full_call_timeout() -> None:
    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def store_comes_up() -> None:
        listener.bind(("127.0.0.1", port))
        listener.listen()

    timer = threading.Timer(0.7, store_comes_up)
    timer.start()
    try:
        connector = SlowConnector()
        assert connect(connector, port, 10.0) == "client"
        assert connector.calls == [("127.0.0.1", port, 30.0)]
    finally:
        timer.join()
        listener.close()


# ---- numbers a scheduler gives


@pytest.mark.parametrize(
    "kind, environ, variable",
    [
        ("slurm", {"SLURM_JOB_ID": "1" * 5000, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}, "SLURM_JOB_ID"),
        (
            "slurm",
            {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n[1-" + "9" * 5000 + "]"},
            "SLURM_JOB_NODELIST",
        ),
        ("mpi", {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0" + "1" * 19}, "OMPI_COMM_WORLD_RANK"),
        ("gke-tpu", {"TPU_WORKER_ID": "1" * 4301, "TPU_WORKER_HOSTNAMES": "a,b"}, "TPU_WORKER_ID"),
    ],
)
def test_a_schedulers_number_past_64_bits_is_refused_naming_its_variable(
    kind: str, environ: dict[str, str], variable: str
) -> None:
    from xlarun.planning.cluster import detect_cluster

    with pytest.raises(UsageError, match=f"--cluster {kind}: {variable}") as refused:
        detect_cluster(kind, environ)
    assert len(str(refused.value)) < 200


def test_leading_zeros_do_not_count_as_digits() -> None:
    from xlarun.planning.cluster import detect_cluster

    settings = detect_cluster(
        "slurm", {"SLURM_JOB_ID": "0" * 30 + "7", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n[" + "0" * 30 + "1-2]"}
    )
    assert (settings.run_id, settings.master_addr) == ("7", "n" + "0" * 30 + "1")
