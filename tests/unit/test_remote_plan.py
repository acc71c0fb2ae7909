"""The fan-out's pure parts: host plans, the environment that travels, the transport's argv, the line protocol."""

from __future__ import annotations

from string import Template

import pytest

from xlarun.remote.plan import HostPlan, allowed_environment, plan_hosts, read_env_file, redacted
from xlarun.remote.protocol import AgentReport, go_line, read_order, read_report, signal_line, stop_line
from xlarun.remote.transport import remote_command, template_problem, transport_argv


def plans(**overrides: object) -> list[HostPlan]:
    arguments: dict = {
        "run_id": "r1",
        "master_port": 29500,
        "cwd": "/w",
        "env": {"HF_TOKEN": "t", "A": "1"},
        "host_timeout": 15.0,
        "version": "1.0",
    }
    arguments.update(overrides)
    return plan_hosts(["h1", "h2"], ["--nproc-per-node=2"], ["train.py", "--lr", "1"], **arguments)


def test_node_ranks_follow_the_host_list_with_node_0_on_the_first_host() -> None:
    first, second = plans()
    assert (first.node_rank, second.node_rank, second.nnodes, second.master_addr) == (0, 1, 2, "h1")
    assert second.node_argv("10.0.0.1", 29501) == [
        "--master-addr=10.0.0.1",
        "--master-port=29501",
        "--nproc-per-node=2",
        "--tee=3",
        "--log-line-prefix-template=h2:${rank}: ",
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-id=r1",
        "--",
        "train.py",
        "--lr",
        "1",
    ]


def test_the_user_s_streams_and_prefix_are_kept() -> None:
    argv = plans(prefix_given=True, streams_given=True)[0].argv
    assert not any(word.startswith(("--tee", "--log-line-prefix")) for word in argv)


def test_a_dollar_in_a_host_s_name_is_no_macro_of_its_prefix() -> None:
    argv = plan_hosts(
        ["h${rank}"],
        [],
        ["train.py"],
        run_id="r1",
        master_port=None,
        cwd="/w",
        env={},
        host_timeout=15.0,
        version="1.0",
    )[0].argv
    template = next(word for word in argv if word.startswith("--log-line-prefix-template="))
    assert Template(template.partition("=")[2]).safe_substitute(rank=3) == "h${rank}:3: "


def test_tpu_vm_hosts_read_their_ranks_themselves() -> None:
    plan = plans(cluster_ranks=True)[1]
    assert plan.node_rank is None and "--cluster=tpu-vm" in plan.argv and "--node-rank=1" not in plan.argv
    assert plan.node_argv(plan.master_addr, None)[0] == "--nproc-per-node=2"


def test_a_plan_survives_its_json_line() -> None:
    plan = plans(env={"BIG": "x" * 100_000, "NL": "a\nb"})[1]
    line = plan.to_json()
    assert "\n" not in line and HostPlan.from_json(line) == plan


def test_only_allowed_variables_travel() -> None:
    environ = {
        "XLARUN_X": "1",
        "PJRT_DEVICE": "CPU",
        "HF_HOME": "/h",
        "TRACEPARENT": "00-1",
        "PATH": "/bin",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "s",
        "PYTHONPATH": "/p",
    }
    assert allowed_environment(environ) == {
        "XLARUN_X": "1",
        "PJRT_DEVICE": "CPU",
        "HF_HOME": "/h",
        "TRACEPARENT": "00-1",
        "PYTHONPATH": "/p",
    }


def test_the_dry_run_redacts_secret_looking_names() -> None:
    assert redacted({"HF_TOKEN": "t", "API_KEY": "k", "A": "1"}) == {
        "HF_TOKEN": "<redacted>",
        "API_KEY": "<redacted>",
        "A": "1",
    }
    assert plans()[0].shown()["env"]["HF_TOKEN"] == "<redacted>"


def test_env_files_read_as_docker_reads_them() -> None:
    assert read_env_file("# c\n\nA=1\nB=x=y\nC=\n") == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="line 2"):
        read_env_file("A=1\nnot an assignment\n")


def test_ssh_runs_the_agent_without_a_terminal_or_a_prompt() -> None:
    argv = transport_argv("h1", 0, remote_command("/v/bin/python"), ssh_config="cfg")
    assert argv[:2] == ["ssh", "-T"] and "BatchMode=yes" in argv and "ServerAliveInterval=5" in argv
    assert argv[-5:] == ["-F", "cfg", "--", "h1", "/v/bin/python -m xlarun --agent-stdin"]


def test_a_template_keeps_the_command_one_word() -> None:
    argv = transport_argv(
        "h2", 1, "py -m xlarun --agent-stdin", rsh_template="kubectl exec -i {host} -- sh -c {command}"
    )
    assert argv == ["kubectl", "exec", "-i", "h2", "--", "sh", "-c", "py -m xlarun --agent-stdin"]
    assert transport_argv("a", 3, "c", rsh_template="g --worker={index} --command {command}") == [
        "g",
        "--worker=3",
        "--command",
        "c",
    ]


def test_templates_without_a_command_are_refused() -> None:
    assert template_problem("ssh {host}") is not None
    assert template_problem("ssh 'unclosed {command}") is not None
    assert template_problem("ssh {host} {command}") is None


def test_reports_are_told_from_output() -> None:
    report = AgentReport("end", {"exit_code": 7, "summary": None})
    assert read_report(report.line()) == report
    assert read_report(b"h1:0: hello\n") is None
    assert read_order(b"\n") == ("", {})
    assert read_order(go_line("10.0.0.1", 29501)) == ("go", {"master_addr": "10.0.0.1", "master_port": 29501})
    assert read_order(stop_line()) == ("stop", {})
    assert read_order(b"nonsense\n") == ("stop", {})
    assert read_order(signal_line(10)) == ("signal", {"number": 10})
    assert read_order(b"signal {}\n") == ("stop", {})
