"""One command runs a job on several hosts: the fan-out's behaviour through a local transport.

``--rsh 'env -i PATH=/usr/bin:/bin sh -c {command}'`` starts each host's agent on this machine, as ssh would on the host:
the hosts 127.0.0.2 and 127.0.0.3 are loopback addresses, so node 0 serves its store at the
first one. The same behaviour over a real OpenSSH server is tested in ``test_hosts_ssh.py``.
Every process of a job is found by its run id in ``/proc/<pid>/environ``, never by name.
"""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers import files_exist, kill_all, run_xlarun, wait_for, worker
from hosts import (
    NPROC,
    STOP_DEADLINE_S,
    WORKERS,
    Job,
    agent_of,
    alive,
    assert_worker_lines_carry_host_and_rank,
    describe,
    hanging_python,
    job_processes,
    one_line,
    sleepers,
)

HOSTS = ("127.0.0.2", "127.0.0.3")
LOCAL_RSH = "env -i PATH=/usr/bin:/bin sh -c {command}"
"""A host's agent starts as a login would: with the host's environment, not the launcher's."""
SHELL_RSH = "sh -c '{command}; exit $?'"
"""A transport that stays between the launcher and the agent, as ssh does: the agent is its child."""
PIPED_RSH = "sh -c '{command} | cat'"
"""A transport that, as ssh does, ends only once every holder of the agent's stdout closed it."""


@pytest.fixture
def start(out_dir: Path) -> Iterator[Callable[..., Job]]:
    started: list[Job] = []

    def start_job(*args: object, out: Path = out_dir, env: dict[str, str] | None = None, rsh: str = LOCAL_RSH) -> Job:
        job = Job(["--hosts", ",".join(HOSTS), "--rsh", rsh], out, *args, env=env)
        started.append(job)
        return job

    yield start_job
    for job in started:
        job.cleanup()


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def test_two_hosts_all_reduce_as_one_job(start: Callable[..., Job], out_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    run = start("--summary-file", summary, worker("mn_allreduce.py"), out_dir).finish()
    assert run.returncode == 0, run.stderr
    records = [json.loads((out_dir / f"{rank}.json").read_text()) for rank in range(4)]
    assert [(record["rank"], record["world"], record["sum"]) for record in records] == [
        (rank, 4, 6) for rank in range(4)
    ]
    record = json.loads(summary.read_text())
    assert (record["result"], record["exit_code"]) == ("succeeded", 0)
    assert [
        (host["host"], host["node_rank"], host["transport_exit_status"], host["summary"]["exit_code"])
        for host in record["hosts"]
    ] == [(HOSTS[0], 0, 0, 0), (HOSTS[1], 1, 0, 0)]
    # Every node says the same of its own workers: its launcher's lines name the host they came from.
    notices = [line for line in run.stderr.splitlines() if "OMP_NUM_THREADS=1" in line]
    assert sorted(notices) == sorted(
        f"xlarun: host {host}: OMP_NUM_THREADS=1 for each of the 2 workers "
        "(torchrun's default with several workers per node); set OMP_NUM_THREADS "
        "yourself to choose another value"
        for host in HOSTS
    ), run.stderr


def test_stdout_stays_stdout_and_stderr_stderr(start: Callable[..., Job]) -> None:
    run = start(worker("chatter.py"), 3).finish()
    assert run.returncode == 0, run.stderr
    assert_worker_lines_carry_host_and_rank(run, lambda rank: HOSTS[rank // NPROC])


def test_a_failing_rank_stops_every_host_with_its_exit_code(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "exit:7:1"))
    job.wait_for_workers()
    run = job.finish()
    assert run.returncode == 7, run.stderr
    one_line(run.stderr, f"host {HOSTS[1]}", "rank 3")
    job.assert_gone_within(5, "rank 3 exited 7")


def test_a_failure_is_reported_once_naming_the_host_as_the_user_named_it(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path
) -> None:
    summary = tmp_path / "summary.json"
    job = start("--summary-file", summary, *sleepers(out_dir, "sleep", "sleep", "sleep", "exit:7:1"))
    job.wait_for_workers()
    run = job.finish()
    assert run.returncode == 7, run.stderr
    # Every node prints the job's report (each learns the root cause); the console shows it once.
    one_line(run.stderr, "Root Cause (first observed failure):")
    one_line(run.stderr, "exitcode  : 7")
    one_line(run.stderr, f"xlarun: root cause: host {HOSTS[1]}, rank 3 (exit status 7)")
    # The hosts share this machine, whose own name the report would otherwise give.
    assert one_line(run.stderr, "host      :") == f"  host      : {HOSTS[1]} (node_rank: 1)", run.stderr
    for host in HOSTS:  # the nodes' own lines still arrive
        one_line(run.stderr, f"xlarun: host {host}: OMP_NUM_THREADS=1")
    nodes = [host["summary"] for host in json.loads(summary.read_text())["hosts"]]
    assert [(node["root_cause"]["rank"], node["root_cause"]["host"], node["exit_code"]) for node in nodes] == [
        (3, HOSTS[1], 7)
    ] * 2


def test_a_hang_names_the_host_of_each_nodes_stacks_as_the_user_named_it(
    start: Callable[..., Job], out_dir: Path
) -> None:
    """Rank 3, on the second host, never reaches its all-reduce: the hang's lines name where each node's
    stacks are by the host as ``--hosts`` names it, not by the name the hosts' shared machine gives itself."""
    run = start("--hang-timeout", 3, worker("hang_rank.py"), out_dir, 3).finish()
    assert run.returncode == 124, run.stderr
    assert f"every thread's stack on node 1 ({HOSTS[1]}): " in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGQUIT, 131)]
)
def test_a_stop_signal_stops_every_host_before_the_launcher_exits(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path, stop: int, code: int
) -> None:
    summary = tmp_path / "summary.json"
    job = start("--summary-file", summary, *sleepers(out_dir))
    job.wait_for_workers()
    job.process.send_signal(stop)
    run = job.finish()
    assert run.returncode == code, run.stderr
    assert not job_processes(job.run_id)
    record = json.loads(summary.read_text())
    assert (record["result"], record["exit_code"]) == ("signaled", code)


def test_a_signal_left_out_of_the_list_keeps_its_default_action_and_the_hosts_stop(
    start: Callable[..., Job], out_dir: Path
) -> None:
    job = start("--signals-to-handle", "SIGTERM,SIGINT", *sleepers(out_dir))
    job.wait_for_workers()
    job.process.send_signal(signal.SIGHUP)
    assert job.finish().returncode == -signal.SIGHUP
    job.assert_gone_within(STOP_DEADLINE_S, "the launcher ended by SIGHUP's default action")


@pytest.mark.parametrize("number", [signal.SIGUSR1, signal.SIGUSR2])
def test_user_signals_reach_every_worker_on_every_host(start: Callable[..., Job], out_dir: Path, number: int) -> None:
    job = start(worker("signal_recorder.py"), out_dir)
    ready = files_exist(*(out_dir / f"{rank}.ready" for rank in range(WORKERS)))
    wait_for(lambda: ready() or job.process.poll() is not None, "every worker's handlers")
    assert ready(), job.finish().stderr
    job.process.send_signal(number)
    name = signal.Signals(number).name
    records = [out_dir / f"{rank}.signals" for rank in range(WORKERS)]
    wait_for(
        lambda: all(record.exists() and name in record.read_text() for record in records),
        f"{name} on every worker",
    )
    (out_dir / "finish").touch()
    run = job.finish()
    assert run.returncode == 0, run.stderr


def test_a_killed_agent_takes_its_node_and_workers_with_it(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir), rsh=PIPED_RSH)
    job.wait_for_workers()
    agent_of(job.run_id, 1).kill()
    job.assert_gone_within(STOP_DEADLINE_S, "host 2's agent SIGKILLed")
    run = job.finish()
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, f"xlarun: host {HOSTS[1]}: connection lost")


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_frozen_agent_is_named_within_the_host_timeout(
    start: Callable[..., Job], out_dir: Path, interrupted: bool
) -> None:
    """SIGSTOP to host 2's agent: the launcher hears no heartbeat from it for --host-timeout seconds, names it,
    and ends; a Ctrl-C meanwhile is heard. Its transport's group is killed, the frozen agent with it, and its
    node with the agent."""
    job = start("--host-timeout", 3, *sleepers(out_dir), rsh=SHELL_RSH)
    job.wait_for_workers()
    agent = agent_of(job.run_id, 1)
    agent.suspend()
    try:
        if interrupted:
            job.process.send_signal(signal.SIGINT)
        run = job.finish()
    finally:
        kill_all([agent.pid])
    assert run.returncode == (130 if interrupted else 1), run.stderr
    one_line(run.stderr, f"xlarun: host {HOSTS[1]}: no heartbeat from its agent for 3 s")
    assert "from the launcher" not in run.stderr, run.stderr
    job.assert_gone_within(STOP_DEADLINE_S, "host 2's agent SIGSTOPped")


def outliving(pids: list[int]) -> str:
    """Those of ``pids`` (the hung interpreters of a launcher that exited) still alive :data:`STOP_DEADLINE_S`
    later, described, and killed; empty where none is."""
    deadline = time.monotonic() + STOP_DEADLINE_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = alive(pids)
    described = describe(survivors)
    kill_all(survivors)
    return described


def test_a_host_that_never_gets_ready_is_given_up_at_its_deadline(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path
) -> None:
    python, pids = hanging_python(tmp_path)
    run = start("--host-timeout", 1, "--remote-python", python, worker("marker.py"), out_dir / "ran").finish()
    hung = [int(pid) for pid in pids.read_text().split()]
    survivors = outliving(hung)
    assert run.returncode == 1, run.stderr
    for host in HOSTS:
        one_line(run.stderr, f"xlarun: host {host}: not ready within 4 s")
    assert len(hung) == 2 and not survivors, survivors


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_ends_a_launch_whose_hosts_hang_before_ready(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path, stop: int, code: int
) -> None:
    python, pids = hanging_python(tmp_path)
    job = start("--remote-python", python, worker("marker.py"), out_dir / "ran")
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, "both hosts' interpreters hanging")
    job.process.send_signal(stop)
    run = job.finish()
    hung = [int(pid) for pid in pids.read_text().split()]
    survivors = outliving(hung)
    assert run.returncode == code, run.stderr
    assert len(hung) == 2 and not survivors, survivors


def test_a_killed_launcher_leaves_nothing(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir))
    job.wait_for_workers()
    job.process.kill()
    job.process.communicate()
    job.assert_gone_within(STOP_DEADLINE_S, "the launcher SIGKILLed")


def test_a_frozen_launcher_is_noticed_within_the_host_timeout(start: Callable[..., Job], out_dir: Path) -> None:
    job = start("--host-timeout", 3, *sleepers(out_dir))
    job.wait_for_workers()
    job.process.send_signal(signal.SIGSTOP)
    try:
        job.assert_gone_within(3 + STOP_DEADLINE_S, "the launcher SIGSTOPped with --host-timeout 3")
    finally:
        job.process.send_signal(signal.SIGCONT)
    run = job.finish()
    assert run.returncode != 0, run.stderr
    for host in HOSTS:
        one_line(run.stderr, f"host {host}:", "no heartbeat")


def test_a_lost_transport_stops_every_host(start: Callable[..., Job], out_dir: Path) -> None:
    # The shell stays between the launcher and the agent, as ssh does: killing it is losing the connection.
    job = start(*sleepers(out_dir), rsh=SHELL_RSH)
    job.wait_for_workers()
    second = next(
        transport
        for transport in psutil.Process(job.process.pid).children()
        if any("--node-rank=1" in process.cmdline() for process in transport.children(recursive=True))
    )
    second.kill()
    run = job.finish()
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, f"host {HOSTS[1]}: connection lost (sh exit 137)")
    job.assert_gone_within(STOP_DEADLINE_S, "a transport killed")


def test_env_values_travel_in_the_plan_only(start: Callable[..., Job], out_dir: Path, tmp_path: Path) -> None:
    big = secrets.token_hex(50 * 1024)  # 100 KiB: under Linux's 128 KiB limit on one environment string
    from_file = secrets.token_hex(16)
    env_file = tmp_path / "job.env"
    env_file.write_text(f"# a comment\nFROM_FILE={from_file}\n")
    job = start(
        "--env",
        f"BIG={big}",
        "--env-file",
        env_file,
        *sleepers(out_dir),
        env={"HF_HUB_OFFLINE": "1", "NOT_ALLOWED_TO_TRAVEL": "1"},
    )
    pids = job.wait_for_workers()
    environs = [psutil.Process(pid).environ() for pid in pids]
    command_lines = []
    for process in psutil.process_iter():
        try:
            if process.pid != job.process.pid:  # the launcher's own command line holds what the user typed
                command_lines.append(" ".join(process.cmdline()))
        except psutil.Error:
            pass
    job.process.send_signal(signal.SIGINT)
    assert job.finish().returncode == 130
    for environ in environs:
        assert (environ.get("BIG"), environ.get("FROM_FILE"), environ.get("HF_HUB_OFFLINE")) == (big, from_file, "1")
        assert "NOT_ALLOWED_TO_TRAVEL" not in environ
    assert not [line for line in command_lines if big[:64] in line or from_file in line]


def test_sigint_to_one_job_leaves_another_on_the_same_hosts(start: Callable[..., Job], tmp_path: Path) -> None:
    interrupted_dir, finishing_dir = tmp_path / "interrupted", tmp_path / "finishing"
    interrupted_dir.mkdir()
    finishing_dir.mkdir()
    interrupted = start(*sleepers(interrupted_dir), out=interrupted_dir)
    finishing = start(*sleepers(finishing_dir, *["exit:0:6"] * 4), out=finishing_dir)
    interrupted.wait_for_workers()
    finishing.wait_for_workers()
    interrupted.process.send_signal(signal.SIGINT)
    assert interrupted.finish().returncode == 130
    run = finishing.finish()
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(("value", "words"), [("a\0b", "NUL byte"), ("x" * 131072, "MAX_ARG_STRLEN")])
def test_an_env_value_no_process_could_take_is_refused_before_any_host(tmp_path: Path, value: str, words: str) -> None:
    contacted = tmp_path / "contacted"
    env_file = tmp_path / "job.env"
    env_file.write_text(f"BAD={value}\n")
    run = run_xlarun("--hosts", "h1,h2", "--rsh", f"touch {contacted} {{command}}", "--env-file", env_file, "train.py")
    assert run.returncode == 2, run.stderr
    assert "--env-file" in run.stderr and words in run.stderr and len(run.stderr.splitlines()) == 1, run.stderr
    assert not contacted.exists()


def test_a_hostfile_s_byte_order_mark_is_no_part_of_its_first_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\ufeffh1 slots=4\nh2\n", encoding="utf-8")
    run = run_xlarun("--dry-run", "--hostfile", hostfile, "train.py")
    assert run.returncode == 0, run.stderr
    assert [host["host"] for host in json.loads(run.stdout)["hosts"]] == ["h1", "h2"]


def test_the_dry_run_shows_each_host_s_transport_and_plan_and_contacts_nothing(tmp_path: Path) -> None:
    contacted = tmp_path / "contacted"
    run = run_xlarun(
        "--dry-run",
        "--hosts",
        "h[1-2]",
        "--rsh",
        f"touch {contacted} {{host}} {{command}}",
        "--env",
        "HF_TOKEN=very-secret",
        "--env",
        "PLAIN=shown",
        "--nproc-per-node",
        2,
        "train.py",
        env={"TRACEPARENT": "00-abc", "NOT_ALLOWED_TO_TRAVEL": "1"},
    )
    assert run.returncode == 0, run.stderr
    assert not contacted.exists()
    assert "very-secret" not in run.stdout
    hosts = json.loads(run.stdout)["hosts"]
    assert [host["host"] for host in hosts] == ["h1", "h2"]
    assert hosts[1]["transport"][:3] == ["touch", str(contacted), "h2"]
    assert hosts[1]["transport"][3].endswith(" -m xlarun --agent-stdin")
    plan = hosts[1]["plan"]
    assert (plan["node_rank"], plan["nnodes"], plan["master_addr"]) == (1, 2, "h1")
    assert plan["env"]["HF_TOKEN"] == "<redacted>" and plan["env"]["PLAIN"] == "shown"
    assert plan["env"]["TRACEPARENT"] == "00-abc" and "NOT_ALLOWED_TO_TRAVEL" not in plan["env"]
    assert plan["argv"][-2:] == ["--", "train.py"] and "--node-rank=1" in plan["argv"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--hosts", "h1,h1"), "names h1 twice"),
        (("--hosts", ""), "names no host"),
        (("--hosts", "h1", "--nnodes", "2"), "--nnodes=2 cannot go with --hosts"),
        (("--hosts", "h1", "--node-rank", "1"), "--node-rank=1 cannot go with --hosts"),
        (("--hosts", "h1", "--cluster", "slurm"), "--cluster=slurm cannot go with --hosts"),
        (("--hosts", "h1", "--rsh", "ssh {host}"), "has no {command}"),
        (("--rsh", "sh -c {command}"), "--rsh is for a job on several hosts"),
    ],
)
def test_flags_that_make_no_sense_are_refused_in_one_line(args: tuple[str, ...], words: str) -> None:
    run = run_xlarun(*args, "train.py")
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and len(run.stderr.splitlines()) == 1, run.stderr
