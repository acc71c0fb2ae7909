"""The record store of runs you can leave: where it is, its modes, atomic writes, damaged records, ids by
prefix, the lost state; and the verbs' command lines."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from xlarun.cli.options import VerbRequest, verb_request
from xlarun.exceptions import UsageError
from xlarun.jobs.records import (
    END_FILE,
    LAUNCHER_FILE,
    RUN_FILE,
    START_GRACE_S,
    JobStore,
    LauncherProcess,
    state_dir,
    write_atomically,
)
from xlarun.launching.detach import redacted_command


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(str(tmp_path / "state"))


def test_the_state_directory_is_the_variable_else_xdg_else_home() -> None:
    home = os.path.expanduser("~")
    assert state_dir({"XLARUN_STATE_DIR": "/srv/runs", "XDG_STATE_HOME": "/x"}) == "/srv/runs"
    assert state_dir({"XDG_STATE_HOME": "/x/state"}) == "/x/state/xlarun"
    # The XDG specification: a relative path is invalid and ignored.
    assert state_dir({"XDG_STATE_HOME": "relative"}) == f"{home}/.local/state/xlarun"
    assert state_dir({}) == f"{home}/.local/state/xlarun"


def test_directories_are_0700_and_files_0600(store: JobStore) -> None:
    job = store.create("abc", ["xlarun", "train.py"], "/work")
    store.set_launcher("abc", os.getpid())
    store.set_end("abc", 0, "succeeded")
    for directory in (store.root, store.runs, job.directory):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for name in (RUN_FILE, LAUNCHER_FILE, END_FILE):
        assert stat.S_IMODE(os.stat(os.path.join(job.directory, name)).st_mode) == 0o600


def test_an_atomic_write_leaves_the_old_file_whole_when_it_fails(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    write_atomically(str(path), b'{"old": true}')
    with pytest.raises(TypeError):
        write_atomically(str(path), "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b'{"old": true}'
    assert os.listdir(tmp_path) == ["record.json"]  # no temporary left behind


def test_a_damaged_record_costs_its_own_entry_only(store: JobStore) -> None:
    store.create("good", ["xlarun", "a.py"], "/work")
    store.set_end("good", 0, "succeeded")
    bad = store.create("bad", ["xlarun", "b.py"], "/work")
    Path(bad.directory, RUN_FILE).write_text('{"id": "bad", "comm')
    store.create("garbled", ["xlarun", "c.py"], "/work")
    Path(store.directory("garbled"), END_FILE).write_text('{"result": "succeeded"}')
    jobs, damaged = store.jobs()
    assert [job.id for job in jobs] == ["good"]
    assert len(damaged) == 2 and any("bad" in line for line in damaged) and any("garbled" in line for line in damaged)
    with pytest.raises(UsageError, match="damaged"):
        store.find("bad")


def test_ids_by_exact_name_or_unique_prefix(store: JobStore) -> None:
    for job_id in ("ab", "abc", "b12"):
        store.create(job_id, ["xlarun", "t.py"], "/work")
    assert store.find("ab").id == "ab"  # a whole id wins over the longer ones it starts
    assert store.find("abc").id == "abc"
    assert store.find("b").id == "b12"
    with pytest.raises(UsageError, match="ambiguous"):
        store.find("a")
    with pytest.raises(UsageError, match="no run"):
        store.find("zz")
    with pytest.raises(UsageError, match="no run"):
        store.find("")


def test_a_run_id_that_cannot_name_a_directory_is_refused(store: JobStore) -> None:
    for job_id in ("../x", "a/b", ".hidden", "", "x" * 200):
        with pytest.raises(UsageError):
            store.create(job_id, ["xlarun"], "/work")


def test_a_running_id_is_refused_and_a_finished_one_gives_way(store: JobStore) -> None:
    store.create("job", ["xlarun", "old.py"], "/work")
    store.set_launcher("job", os.getpid())
    with pytest.raises(UsageError, match="is running"):
        store.create("job", ["xlarun", "new.py"], "/work")
    store.set_end("job", 1, "failed")
    assert store.create("job", ["xlarun", "new.py"], "/work").command == ("xlarun", "new.py")
    assert store.find("job").state == "running"


def test_the_state_of_a_run(store: JobStore) -> None:
    store.create("job", ["xlarun"], "/work")
    assert store.find("job").state == "running"  # its caller is recording the launcher
    store.set_launcher("job", os.getpid())
    assert store.find("job").state == "running"
    for result, code, state in (
        ("succeeded", 0, "succeeded"),
        ("failed", 3, "failed"),
        ("hung", 124, "failed"),
        ("signalled", 143, "signaled"),
        (None, 0, "succeeded"),
        (None, 2, "failed"),
    ):
        store.set_end("job", code, result)
        job = store.find("job")
        assert (job.state, job.exit_code, job.as_json()["state"]) == (state, code, state)


def test_a_launcher_is_only_trusted_with_its_start_time_and_boot(store: JobStore) -> None:
    me = LauncherProcess.of(os.getpid())
    assert me is not None and me.alive()
    assert not LauncherProcess(me.pid, me.start_ticks + 1, me.boot).alive()  # the pid reused by another
    assert not LauncherProcess(me.pid, me.start_ticks, "another-boot").alive()
    job = store.create("job", ["xlarun"], "/work")
    Path(job.directory, LAUNCHER_FILE).write_text(
        json.dumps({"pid": me.pid, "start_ticks": me.start_ticks + 1, "boot_id": me.boot})
    )
    assert store.find("job").state == "lost"


def test_a_run_whose_launcher_was_never_recorded_is_lost_after_the_grace(store: JobStore) -> None:
    job = store.create("job", ["xlarun"], "/work")
    run = json.loads(Path(job.directory, RUN_FILE).read_text())
    run["started"] -= START_GRACE_S + 1
    Path(job.directory, RUN_FILE).write_text(json.dumps(run))
    assert store.find("job").state == "lost"


@pytest.mark.parametrize(
    ("args", "request_"),
    [
        (["--jobs"], VerbRequest("--jobs", None, frozenset())),
        (["--jobs", "--json", "--prune"], VerbRequest("--jobs", None, frozenset({"--json", "--prune"}))),
        (["--logs", "3f2a", "--follow"], VerbRequest("--logs", "3f2a", frozenset({"--follow"}))),
        (["--logs", "--follow", "3f2a"], VerbRequest("--logs", "3f2a", frozenset({"--follow"}))),
        (["--stop=3f2a"], VerbRequest("--stop", "3f2a", frozenset())),
        (["--status", "3f", "--json"], VerbRequest("--status", "3f", frozenset({"--json"}))),
        (["--nproc-per-node", "2", "train.py", "--jobs"], None),
        (["train.py"], None),
        ([], None),
    ],
)
def test_the_verbs_command_lines(args: list[str], request_: VerbRequest | None) -> None:
    assert verb_request(args) == request_


@pytest.mark.parametrize(
    "args",
    [["--wait"], ["--wait", "a", "b"], ["--jobs", "x"], ["--attach", "a", "--follow"], ["--stop", "a", "--json"]],
)
def test_a_verb_given_wrongly_is_one_line(args: list[str]) -> None:
    with pytest.raises(UsageError):
        verb_request(args)


def test_the_recorded_command_hides_what_looks_secret() -> None:
    assert redacted_command(
        [
            "xlarun",
            "--env=HF_TOKEN=hf_abc",
            "--env=EPOCHS=3",
            "--rdzv-conf=token=s3cret,timeout=60",
            "train.py",
            "--api-key",
            "k1",
            "--password=p2",
            "AWS_SECRET_ACCESS_KEY=x",
            "--epochs",
            "3",
        ]
    ) == [
        "xlarun",
        "--env=HF_TOKEN=<redacted>",
        "--env=EPOCHS=3",
        "--rdzv-conf=token=<redacted>,timeout=60",
        "train.py",
        "--api-key",
        "<redacted>",
        "--password=<redacted>",
        "AWS_SECRET_ACCESS_KEY=<redacted>",
        "--epochs",
        "3",
    ]


def test_the_newest_runs_that_ended_are_kept_and_running_ones_always(store: JobStore) -> None:
    store.create("running", ["xlarun"], "/work")
    store.set_launcher("running", os.getpid())
    for number in range(4):
        store.create(f"done{number}", ["xlarun"], "/work")
        store.set_end(f"done{number}", 0, "succeeded")
    assert [job.id for job in store.remove_finished(keep=2)] == ["done1", "done0"]
    assert sorted(job.id for job in store.jobs()[0]) == ["done2", "done3", "running"]
    store.remove_finished()
    assert [job.id for job in store.jobs()[0]] == ["running"]


def test_help_names_every_verb() -> None:
    from xlarun.cli.click_command import epilog
    from xlarun.cli.options import VERBS

    assert all(f"xlarun {verb}" in epilog() for verb in VERBS)
