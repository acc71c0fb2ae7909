"""One command runs a job on several hosts over real ssh: the private sshd of ``tests/sshd.py``
serves the hosts h1, h2 and h3 (127.0.0.2-4) on this machine, and xlarun reaches them with the
system's OpenSSH client and the fixture's ``--ssh-config``.

The faults are real: a worker's exit, SIGINT, SIGKILL and SIGSTOP of the launcher, a connection
reset by ``ss -K``, the server's session process killed, a key the server refuses. All hosts
share this machine's ``/proc``: a job's processes are found by its run id in
``/proc/<pid>/environ`` (the workers' ``TORCHELASTIC_RUN_ID``, and a variable every node and
worker of the job gets through ``--env``), never by name.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import worker
from hosts import (
    NPROC,
    STOP_DEADLINE_S,
    Job,
    agent_of,
    assert_worker_lines_carry_host_and_rank,
    describe,
    job_processes,
    one_line,
    sleepers,
)
from sshd import HOSTS, SshHosts

pytestmark = pytest.mark.ssh

FAST_EXIT_S = 8
"""A launcher answers a worker's failure or SIGINT within this (a few seconds, on a loaded 2-core machine)."""


def worker_environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


@pytest.fixture
def jobs(ssh_hosts: SshHosts) -> Iterator[list[Job]]:
    """The jobs a test starts; whatever is left of them is killed at teardown."""
    started: list[Job] = []
    yield started
    for job in started:
        job.cleanup()


@pytest.fixture
def start(ssh_hosts: SshHosts, jobs: list[Job], out_dir: Path) -> Callable[..., Job]:
    """Start a job on h1 and h2 (``Job``'s arguments; its workers write to ``out``, ``out_dir`` unless given)."""

    def start_job(
        *args: object, out: Path = out_dir, ssh_config: Path | None = None, env: dict[str, str] | None = None
    ) -> Job:
        job = Job(["--hosts", "h1,h2", "--ssh-config", ssh_config or ssh_hosts.config], out, *args, env=env)
        jobs.append(job)
        return job

    return start_job


def test_two_hosts_all_reduce_as_one_job(start: Callable[..., Job], out_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    job = start("--summary-file", summary, worker("mn_allreduce.py"), out_dir)
    run = job.finish()
    assert run.returncode == 0, run.stderr
    records = [json.loads((out_dir / f"{rank}.json").read_text()) for rank in range(4)]
    assert [record["rank"] for record in records] == [0, 1, 2, 3]
    assert {record["world"] for record in records} == {4}
    assert {record["sum"] for record in records} == {0 + 1 + 2 + 3}
    hosts = json.loads(summary.read_text())["hosts"]
    assert [host["host"] for host in hosts] == ["h1", "h2"], hosts
    assert [host["transport_exit_status"] for host in hosts] == [0, 0], hosts
    assert [host["summary"]["exit_code"] for host in hosts] == [0, 0], hosts


def test_every_worker_line_names_its_host_and_rank(start: Callable[..., Job]) -> None:
    run = start(worker("chatter.py"), 3).finish()
    assert run.returncode == 0, run.stderr
    assert_worker_lines_carry_host_and_rank(run, lambda rank: "h1" if rank < NPROC else "h2")


def test_a_failing_rank_stops_every_host_with_its_exit_code(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "exit:7:2"))
    job.wait_for_workers()
    failed_at = time.monotonic() + 2
    run = job.finish()
    assert run.returncode == 7, run.stderr
    assert time.monotonic() - failed_at < FAST_EXIT_S, run.stderr
    report = [line for line in run.stderr.splitlines() if "h2" in line and re.search(r"\brank 3\b", line)]
    assert report, run.stderr
    # One report on the console, its host the ssh alias (both hosts are this machine, one hostname).
    one_line(run.stderr, "Root Cause (first observed failure):")
    assert one_line(run.stderr, "host      :") == "  host      : h2 (node_rank: 1)", run.stderr
    job.assert_gone_within(5, "rank 3 exited 7")


def test_sigint_stops_every_host_and_exits_130(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    job.process.send_signal(signal.SIGINT)
    run = job.finish()
    assert run.returncode == 130, run.stderr
    assert not job_processes(job.run_id), describe(job_processes(job.run_id))


def test_a_killed_launcher_leaves_no_worker_on_any_host(start: Callable[..., Job], out_dir: Path) -> None:
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    job.process.kill()
    job.process.communicate()
    job.assert_gone_within(STOP_DEADLINE_S, "the launcher SIGKILLed")


def test_a_frozen_launcher_is_noticed_within_the_host_timeout(start: Callable[..., Job], out_dir: Path) -> None:
    job = start("--host-timeout", 3, *sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    job.process.send_signal(signal.SIGSTOP)
    job.assert_gone_within(3 + STOP_DEADLINE_S, "the launcher SIGSTOPped with --host-timeout 3")
    job.process.send_signal(signal.SIGCONT)
    run = job.finish()
    assert run.returncode != 0, run.stderr
    for alias in ("h1", "h2"):
        one_line(run.stderr, f"host {alias}:", "heartbeat")


def test_a_killed_agent_leaves_no_node_or_worker_and_the_launcher_ends(
    start: Callable[..., Job], out_dir: Path
) -> None:
    """SIGKILL to h2's agent: sshd keeps the session while anything holds its pipes, so the node must learn by
    itself that its agent is gone; the launcher then hears the host end."""
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    agent_of(job.run_id, 1).kill()
    job.assert_gone_within(STOP_DEADLINE_S, "h2's agent SIGKILLed")
    run = job.finish()
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, "xlarun: host h2: connection lost")


def test_a_frozen_agent_is_named_and_its_node_stops_once_it_runs_again(
    start: Callable[..., Job], out_dir: Path
) -> None:
    """SIGSTOP to h2's agent: the launcher hears no heartbeat from it for --host-timeout seconds, names it and
    stops h1; the ssh client it stopped closed the agent's input, so the agent stops its node once continued."""
    job = start("--host-timeout", 3, *sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    agent = agent_of(job.run_id, 1)
    agent.suspend()
    try:
        job.process.send_signal(signal.SIGINT)  # heard, though one host cannot answer
        run = job.finish()
    finally:
        agent.resume()
    assert run.returncode == 130, run.stderr
    one_line(run.stderr, "xlarun: host h2: no heartbeat from its agent for 3 s")
    assert "from the launcher" not in run.stderr, run.stderr
    job.assert_gone_within(STOP_DEADLINE_S, "h2's agent SIGSTOPped, then continued")


@pytest.mark.parametrize("fault", ["ss -K", "sshd session killed"])
def test_a_lost_connection_stops_every_host(
    start: Callable[..., Job], ssh_hosts: SshHosts, out_dir: Path, fault: str
) -> None:
    job = start(*sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"))
    job.wait_for_workers()
    if fault == "ss -K":
        subprocess.run(
            ["ss", "-K", "dst", HOSTS["h2"], "dport", "=", f":{ssh_hosts.port}"], check=True, capture_output=True
        )
    else:
        sessions = ssh_hosts.sessions_to("h2")
        assert sessions, "no sshd session serves h2"
        for session in sessions:
            session.kill()
    run = job.finish()
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, "host h2: connection lost (ssh exit 255)")
    if fault == "ss -K":
        # ssh's own words on the connection's end (its log: "client_loop: send disconnect: Broken pipe") name
        # the host, as every launcher line does. A session killed on the server has ssh write "Connection to ...
        # closed by remote host." to its stderr itself, among the remote command's lines, where nothing tells it apart.
        unnamed = [line for line in run.stderr.splitlines() if not line.startswith(("xlarun: ", "h1:", "h2:"))]
        assert unnamed == [], run.stderr
        one_line(run.stderr, "xlarun: host h2: client_loop: send disconnect: Broken pipe")
    job.assert_gone_within(STOP_DEADLINE_S, fault)


def test_a_missing_remote_cwd_is_refused_before_any_worker(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir"
    run = start("--remote-cwd", missing, worker("marker.py"), out_dir / "ran").finish()
    assert run.returncode == 1, run.stderr
    for alias in ("h1", "h2"):
        one_line(run.stderr, f"host {alias}:", str(missing))
    assert not (out_dir / "ran").exists()


def test_a_missing_interpreter_is_refused_before_any_worker(start: Callable[..., Job], out_dir: Path) -> None:
    run = start("--remote-python", "/nonexistent/python", worker("marker.py"), out_dir / "ran").finish()
    assert run.returncode == 1, run.stderr
    for alias in ("h1", "h2"):
        one_line(run.stderr, f"host {alias}: /nonexistent/python not found")
    assert not (out_dir / "ran").exists()


def test_a_refused_key_on_one_host_starts_no_worker_anywhere(
    start: Callable[..., Job], ssh_hosts: SshHosts, out_dir: Path, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True, capture_output=True
    )
    config = ssh_hosts.config_with_identity(tmp_path / "ssh_config", stranger, aliases=("h2",))
    run = start(worker("marker.py"), out_dir / "ran", ssh_config=config).finish()
    assert run.returncode == 1, run.stderr
    one_line(run.stderr, "host h2:", "Permission denied (publickey)")
    assert "host h1:" not in run.stderr
    assert not (out_dir / "ran").exists()


def test_env_values_reach_every_host_and_no_command_line(
    start: Callable[..., Job], out_dir: Path, tmp_path: Path
) -> None:
    big = secrets.token_hex(50 * 1024)  # 100 KiB: under Linux's 128 KiB limit on one environment string
    from_file = secrets.token_hex(16)
    env_file = tmp_path / "job.env"
    env_file.write_text(f"# a comment\nFROM_FILE={from_file}\n")
    job = start(
        "--env",
        f"BIG={big}",
        "--env-file",
        env_file,
        *sleepers(out_dir, "sleep", "sleep", "sleep", "sleep"),
        env={"HF_HUB_OFFLINE": "1", "NOT_ALLOWED_TO_TRAVEL": "1"},
    )
    pids = job.wait_for_workers()
    environs = [worker_environ(pid) for pid in pids]
    command_lines = []  # every process's but the launcher's own, whose command line the user wrote
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != job.process.pid:
            try:
                command_lines.append(Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                pass
    job.process.send_signal(signal.SIGINT)
    run = job.finish()
    assert run.returncode == 130, run.stderr
    for environ in environs:
        assert environ.get("BIG") == big
        assert environ.get("FROM_FILE") == from_file
        assert environ.get("HF_HUB_OFFLINE") == "1"
        assert "NOT_ALLOWED_TO_TRAVEL" not in environ
    servers = {
        environ.get("SSH_CONNECTION", "").split(" ")[2:3][0] for environ in environs if environ.get("SSH_CONNECTION")
    }
    assert servers == {HOSTS["h1"], HOSTS["h2"]}
    assert not [line for line in command_lines if big[:64].encode() in line or from_file.encode() in line]


def test_sigint_to_one_job_leaves_another_on_the_same_hosts(start: Callable[..., Job], tmp_path: Path) -> None:
    interrupted_dir, finishing_dir = tmp_path / "interrupted", tmp_path / "finishing"
    interrupted_dir.mkdir()
    finishing_dir.mkdir()
    interrupted = start(*sleepers(interrupted_dir, "sleep", "sleep", "sleep", "sleep"), out=interrupted_dir)
    finishing = start(*sleepers(finishing_dir, *["exit:0:8"] * 4), out=finishing_dir)
    interrupted.wait_for_workers()
    finishing.wait_for_workers()
    interrupted.process.send_signal(signal.SIGINT)
    assert interrupted.finish().returncode == 130
    run = finishing.finish()
    assert run.returncode == 0, run.stderr
    interrupted.assert_gone_within(0, "the interrupted job")
