"""Every class of bad input: exit 2, one line on stderr saying what is wrong, nothing started.

Each launch names ``marker.py`` as the worker: the marker file it would create must not
exist afterwards.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conftest import launcher_frames, run_xlarun, worker

# (launcher flags before the script, PET_* or other variables, text the error line must hold)
BAD_INPUTS = {
    "nnodes three fields": (["--nnodes", "1:2:3"], {}, "--nnodes='1:2:3'"),
    "nnodes zero": (["--nnodes", "0"], {}, "0 < MIN <= MAX"),
    "nnodes min above max": (["--nnodes", "3:2"], {}, "0 < MIN <= MAX"),
    "nnodes not a number": (["--nnodes", "two"], {}, "--nnodes='two'"),
    "nnodes range with static rendezvous": (["--nnodes", "1:2"], {}, "--rdzv-backend=c10d"),
    "nproc zero": (["--nproc_per_node", "0"], {}, "--nproc-per-node='0'"),
    "nproc negative": (["--nproc_per_node", "-2"], {}, "--nproc-per-node='-2'"),
    "nproc word": (["--nproc_per_node", "many"], {}, "auto, cpu or gpu"),
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
    "rendezvous endpoint": (["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1"], {}, "[addr]:port"),
    "rendezvous conf": (["--rdzv-conf", "timeout"], {}, "key=value"),
    "start method": (["--start-method", "thread"], {}, "spawn, fork, forkserver"),
    "numa binding": (["--numa-binding", "everywhere"], {}, "node, socket"),
    "logs specs": (["--logs-specs", "fancy"], {}, "--logs-specs='fancy'"),
    "kill timeout negative": (["--kill-timeout", "-1"], {}, "--kill-timeout='-1'"),
    "kill timeout word": (["--kill-timeout", "soon"], {}, "--kill-timeout='soon'"),
    "kill timeout infinite": (["--kill-timeout", "inf"], {}, "--kill-timeout='inf'"),
    "summary file is a directory": (["--summary-file", "/"], {}, "--summary-file='/'"),
    "unknown option": (["--nproc_per_node", "1", "--turbo"], {}, "--turbo"),
    "unknown short option": (["-x"], {}, "-x"),
    "ambiguous prefix": (["--no"], {}, "--no-python"),
    "flag given a value": (["--standalone=1"], {}, "--standalone"),
    "module with no-python": (["-m", "--no-python"], {}, "'--no-python' flag and the '--module' flag"),
    "run-path with module": (["--run-path", "-m"], {}, "--run-path"),
    "standalone with several nodes": (["--standalone", "--nnodes", "2"], {}, "--standalone"),
    "bad PET value": ([], {"PET_NPROC_PER_NODE": "lots"}, "PET_NPROC_PER_NODE"),
    "bad PET boolean": ([], {"PET_STANDALONE": "yes"}, "PET_STANDALONE"),
    "bad PET nnodes": ([], {"PET_NNODES": "1:2:3"}, "PET_NNODES"),
}


def assert_refused(result, marker: Path, expected: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("xlarun: error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr and not launcher_frames(result.stderr)
    assert result.stdout == ""
    assert not marker.exists(), "a worker ran"


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_one_line(tmp_path: Path, case: str) -> None:
    flags, env, expected = BAD_INPUTS[case]
    marker = tmp_path / "marker"
    result = run_xlarun(*flags, worker("marker.py"), marker, env=env, cwd=tmp_path)
    assert_refused(result, marker, expected)


def test_missing_script_argument(tmp_path: Path) -> None:
    result = run_xlarun("--nproc_per_node", "2", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "training_script")


def test_option_without_its_value(tmp_path: Path) -> None:
    result = run_xlarun("--nproc_per_node", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "--nproc_per_node: expected one argument")


def test_script_that_does_not_exist(tmp_path: Path) -> None:
    result = run_xlarun("--nproc_per_node", "2", "no_such_script.py", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "no_such_script.py")


def test_no_python_command_that_does_not_exist(tmp_path: Path) -> None:
    result = run_xlarun("--no-python", "no-such-command-anywhere", cwd=tmp_path)
    assert_refused(result, tmp_path / "marker", "no-such-command-anywhere")


def test_log_dir_that_is_a_file(tmp_path: Path) -> None:
    log_file = tmp_path / "logs"
    log_file.write_text("")
    marker = tmp_path / "marker"
    result = run_xlarun("--log-dir", log_file, "--master_port", "0", worker("marker.py"), marker)
    assert_refused(result, marker, "--log-dir")


def test_summary_file_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    marker = tmp_path / "marker"
    result = run_xlarun("--summary-file", tmp_path / "plain" / "summary.json", "--master_port", "0",
                        worker("marker.py"), marker)
    assert_refused(result, marker, "is not a directory")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_taken_master_port_names_the_port_and_the_ways_out(tmp_path: Path, host: str) -> None:
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = tmp_path / "marker"
        result = run_xlarun("--nproc_per_node", "2", "--master_port", port, worker("marker.py"), marker)
    assert_refused(result, marker, str(port))
    assert "--master_port" in result.stderr and "--standalone" in result.stderr


@pytest.mark.skipif(any(name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev")),
                    reason="this host has NVIDIA GPUs, so --nproc-per-node=gpu is valid")
def test_nproc_gpu_on_a_host_without_gpus(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run_xlarun("--nproc_per_node", "gpu", worker("marker.py"), marker)
    assert_refused(result, marker, "gpu")
