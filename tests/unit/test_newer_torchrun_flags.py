"""Unit layer: torchrun 2.10 to 2.15's flags, in-process: how they parse, what they plan, what they refuse.

Their refusals of bad values are rows of ``test_options.py``'s BAD_INPUTS; here are their values,
the variables that stand in for them, and the pieces they drive (the worker's contract, the log
plan, the matching-line copy, the signal inbox, the tcsh completion line). The launch layer runs
them for real (``tests/launch/test_newer_torchrun_flags.py``) and against torchrun itself
(``tests/launch/test_parity_newer_torchrun.py``).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
from helpers import prepare

from xlarun import structs
from xlarun.cli.click_command import tcsh_completion
from xlarun.cli.options import OPTIONS, read_options
from xlarun.config import SignalList
from xlarun.exceptions import PlanError
from xlarun.planning.dryrun import plan_document
from xlarun.planning.environment import SIGNALS_VARIABLE, contract_env
from xlarun.ranks import NodeAssignment
from xlarun.supervision.logs import line_prefix, plan_attempt_logs, plan_worker_logs
from xlarun.supervision.relay import MatchingLines, StreamPlan, StreamRelay
from xlarun.supervision.signals import SignalInbox

TPU_HOST = str(Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "tpu-v4-vm")


@pytest.mark.parametrize(
    "spelling, pet, text, dest, expected",
    [
        (
            "--signals-to-handle",
            "PET_SIGNALS_TO_HANDLE",
            "SIGTERM, SIGUSR1",
            "signals_to_handle",
            SignalList((signal.SIGTERM, signal.SIGUSR1), "SIGTERM, SIGUSR1"),
        ),
        (
            "--signals_to_handle",
            "PET_SIGNALS_TO_HANDLE",
            "SIGHUP,,SIGHUP",
            "signals_to_handle",
            SignalList((signal.SIGHUP,), "SIGHUP,,SIGHUP"),
        ),
        ("--shutdown-timeout", "PET_SHUTDOWN_TIMEOUT", "7", "shutdown_timeout", 7.0),
        ("--kill_timeout", "PET_SHUTDOWN_TIMEOUT", "0.5", "shutdown_timeout", 0.5),
        (
            "--duplicate-stdout-filters",
            "PET_DUPLICATE_STDOUT_FILTERS",
            "loss,,acc,step",
            "duplicate_stdout_filters",
            ("loss,acc", "step"),
        ),
        ("--duplicate_stderr_filters", "PET_DUPLICATE_STDERR_FILTERS", "", "duplicate_stderr_filters", ("",)),
        (
            "--log-line-prefix-template",
            "PET_LOG_LINE_PREFIX_TEMPLATE",
            "${rank}| ",
            "log_line_prefix_template",
            "${rank}| ",
        ),
        ("--virtual_local_rank", "PET_VIRTUAL_LOCAL_RANK", "1", "virtual_local_rank", True),
    ],
)
def test_each_new_flag_parses_in_both_spellings_and_from_its_pet_variable(
    spelling: str, pet: str, text: str, dest: str, expected: object
) -> None:
    option = next(option for option in OPTIONS if spelling in option.spellings)
    assert option.dest == dest and pet in option.environment_variables
    given = read_options({dest: text}, {})
    from_environment = read_options({}, {pet: text})
    assert given[dest] == from_environment[dest] == expected
    assert from_environment.source(dest) == f"{option.display_name} (from {pet})"


def test_the_shutdown_grace_is_one_option_with_torchruns_precedence() -> None:
    """The flag (either name), then PET_SHUTDOWN_TIMEOUT, then TORCH_ELASTIC_SHUTDOWN_TIMEOUT, then 30 s."""
    both = {"PET_SHUTDOWN_TIMEOUT": "4", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "9"}
    assert read_options({"shutdown_timeout": "2"}, both)["shutdown_timeout"] == 2.0
    assert read_options({}, both)["shutdown_timeout"] == 4.0
    assert read_options({}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "9"})["shutdown_timeout"] == 9.0
    assert prepare("--kill-timeout", "3", "t.py").config.shutdown_timeout == 3.0
    assert prepare("t.py").config.shutdown_timeout == 30.0


def test_the_prefix_template_flag_wins_and_an_empty_one_leaves_it_to_torchruns_variable() -> None:
    variable = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]"}
    assert (
        prepare("--log-line-prefix-template", "<${rank}>", "t.py", env=variable).config.log_line_prefix_template
        == "<${rank}>"
    )
    assert (
        prepare("--log-line-prefix-template", "", "t.py", env=variable).config.log_line_prefix_template == "[${rank}]"
    )
    assert prepare("t.py").config.log_line_prefix_template is None


def test_the_prefix_substitutes_torchruns_four_macros() -> None:
    config = structs.replace(
        prepare("--role", "trainer", "t.py").config,
        log_line_prefix_template="${hostname}/${role_name}/${rank}/${local_rank}/${other}:",
    )
    assert line_prefix(config, 5, 1) == f"{socket.gethostname()}/trainer/5/1/${{other}}:".encode()
    assert line_prefix(prepare("t.py").config, 5, 1) == b"[default1]:"


def node(local_world_size: int = 2) -> NodeAssignment:
    return NodeAssignment(
        run_id="none",
        node_rank=0,
        nnodes=1,
        local_world_size=local_world_size,
        rank_offset=0,
        world_size=local_world_size,
        master_addr="127.0.0.1",
        master_port=29500,
    )


def test_virtual_local_rank_narrows_cuda_visible_devices_as_torchrun() -> None:
    config = prepare("--virtual-local-rank", "--nproc_per_node", "2", "t.py").config
    plain = contract_env(node(), 1, config=config, environ={}, error_file="e")
    listed = contract_env(node(), 1, config=config, environ={"CUDA_VISIBLE_DEVICES": "4, 6"}, error_file="e")
    assert (plain["LOCAL_RANK"], plain["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert (listed["LOCAL_RANK"], listed["CUDA_VISIBLE_DEVICES"]) == ("0", "6")
    without = contract_env(
        node(), 1, config=prepare("t.py").config, environ={"CUDA_VISIBLE_DEVICES": "4,6"}, error_file="e"
    )
    assert without["LOCAL_RANK"] == "1" and "CUDA_VISIBLE_DEVICES" not in without


@pytest.mark.parametrize(
    "torchrun, expected", [((2, 9), None), ((2, 10), "SIGTERM, SIGUSR1"), ((2, 15), "SIGTERM, SIGUSR1")]
)
def test_workers_get_the_signal_list_from_torchrun_2_10_on(torchrun: tuple[int, int], expected: str | None) -> None:
    config = structs.replace(prepare("--signals-to-handle", "SIGTERM, SIGUSR1", "t.py").config, torchrun=torchrun)
    assert contract_env(node(), 0, config=config, environ={}, error_file="e").get(SIGNALS_VARIABLE) == expected


@pytest.mark.parametrize(
    "device, nproc, refused",
    [
        ("tpu", 4, "torch_xla's xla:// set-up numbers each process"),
        ("neuron", 2, "import torch_xla sets PJRT_LOCAL_PROCESS_RANK"),
        ("cuda", 2, "the XLA:GPU client"),
        ("xpu", 2, "PJRT plugin"),
        ("tpu", 1, None),
        ("cpu", 2, None),
    ],
)
def test_virtual_local_rank_is_refused_where_the_runtime_places_processes_by_local_rank(
    device: str, nproc: int, refused: str | None
) -> None:
    argv = ("--dry-run", "--device", device, "--virtual-local-rank", "--nproc_per_node", str(nproc), "t.py")
    env = {"XLARUN_HOST_ROOT": TPU_HOST} if device == "tpu" else None
    if refused is None:
        prepared = prepare(*argv, env=env)
        workers = plan_document(prepared.config, prepared.device, {}, notices=())["workers"]
        assert {worker["env"]["LOCAL_RANK"] for worker in workers} == {"0"}
        return
    # Refused while the launch is prepared: before the orphan guard or any rendezvous starts.
    with pytest.raises(PlanError, match=refused) as refusal:
        prepare(*argv, env=env)
    assert str(refusal.value).startswith(f"--virtual-local-rank gives each of the {nproc} workers LOCAL_RANK=0")
    assert "\n" not in str(refusal.value)


def test_filtered_files_are_made_per_attempt_and_fed_only_by_streams_the_console_shows(tmp_path: Path) -> None:
    config = prepare(
        "--tee",
        "0:3,1:1,2:0",
        "--local-ranks-filter",
        "0,2",
        "--duplicate-stdout-filters",
        "x",
        "--nproc_per_node",
        "3",
        "t.py",
    ).config
    matching = plan_attempt_logs(config, str(tmp_path), 1)
    assert matching == {1: MatchingLines(str(tmp_path / "attempt_1" / "filtered_stdout.log"), ("x",))}
    assert (tmp_path / "attempt_1" / "filtered_stdout.log").read_bytes() == b""
    assert not (tmp_path / "attempt_1" / "filtered_stderr.log").exists()
    plans = [plan_worker_logs(config, str(tmp_path), 1, rank, rank, matching) for rank in range(3)]
    assert plans[0].stdout.matching == matching[1] and plans[0].stderr.matching is None  # stderr has no filters
    assert plans[1].stdout.matching is None  # tee'd, but the console does not show rank 1
    assert plans[2].stdout.matching is None  # shown, but not tee'd


def relay_with_copy(tmp_path: Path, needles: tuple[str, ...], prefix: bytes = b"[default0]:") -> StreamRelay:
    matching = MatchingLines(str(tmp_path / "filtered_stdout.log"), needles)
    return StreamRelay(StreamPlan(file=str(tmp_path / "stdout.log"), prefix=prefix, relay=True, matching=matching))


def test_the_copy_reads_lines_as_torchruns_text_tail_does(tmp_path: Path) -> None:
    """Universal newlines (a CR split from its LF across reads is one line end), undecodable bytes
    replaced, each matching line behind the prefix, the unended last one written at the end."""
    relay = relay_with_copy(tmp_path, ("loss", "ü"))
    for chunk in (b"loss 1\r", b"\nstep 2 loss", b" 3\rbar\r", b"loss \xff\n", b"\xc3", b"\xbc ok\nlast loss"):
        relay.feed(chunk)
    relay.close()
    assert (tmp_path / "filtered_stdout.log").read_text() == (
        "[default0]:loss 1\n[default0]:step 2 loss 3\n[default0]:loss \ufffd\n[default0]:ü ok\n[default0]:last loss\n"
    )
    assert (tmp_path / "stdout.log").read_bytes().endswith(b"last loss")  # the log file keeps the bytes


def test_an_empty_filter_copies_every_line_as_torchruns_does(tmp_path: Path) -> None:
    """Even the empty ones: so a CRLF split across two reads must not make one more."""
    relay = relay_with_copy(tmp_path, ("",), prefix=b"")
    for chunk in (b"a\r", b"\n\nb\n"):
        relay.feed(chunk)
    relay.close()
    assert (tmp_path / "filtered_stdout.log").read_text() == "a\n\nb\n"


def test_signals_left_out_keep_their_default_action_and_usr1_never_stops() -> None:
    with SignalInbox((signal.SIGHUP, signal.SIGUSR1)) as inbox:
        assert inbox.stop_signals == (signal.SIGHUP,)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # not Python's KeyboardInterrupt
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, signal.SIG_IGN)  # relayed all the same
        os.kill(os.getpid(), signal.SIGUSR1)
        assert inbox.drain() == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_inherited_ignored_stays_ignored_unless_listed() -> None:
    """As torchrun: a listed stop signal is handled even where the launcher was started with it
    ignored (``nohup … &``), and one left out stays ignored."""
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    with SignalInbox((signal.SIGTERM, signal.SIGHUP)) as inbox:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        assert inbox.drain() == [signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_the_tcsh_line_completes_every_spelling_and_the_choices() -> None:
    line = tcsh_completion()
    assert line.startswith("complete xlarun 'c/--/(")
    long_names = line.split("'c/--/(", 1)[1].split(")/'", 1)[0].split()
    assert set(long_names) >= {name[2:] for option in OPTIONS for name in option.spellings if name.startswith("--")}
    assert {"help", "version", "print-completion"} <= set(long_names)
    assert "'n/--device/(auto tpu neuron cuda cpu xpu)/'" in line
    assert "'n/--print-completion/(bash zsh tcsh)/'" in line
    assert "'c/-/(m r t h)/'" in line
