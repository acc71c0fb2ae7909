"""Unit layer: the option table, parsing, and every refusal of bad input, in-process.

Each case goes through the same two steps a launch takes before anything starts
(``parse_command_line`` and ``plan_launch``); ``test_bad_input.py`` launches a few of
them for real to show that a refusal starts nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import TESTS, prepare, refusal

from xlarun.cli.click_command import parse_with_click
from xlarun.cli.command import parse_command_line, split_command_line
from xlarun.cli.options import OPTIONS, OPTIONS_BY_DEST, TORCHRUN, read_options
from xlarun.config import NprocRequest
from xlarun.exceptions import UsageError

# (launcher flags before the script, PET_* or other variables, text the error line must hold)
BAD_INPUTS = {
    "nnodes three fields": (["--nnodes", "1:2:3"], {}, "--nnodes='1:2:3'"),
    "nnodes zero": (["--nnodes", "0"], {}, "0 < MIN <= MAX"),
    "nnodes min above max": (["--nnodes", "3:2"], {}, "0 < MIN <= MAX"),
    "nnodes not a number": (["--nnodes", "two"], {}, "--nnodes='two'"),
    "nnodes range with static rendezvous": (["--nnodes", "1:2"], {}, "--rdzv-backend=c10d"),
    "nproc zero": (["--nproc_per_node", "0"], {}, "--nproc-per-node='0'"),
    "nproc negative": (["--nproc_per_node", "-2"], {}, "--nproc-per-node='-2'"),
    "nproc word": (["--nproc_per_node", "many"], {}, "auto, cpu, gpu or xpu"),
    "nproc gpu without gpus": (["--nproc_per_node", "gpu"], {}, "--nproc-per-node='gpu' found no visible GPU"),
    # A dry run: the refusal holds where torch_xla is not installed too (the real run first needs torch_xla).
    "nproc with spmd": (
        ["--dry-run", "--spmd", "--nproc_per_node", "2"],
        {},
        "--nproc-per-node='2' cannot run under SPMD",
    ),
    "master port out of range": (["--master_port", "65536"], {}, "0..65535"),
    "master port not a number": (["--master_port", "http"], {}, "--master-port='http'"),
    "node rank out of range": (["--nnodes", "2", "--node_rank", "2"], {}, "must be 0..1"),
    "node rank negative": (["--node_rank", "-1"], {}, "non-negative"),
    "redirects value": (["--redirects", "4"], {}, "0-3"),
    "redirects mapping": (["-r", "0:1,1:9"], {}, "LOCAL_RANK:0-3"),
    "tee garbage": (["-t", "all"], {}, "--tee='all'"),
    "tee trailing comma": (["--tee", "0:1,"], {}, "--tee='0:1,'"),
    "local ranks filter": (["--local-ranks-filter", "0,x"], {}, "comma-separated"),
    "max restarts negative": (["--max-restarts", "-1"], {}, "non-negative"),
    "monitor interval zero": (["--monitor-interval", "0"], {}, "positive"),
    "rendezvous backend": (["--rdzv-backend", "zookeeper"], {}, "static, c10d"),
    "etcd rendezvous": (["--rdzv-backend", "etcd"], {}, "not supported by xlarun"),
    "rendezvous endpoint": (["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1"], {}, "[addr]:port"),
    "rendezvous conf": (["--rdzv-conf", "timeout"], {}, "key=value"),
    "start method": (["--start-method", "thread"], {}, "spawn, fork, forkserver"),
    "numa binding": (["--numa-binding", "everywhere"], {}, "node, socket"),
    "logs specs": (["--logs-specs", "fancy"], {}, "--logs-specs='fancy'"),
    "kill timeout negative": (["--kill-timeout", "-1"], {}, "--shutdown-timeout='-1'"),
    "kill timeout word": (["--kill-timeout", "soon"], {}, "--shutdown-timeout='soon'"),
    "kill timeout infinite": (["--kill-timeout", "inf"], {}, "--shutdown-timeout='inf'"),
    "shutdown timeout negative": (["--shutdown_timeout", "-5"], {}, "--shutdown-timeout='-5' is invalid"),
    "shutdown timeout from PET": ([], {"PET_SHUTDOWN_TIMEOUT": "later"}, "(from PET_SHUTDOWN_TIMEOUT)='later'"),
    "shutdown timeout from torch's variable": (
        [],
        {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "-1"},
        "--shutdown-timeout (from TORCH_ELASTIC_SHUTDOWN_TIMEOUT)='-1'",
    ),
    "signal name": (["--signals-to-handle", "SIGTERM,SIGFOO"], {}, "'SIGFOO' is no signal name"),
    "signal without SIG": (["--signals_to_handle", "USR1"], {}, "'USR1' is no signal name"),
    "signal that cannot be handled": (["--signals-to-handle", "SIGTERM,SIGKILL"], {}, "SIGKILL cannot be handled"),
    "signal from PET": ([], {"PET_SIGNALS_TO_HANDLE": "sigterm"}, "--signals-to-handle (from PET_SIGNALS_TO_HANDLE)"),
    "virtual local rank past CUDA_VISIBLE_DEVICES": (
        ["--virtual-local-rank", "--nproc_per_node", "3"],
        {"CUDA_VISIBLE_DEVICES": "4,5"},
        "CUDA_VISIBLE_DEVICES='4,5'",
    ),
    "virtual local rank PET boolean": (
        [],
        {"PET_VIRTUAL_LOCAL_RANK": "true"},
        "(from PET_VIRTUAL_LOCAL_RANK) must be 0 or 1",
    ),
    "nproc xpu without xpus": (["--nproc_per_node", "xpu"], {}, "--nproc-per-node='xpu' found no XPU on this host"),
    "nproc tpu without chips": (
        ["--nproc_per_node", "tpu"],
        {},
        "--nproc-per-node='tpu' found no TPU chips on this host (the device is cpu): give a number, cpu or auto",
    ),
    "nproc neuron on another device": (
        ["--nproc_per_node", "neuron", "--dry-run"],
        {"XLARUN_HOST_ROOT": str(TESTS / "fixtures" / "hosts" / "tpu-v4-vm")},
        "--nproc-per-node='neuron' found no Neuron devices on this host (the device is tpu)",
    ),
    "nproc not a word": (["--nproc_per_node", "2x"], {}, "--nproc-per-node='2x' is invalid"),
    "completion shell": (["--print-completion", "fish"], {}, "'fish' is not one of 'bash', 'zsh', 'tcsh'"),
    "summary file is a directory": (["--summary-file", "/"], {}, "--summary-file='/'"),
    "device": (["--device", "gpu"], {}, "--device='gpu' is invalid: expected one of auto, tpu"),
    "device from the environment": ([], {"XLARUN_DEVICE": "fpga"}, "--device (from XLARUN_DEVICE)='fpga'"),
    "runtime": (["--runtime", "grpc"], {}, "--runtime='grpc' is invalid: expected one of auto, pjrt, xrt"),
    "cluster": (["--cluster", "pbs"], {}, "--cluster='pbs' is invalid: expected one of none, auto, slurm"),
    "virtual devices": (["--virtual-devices", "0"], {}, "--virtual-devices='0'"),
    "virtual devices off cpu": (["--device", "tpu", "--virtual-devices", "2"], {}, "cpu device only"),
    "coordinator port": (["--coordinator-port", "70000"], {}, "--coordinator-port='70000'"),
    "coordinator port is the master port": (
        ["--coordinator-port", "29500", "--master-port", "29500"],
        {},
        "is the master port",
    ),
    "spmd with xrt": (["--spmd", "--runtime", "xrt"], {}, "SPMD needs the PJRT runtime"),
    "unknown option": (["--nproc_per_node", "1", "--turbo"], {}, "--turbo"),
    "unknown short option": (["-x"], {}, "-x"),
    "ambiguous prefix": (["--no"], {}, "--no-python"),
    "flag given a value": (["--standalone=1"], {}, "--standalone"),
    "option without its value at the end": (["--nproc_per_node"], {}, "--nproc_per_node: expected one argument"),
    "module with no-python": (["-m", "--no-python"], {}, "'--no-python' flag and the '--module' flag"),
    "run-path with module": (["--run-path", "-m"], {}, "--run-path"),
    "standalone with several nodes": (["--standalone", "--nnodes", "2"], {}, "--standalone"),
    "bad PET value": ([], {"PET_NPROC_PER_NODE": "lots"}, "--nproc-per-node (from PET_NPROC_PER_NODE)='lots'"),
    "bad PET boolean": ([], {"PET_STANDALONE": "yes"}, "PET_STANDALONE"),
    "bad PET nnodes": ([], {"PET_NNODES": "1:2:3"}, "PET_NNODES"),
    "shutdown timeout past the bound": (
        ["--shutdown-timeout", "99999999"],
        {},
        "--shutdown-timeout='99999999' is invalid (over 7 days): expected a number of "
        "seconds from 0 to 604800 (7 days)",
    ),
    "hang timeout infinite": (
        ["--hang-timeout", "inf"],
        {},
        "--hang-timeout='inf' is invalid (not finite): expected a positive number of seconds up to 604800 (7 days)",
    ),
    "hang timeout from its variable": (
        [],
        {"XLARUN_HANG_TIMEOUT": "1e308"},
        "--hang-timeout (from XLARUN_HANG_TIMEOUT)='1e308' is invalid (over 7 days)",
    ),
    "preemption signal without SIG": (
        ["--preemption-signal", "USR1"],
        {},
        "--preemption-signal='USR1' is invalid ('USR1' is no signal name): expected a signal name such as SIGUSR1",
    ),
    "preemption signal no worker can catch": (["--preemption-signal", "SIGKILL"], {}, "SIGKILL cannot be caught"),
    "monitor interval not a number": (["--monitor-interval", "nan"], {}, "--monitor-interval='nan' is invalid"),
    "tee rank of too many digits": (["--tee", "1" * 5000 + ":1"], {}, "--tee='111"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_one_line(case: str) -> None:
    flags, env, expected = BAD_INPUTS[case]
    script = [] if case == "option without its value at the end" else ["train.py"]
    assert expected in refusal(*flags, *script, env=env)


def test_missing_script_is_refused() -> None:
    assert "training_script" in refusal("--nproc_per_node", "2")


def test_summary_file_below_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    assert "is not a directory" in refusal("--summary-file", str(tmp_path / "plain" / "summary.json"), "train.py")


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may add entries to, root included: immutable (``chattr +i``)."""
    directory = tmp_path / "unwritable"
    directory.mkdir()
    os.mkfifo(directory / "m.fifo")
    (directory / "m.prom").symlink_to(tmp_path / "m.prom")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)]).returncode != 0:
        pytest.skip("no chattr +i here (it needs root and a file system that keeps the attribute)")
    yield directory
    subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_a_metrics_fifo_or_device_is_written_in_place_and_a_link_beside_its_target(unwritable: Path) -> None:
    """The directory the path is in matters only where a file is written beside the path's file."""
    for path in (unwritable / "m.fifo", unwritable / "m.prom", Path(os.devnull)):
        assert read_options({"metrics_textfile": str(path)}, {})["metrics_textfile"] == str(path)
    assert "is not writable" in refusal("--metrics-textfile", str(unwritable / "new.prom"), "train.py")
    assert "is not writable" in refusal("--summary-file", str(unwritable / "m.fifo"), "train.py")


def test_help_answers_without_a_command_line() -> None:
    assert parse_command_line(["--help"]) is None


def test_each_row_has_a_unique_dest_and_spellings() -> None:
    spellings = [name for option in OPTIONS for name in option.spellings]
    assert len(spellings) == len(set(spellings))
    assert len(OPTIONS_BY_DEST) == len(OPTIONS)
    assert all(option.help for option in OPTIONS)


def test_every_default_parses_as_its_row_says() -> None:
    values = read_options({}, {})
    assert values["nproc_per_node"] == NprocRequest(count=1)
    assert values["nnodes"] == (1, 1)
    assert values["master_port"] == 29500
    assert values["shutdown_timeout"] == 30.0
    assert values["signals_to_handle"].text == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert values["signals_to_handle"].signals == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    assert values["virtual_local_rank"] is False
    assert values["duplicate_stdout_filters"] is None and values["log_line_prefix_template"] == ""
    assert values["standalone"] is False and values["dry_run"] is False
    assert values["summary_file"] is None


def test_pet_variables_stand_in_for_torchruns_flags_only() -> None:
    pet = {"PET_" + option.dest.upper(): "1" for option in OPTIONS if option.owner != TORCHRUN}
    values = read_options({}, {**pet, "PET_MAX_RESTARTS": "3"})
    assert values["max_restarts"] == 3
    assert values["dry_run"] is False and values["spmd"] is False
    assert values.source("max_restarts") == "--max-restarts (from PET_MAX_RESTARTS)"


def test_a_flag_wins_over_its_variable() -> None:
    values = read_options({"max_restarts": "1"}, {"PET_MAX_RESTARTS": "3"})
    assert (values["max_restarts"], values.source("max_restarts")) == (1, "--max-restarts")


def test_the_scheduler_takes_the_place_of_variables_and_defaults_but_not_of_flags() -> None:
    values = read_options({"node_rank": "1"}, {"PET_NNODES": "3", "PET_MASTER_PORT": "1234"})
    said = {
        "nnodes": ((2, 2), "2", "SLURM_NNODES"),
        "node_rank": (0, "0", "SLURM_NODEID"),
        "master_port": (15020, "15020", "SLURM_JOB_ID, SLURM_STEP_ID"),
        "rdzv_id": ("5.1", "5.1", "SLURM_JOB_ID"),
    }
    scheduled = values.with_scheduler("slurm", said)
    assert [scheduled[dest] for dest in ("nnodes", "node_rank", "master_port", "rdzv_id")] == [(2, 2), 1, 15020, "5.1"]
    assert scheduled.stated("nnodes") == "--nnodes=2 (from --cluster slurm: SLURM_NNODES)"
    assert scheduled.source("master_port") == "--master-port (from --cluster slurm: SLURM_JOB_ID, SLURM_STEP_ID)"
    assert scheduled.stated("node_rank") == "--node-rank=1" and scheduled.given("node_rank") == "1"
    assert scheduled.given("nnodes") is None and scheduled.is_set("nnodes") and scheduled.is_set("rdzv_id")
    # What the scheduler does not say stays as it was read.
    assert scheduled.stated("max_restarts") == "--max-restarts=0" and not scheduled.is_set("max_restarts")
    assert values.stated("nnodes") == "--nnodes=3 (from PET_NNODES)" and values.given("nnodes") is None


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--nproc_per_n=2", "t.py"], (["--nproc_per_node=2"], "t.py", [])),
        (["--nproc-per-n", "2", "t.py", "--x"], (["--nproc-per-node", "2"], "t.py", ["--x"])),
        (["--", "t.py", "a"], ([], "t.py", ["a"])),
        (["t.py", "--", "a"], ([], "t.py", ["a"])),
        (["-r3", "t.py"], (["-r3"], "t.py", [])),
        (["--standalone"], (["--standalone"], None, [])),
    ],
)
def test_split_follows_argparse(argv: list[str], expected: tuple[list[str], str, list[str]]) -> None:
    assert split_command_line(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--nproc_per_n=2", "--standalone", "t.py", "--lr", "3"],
        ["--nproc-per-node", "2", "--nproc_per_node=4", "t.py"],  # the last one given counts
        ["-r3", "-t", "1", "-m", "pkg.train"],
        ["--env", "A=1", "--env=B=2", "--env", "", "t.py"],  # a repeatable flag keeps every value
        ["--rdzv-id=", "--rdzv_id", "-h", "--", "t.py", "--", "x"],  # a value that looks like a flag
        ["--standalone", "--standalone"],
        [],
    ],
)
def test_a_launch_reads_its_options_as_click_reads_them(argv: list[str]) -> None:
    """A plain launch's command line is read without click; click, which answers --help, reads it alike."""
    assert parse_command_line(argv) == parse_with_click(*split_command_line(argv))


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--standalone=1", "t.py"], "Option '--standalone' does not take a value."),
        (["-mx", "t.py"], "No such option '-x'."),
    ],
)
def test_what_only_click_refuses_is_refused_in_its_words(argv: list[str], said: str) -> None:
    with pytest.raises(UsageError, match=re.escape(said)):
        parse_command_line(argv)


def test_worker_count_is_resolved_once_into_the_config() -> None:
    assert prepare("--nproc_per_node", "3", "t.py").config.nproc_per_node == 3
    assert prepare("--nproc_per_node", "cpu", "t.py").config.nproc_per_node == os.cpu_count()
    assert (
        prepare("--spmd", "--nproc_per_node", "auto", "--device", "cpu", "--dry-run", "t.py").config.nproc_per_node == 1
    )


def test_users_own_variables_are_notices_not_prints(capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepare("--dry-run", "--device", "cpu", "--virtual-devices", "4", "t.py", env={"CPU_NUM_DEVICES": "2"})
    assert prepared.notices == (
        "keeping your own CPU_NUM_DEVICES from the environment instead of the values xlarun would set",
    )
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    "store",
    [
        ("--rdzv_backend", "c10d", "--rdzv_endpoint", "10.0.0.1:29400"),
        ("--rdzv_endpoint", "10.0.0.1:29400", "--node_rank", "1"),
    ],
    ids=["c10d", "static endpoint"],
)
def test_a_coordinator_port_is_checked_against_the_master_port_the_run_will_use(store: tuple[str, ...]) -> None:
    """29500 is no master port here: c10d's is picked at the rendezvous, and a static endpoint's
    port is the master port."""
    assert prepare("--nnodes", "2", "--coordinator-port", "29500", *store, "--dry-run", "t.py").config.max_nodes == 2


def test_a_coordinator_port_on_a_static_endpoints_port_is_refused() -> None:
    assert "coordinator port 29400 is the master port" in refusal(
        "--nnodes", "2", "--node_rank", "1", "--rdzv_endpoint", "10.0.0.1:29400", "--coordinator-port", "29400", "t.py"
    )


@pytest.mark.parametrize("dest", [option.dest for option in OPTIONS if option.metavar == "SECONDS"])
def test_every_seconds_flag_takes_the_bound_and_refuses_past_it(dest: str) -> None:
    from xlarun.durations import MAX_SECONDS

    option = OPTIONS_BY_DEST[dest]
    assert option.parse is not None and option.parse(str(MAX_SECONDS)) == MAX_SECONDS
    assert str(MAX_SECONDS) in option.allowed
    for text in (str(MAX_SECONDS + 0.5), "inf", "-inf", "nan", "-1"):
        with pytest.raises(ValueError):
            option.parse(text)


@pytest.mark.parametrize(("host", "word", "count"), [("tpu-v4-vm", "tpu", 4), ("trn1-32xlarge", "neuron", 32)])
def test_a_devices_name_counts_what_auto_counts_there(host: str, word: str, count: int) -> None:
    env = {"XLARUN_HOST_ROOT": str(TESTS / "fixtures" / "hosts" / host)}
    for given in (word, "auto"):
        assert prepare("--dry-run", "--nproc_per_node", given, "train.py", env=env).config.nproc_per_node == count


def test_standalone_runs_get_a_random_uuid4_as_their_id_as_torchrun_gives() -> None:
    run_ids = {prepare("--standalone", "t.py").config.rdzv_id for _ in range(64)}
    assert len(run_ids) == 64
    for run_id in run_ids:
        parsed = uuid.UUID(run_id)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == run_id
