"""The command line: torchrun's flags in both spellings, unique prefixes, PET_* defaults, script args untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, XLARUN, clean_env, plan, run_xlarun, worker

# torchrun 2.15's flags (first spelling as its --help shows it), in its order.
TORCHRUN_FLAGS = [
    "--nnodes",
    "--nproc-per-node",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-conf",
    "--standalone",
    "--max-restarts",
    "--monitor-interval",
    "--start-method",
    "--event-log-handler",
    "--role",
    "-m",
    "--no-python",
    "--run-path",
    "--log-dir",
    "-r",
    "-t",
    "--log-line-prefix-template",
    "--local-ranks-filter",
    "--duplicate-stdout-filters",
    "--duplicate-stderr-filters",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--local-addr",
    "--logs-specs",
    "--numa-binding",
    "--signals-to-handle",
    "--shutdown-timeout",
    "--virtual-local-rank",
    "--print-completion",
]
XLARUN_OWN_FLAGS = ["--dry-run", "--summary-file", "--device"]


def first_env(document: dict) -> dict[str, str]:
    return document["workers"][0]["env"]


@pytest.mark.parametrize(
    "flags", [["--nproc_per_n=2"], ["--nproc-per-n", "2"], ["--nproc_per_node=2"], ["--nproc-per-node", "2"]]
)
def test_nproc_spellings_and_prefixes(flags: list[str]) -> None:
    assert plan(*flags, "train.py")["nproc_per_node"] == 2


SPELLINGS = {
    # flag: (dash spelling, underscore spelling, a unique prefix, value, where the plan shows it)
    "master port": ("--master-port", "--master_port", "--master-po", "29123", lambda d: first_env(d)["MASTER_PORT"]),
    "master addr": ("--master-addr", "--master_addr", "--master_a", "10.1.2.3", lambda d: d["master_addr"]),
    "rdzv id": ("--rdzv-id", "--rdzv_id", "--rdzv-i", "job-9", lambda d: d["run_id"]),
    "max restarts": (
        "--max-restarts",
        "--max_restarts",
        "--max",
        "4",
        lambda d: first_env(d)["TORCHELASTIC_MAX_RESTARTS"],
    ),
    "node rank": ("--node-rank", "--node_rank", "--node_", "1", lambda d: first_env(d)["GROUP_RANK"]),
    "log dir": (
        "--log-dir",
        "--log_dir",
        "--log-d",
        "/var/tmp/runs",
        lambda d: first_env(d)["TORCHELASTIC_ERROR_FILE"].split("/none_")[0],
    ),
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_both_spellings_and_prefixes_mean_the_same(name: str) -> None:
    dash, underscore, prefix, value, read = SPELLINGS[name]
    # A static node with its master port: without one, torchrun 2.12 and newer run a lone node as --standalone.
    extra = {"node rank": ["--nnodes", "2"], "master port": []}.get(name, ["--master-port", "29500"])
    readings = [read(plan(*extra, spelling, value, "train.py")) for spelling in (dash, underscore, prefix)]
    assert readings == [value, value, value]


def test_prefix_of_redirects_writes_files(tmp_path: Path, port: int) -> None:
    result = run_xlarun("--redirect=3", "--log_d", tmp_path, "--master_p", port, worker("chatter.py"), "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert [path.name for path in sorted(tmp_path.glob("*/attempt_0/0/*"))] == ["stderr.log", "stdout.log"]


def test_pet_variables_are_defaults_and_flags_win() -> None:
    assert plan("train.py", env={"PET_NPROC_PER_NODE": "3"})["nproc_per_node"] == 3
    assert plan("--nproc_per_node", "2", "train.py", env={"PET_NPROC_PER_NODE": "3"})["nproc_per_node"] == 2
    document = plan("train.py", env={"PET_MASTER_PORT": "29777", "PET_RDZV_ID": "from-env", "PET_ROLE": "actor"})
    assert (document["master_port"], document["run_id"], first_env(document)["ROLE_NAME"]) == (
        29777,
        "from-env",
        "actor",
    )


def test_pet_booleans_are_integers() -> None:
    standalone = plan("train.py", env={"PET_STANDALONE": "1"})
    assert standalone["master_addr"] == "localhost"
    assert standalone["run_id"] == "<decided at rendezvous>"  # a fresh uuid at start
    assert plan("mod", env={"PET_MODULE": "1"})["workers"][0]["argv"] == [PYTHON, "-u", "-m", "mod"]
    assert plan("/bin/true", env={"PET_NO_PYTHON": "1"})["workers"][0]["argv"] == ["/bin/true"]
    assert plan("train.py", env={"PET_STANDALONE": "0", "PET_MASTER_PORT": "29500"})["master_addr"] == "127.0.0.1"


def test_arguments_after_the_script_are_untouched() -> None:
    document = plan("--nproc_per_node", "1", "train.py", "--nproc-per-node=3", "--dry-run", "-m", "--", "-r", "x")
    assert document["nproc_per_node"] == 1
    assert document["workers"][0]["argv"] == [
        PYTHON,
        "-u",
        "train.py",
        "--nproc-per-node=3",
        "--dry-run",
        "-m",
        "--",
        "-r",
        "x",
    ]


def test_leading_double_dash_is_dropped_once() -> None:
    assert plan("--", "train.py", "a")["workers"][0]["argv"] == [PYTHON, "-u", "train.py", "a"]
    assert plan("train.py", "--", "a")["workers"][0]["argv"] == [PYTHON, "-u", "train.py", "a"]


def test_local_rank_is_substituted_in_script_arguments() -> None:
    workers = plan("--nproc_per_node", "3", "train.py", "--out=shard_${local_rank}.pt")["workers"]
    assert [entry["argv"][-1] for entry in workers] == ["--out=shard_0.pt", "--out=shard_1.pt", "--out=shard_2.pt"]


def test_nproc_cpu_counts_this_hosts_cpus() -> None:
    assert plan("--nproc_per_node", "cpu", "train.py")["nproc_per_node"] == os.cpu_count()


def test_compatibility_flags_are_accepted() -> None:
    document = plan(
        "--monitor-interval",
        "5",
        "--start-method",
        "fork",
        "--event-log-handler",
        "console",
        "--local-addr",
        "127.0.0.1",
        "--numa-binding",
        "node",
        "--logs-specs",
        "default",
        "--rdzv-conf",
        "timeout=60,read_timeout=10",
        "train.py",
    )
    assert document["nproc_per_node"] == 1


def test_run_path_runs_the_file_as_main(tmp_path: Path, port: int) -> None:
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()
    result = run_xlarun(
        "--run-path",
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        worker("dump_env.py"),
        "a",
        env={"DUMP_DIR": str(dump_dir)},
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        ran = json.loads((dump_dir / f"{rank}_0.json").read_text())
        assert ran["argv"] == [worker("dump_env.py"), "a"]
        assert ran["env"]["LOCAL_RANK"] == str(rank)


def help_sections(text: str) -> dict[str, str]:
    parts = re.split(r"^(torchrun options|xlarun options):$", text, flags=re.MULTILINE)
    return {parts[index]: parts[index + 1] for index in range(1, len(parts), 2)}


def test_help_lists_torchruns_flags_and_xlaruns_own_apart() -> None:
    result = run_xlarun("--help")
    assert result.returncode == 0
    sections = help_sections(result.stdout)
    assert set(sections) == {"torchrun options", "xlarun options"}
    shown = re.findall(r"^  (-\S+?),? ", sections["torchrun options"], flags=re.MULTILINE)
    assert [flag for flag in shown if flag not in ("-h",)] == TORCHRUN_FLAGS
    for flag in TORCHRUN_FLAGS:
        if flag.startswith("--") and "-" in flag[2:]:
            assert flag.replace("-", "_").replace("__", "--", 1) in sections["torchrun options"]
    for flag in XLARUN_OWN_FLAGS:
        assert flag in sections["xlarun options"] and flag not in sections["torchrun options"]


def test_console_script_and_module_entry_points() -> None:
    console_script = Path(PYTHON).with_name("xlarun")
    for command in ([str(console_script)], XLARUN):
        completed = subprocess.run([*command, "--help"], capture_output=True, text=True, env=clean_env())
        assert completed.returncode == 0 and "torchrun options" in completed.stdout


def test_a_launch_imports_no_torch(port: int) -> None:
    completed = subprocess.run(
        [
            PYTHON,
            "-X",
            "importtime",
            "-m",
            "xlarun",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            worker("chatter.py"),
            "1",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert completed.returncode == 0, completed.stderr
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in completed.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    assert "xlarun.supervision.group" in imported
    assert [name for name in imported if name.split(".")[0] in ("torch", "torch_xla")] == []


# ---- --help as a manual


@pytest.fixture(scope="module")
def help_text() -> str:
    result = run_xlarun("--help")
    assert result.returncode == 0, result.stderr
    # One line per option row: click wraps the help column.
    return re.sub(r"\n {20,}", " ", result.stdout)


def help_row(text: str, spelling: str) -> str:
    return next(
        line
        for line in text.splitlines()
        if line.strip().startswith(spelling + " ") or line.strip().startswith(spelling + ",")
    )


def test_help_names_every_value_and_marks_the_script_required(help_text: str) -> None:
    from xlarun.cli.options import OPTIONS

    assert re.search(r"\s(-\S+) VALUE\b", help_text) is None
    assert help_text.startswith("Usage: xlarun [OPTIONS] TRAINING_SCRIPT [SCRIPT_ARGS]...")
    for option in OPTIONS:
        if option.takes_value:
            assert option.metavar, option.dest
            assert f"{option.spellings[-1]} {option.metavar}" in help_row(help_text, option.spellings[0])


@pytest.mark.parametrize(
    "spelling, default",
    [
        ("--nnodes", "1:1"),
        ("--nproc-per-node", "1"),
        ("--master-addr", "127.0.0.1"),
        ("--master-port", "29500"),
        ("--rdzv-backend", "static"),
        ("--max-restarts", "0"),
        ("--device", "auto; env: XLARUN_DEVICE"),
        ("--cluster", "none; env: XLARUN_CLUSTER"),
        ("--runtime", "auto"),
        ("--rdzv-endpoint", "MASTER_ADDR:29400 under c10d"),
        ("--shutdown-timeout", "30; env: TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
        ("--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
        ("--log-line-prefix-template", "[${role_name}${local_rank}]:"),
        ("--duplicate-stdout-filters", "no copy"),
        ("--duplicate-stderr-filters", "no copy"),
    ],
)
def test_help_shows_the_defaults(help_text: str, spelling: str, default: str) -> None:
    assert help_row(help_text, spelling).endswith(f"[default: {default}]")


def test_help_explains_the_values_a_newcomer_asks_about(help_text: str) -> None:
    from xlarun.rdzv_conf import default_seconds
    from xlarun.runtimes import coordinator_port

    assert "auto: one per TPU chip, NeuronCore or GPU" in help_row(help_text, "--nproc-per-node")
    conf = help_row(help_text, "--rdzv-conf")
    for key in ("join_timeout", "close_timeout", "heartbeat_timeout", "last_call_timeout"):
        assert f"{key} ({default_seconds(key):g}" in conf
    for key in ("timeout", "is_host", "token"):
        assert f" {key} (" in conf
    assert f"{coordinator_port(29500)} for 29500" in help_row(help_text, "--coordinator-port")
    assert "xrt needs torch_xla 2.0 or older" in help_row(help_text, "--runtime")
    assert "use_spmd()" in help_row(help_text, "--spmd")
    assert help_row(help_text, "--virtual-devices").split("N ", 1)[1].strip().startswith("CPU only")
    assert "Validated, not applied" in help_row(help_text, "--numa-binding")
    for variable in (
        "PET_<FLAG>",
        "XLARUN_DEVICE",
        "XLARUN_CLUSTER",
        "XLARUN_RDZV_TOKEN",
        "XLARUN_DEBUG",
        "XLARUN_HOST_ROOT",
        "XLARUN_LAUNCHED",
    ):
        assert variable in help_text.split("Environment:")[1], variable


def test_version() -> None:
    import xlarun

    for spelling in ("--version", "--vers"):
        result = run_xlarun(spelling)
        assert (result.returncode, result.stdout, result.stderr) == (0, f"xlarun {xlarun.__version__}\n", "")
