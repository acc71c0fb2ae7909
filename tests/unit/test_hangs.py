"""The pure parts of hang detection and stacks: the watch's verdicts on a fake clock, reading a
faulthandler dump, the one-line summary, torch_xla's step log, ``--stacks``' arguments, the hook's
variables and the OOM counters' files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xlarun.cli.options import stacks_request
from xlarun.contract import HOOK_DIRECTORY, STACKS_SIGNAL, STACKS_VARIABLE, hook_variables
from xlarun.exceptions import UsageError
from xlarun.host import oom
from xlarun.supervision.hangs import HangWatch, Verdict
from xlarun.supervision.relay import StepLog, StreamPlan, StreamRelay, step_log_on
from xlarun.supervision.stacks import UNKNOWN, describe_positions, main_thread, rank_ranges, where

# As faulthandler writes it: the threads newest first, the main thread last (here it took the signal).
DUMP = """\
Thread 0x00007f9e3a0fd6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/home/me/job/prefetch.py", line 8 in fill
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f9e3ae64b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2942 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/job/train.py", line 20 in train
  File "/home/me/job/train.py", line 31 in <module>
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_main_thread_is_the_last_one_listed() -> None:
    frames = main_thread(DUMP)
    assert [frame.function for frame in frames] == ["all_reduce", "wrapper", "train", "<module>"]
    assert [frame.is_users for frame in frames] == [False, False, True, True]


def test_where_names_the_innermost_function_at_the_users_innermost_line() -> None:
    assert where(DUMP) == "all_reduce (train.py:20)"
    assert (
        where('Current thread 0x1 (most recent call first):\n  File "train.py", line 11 in load_batch\n')
        == "load_batch (train.py:11)"
    )
    # Nothing of the user's on the stack: the innermost frame, wherever it is.
    assert (
        where('Thread 0x1 (most recent call first):\n  File "<frozen runpy>", line 88 in _run_code\n')
        == "_run_code (<frozen runpy>:88)"
    )
    assert where("") == UNKNOWN


def test_positions_put_the_odd_ones_first() -> None:
    positions = {
        0: "all_reduce (train.py:20)",
        1: "all_reduce (train.py:20)",
        2: "load_batch (train.py:11)",
        3: "all_reduce (train.py:20)",
    }
    assert describe_positions(positions) == ("rank 2: load_batch (train.py:11) · ranks 0-1,3: all_reduce (train.py:20)")
    assert rank_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_the_watch_says_hung_when_silent_and_idle() -> None:
    clock, cpu = Clock(), {0: 1.0, 1: 1.0}
    watch = HangWatch(30.0, lambda: dict(cpu), clock=clock)
    clock.now += 29.0
    assert watch.seconds_left() == pytest.approx(1.0)
    watch.saw_progress()  # a line of output puts the check off
    clock.now += 30.0
    assert watch.check() is None  # the first CPU sample
    assert watch.seconds_left() == pytest.approx(watch.confirm)
    clock.now += watch.confirm
    cpu[1] += 0.01 * watch.confirm  # 1% of a core: idle
    assert watch.check() is Verdict.HUNG


def test_a_silent_worker_using_the_cpu_is_busy_and_looked_at_again_a_timeout_later() -> None:
    clock, cpu = Clock(), {0: 1.0}
    watch = HangWatch(30.0, lambda: dict(cpu), clock=clock)
    clock.now += 30.0
    watch.check()
    clock.now += watch.confirm
    cpu[0] += watch.confirm  # a whole core
    assert watch.check() is Verdict.BUSY and watch.busy_ranks == [0]
    assert watch.seconds_left() == pytest.approx(30.0)
    # Still silent: the silence counts from the last output, not from the last look.
    assert watch.quiet_for == pytest.approx(30.0 + watch.confirm)


def test_a_check_before_its_time_says_nothing_and_samples_nothing() -> None:
    samples: list[int] = []

    def cpu_seconds() -> dict[int, float]:
        samples.append(1)
        return {}

    clock = Clock()
    watch = HangWatch(10.0, cpu_seconds, clock=clock)
    clock.now += 5.0
    assert watch.check() is None and samples == []


def test_step_lines_one_after_another_are_all_counted() -> None:
    log = StepLog()
    kept = log.strip(b"torch_xla.torch_xla::sync\n" * 3 + b"loss 1\n" + b"torch_xla.torch_xla::sync\n" * 2)
    assert (kept, log.steps) == (b"loss 1\n", 5)


def test_the_step_log_is_counted_and_taken_out() -> None:
    log = StepLog()
    kept = log.strip(b"loss 1\ntorch_xla.torch_xla::sync\nloss 2\ntorch_xla.torch")
    kept += log.strip(b"_xla::sync\ntorch_xla.core.xla_model::mark_step\nsaid torch_xla.torch_xla::sync\n")
    assert (kept, log.steps) == (b"loss 1\nloss 2\nsaid torch_xla.torch_xla::sync\n", 3)
    # A line that only begins like one is the stream's own.
    assert log.strip(b"torch_xla.torch") == b"" and log.close() == b"torch_xla.torch"


def test_a_step_line_in_the_middle_of_a_line_is_not_a_step() -> None:
    log = StepLog()
    assert log.strip(b"partial ") + log.strip(b"torch_xla.torch_xla::sync\n") == b"partial torch_xla.torch_xla::sync\n"
    assert log.steps == 0


def test_the_relay_keeps_step_lines_out_of_the_log_file(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    relay = StreamRelay(StreamPlan(file=str(path), relay=True, step_log=True))
    relay.feed(b"torch_xla.torch_xla::sync\nwarn\ntorch_xla.torch")
    relay.close()
    assert path.read_bytes() == b"warn\ntorch_xla.torch"
    assert relay.step_log is not None and relay.step_log.steps == 1


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), ("2", True), ("yes", False), (None, False)])
def test_the_step_log_is_on_as_torch_xla_reads_the_variable(value: str | None, on: bool) -> None:
    assert step_log_on({} if value is None else {"XLA_EMIT_STEPLOG": value}) is on


def test_stacks_arguments() -> None:
    assert stacks_request(["--nproc-per-node", "2", "train.py"]) == (False, None)
    assert stacks_request(["--stacks"]) == (True, None)
    assert stacks_request(["--stacks", "4711"]) == (True, 4711)
    assert stacks_request(["--stacks=4711"]) == (True, 4711)
    with pytest.raises(UsageError, match="expected the launcher's process id"):
        stacks_request(["--stacks", "train.py"])
    with pytest.raises(UsageError, match="at most one argument"):
        stacks_request(["--stacks", "1", "2"])


def test_the_hook_comes_first_on_the_pythonpath() -> None:
    assert hook_variables("/logs/0/stacks.txt", {}) == {
        STACKS_VARIABLE: f"{int(STACKS_SIGNAL)}:/logs/0/stacks.txt",
        "PYTHONPATH": HOOK_DIRECTORY,
    }
    assert hook_variables("/s", {"PYTHONPATH": "/opt/a:/opt/b"})["PYTHONPATH"] == f"{HOOK_DIRECTORY}:/opt/a:/opt/b"
    assert os.path.isfile(os.path.join(HOOK_DIRECTORY, "sitecustomize.py"))
    assert os.listdir(HOOK_DIRECTORY) in (
        ["sitecustomize.py"],
        ["sitecustomize.py", "__pycache__"],
        ["__pycache__", "sitecustomize.py"],
    )


def fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "expected"),
    [
        # cgroup v1, as on this kind of host: the memory hierarchy mounted at its root.
        (
            "4:memory:/job/7\n0::/\n",
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
            "/sys/fs/cgroup/memory/job/7",
        ),
        # A container's view: the hierarchy mounted from the container's own group.
        (
            "4:memory:/kubepods/pod1/c2\n",
            "35 31 0:32 /kubepods/pod1/c2 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
            "/sys/fs/cgroup/memory",
        ),
        # cgroup v2.
        (
            "0::/user.slice/job\n",
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
            "/sys/fs/cgroup/user.slice/job",
        ),
    ],
)
def test_the_memory_cgroup_is_found_where_it_is_mounted(
    tmp_path: Path, cgroup: str, mountinfo: str, expected: str
) -> None:
    assert oom.memory_cgroup_directory(str(fake_proc(tmp_path, cgroup, mountinfo))) == expected


def test_this_process_has_a_memory_cgroup_or_none() -> None:
    found = oom.memory_cgroup_directory()
    assert found is None or os.path.isdir(found)
    assert oom.oom_kills() >= 0
