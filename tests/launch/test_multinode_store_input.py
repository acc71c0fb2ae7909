"""What another program writes to the job's store is untrusted input: a value xlarun did not write is
ignored or named, escaped, and the job's own ends (a node lost, a worker's exit code) come through.

Two static nodes on 127.0.0.1 run shell workers that only sleep; rank 1 exits 3 once told to
(``go`` in the test's ``out_dir``). The test writes its garbage with torch's TCPStore client, from
a process of its own, once both workers run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import files_exist, finish, read_until, slack_s, wait_for
from multinode import HOST, Nodes, both, lines, static

RUN_ID = "job"
# What a stray or hostile client might leave: words that are not UTF-8 and carry escape sequences that
# would retitle and clear a terminal, a failure and a stacks record that are no JSON. The refusal count is one more than the job saw, so the store's host reads the refusal.
GARBAGE = {
    "xlarun/refused": b"1",
    "xlarun/refused/last": b"\xff\xfe\x1b]0;owned\x07\x1b[2J",
    f"xlarun/{RUN_ID}/attempt_0/failure": b"\xff{not json",
    f"xlarun/{RUN_ID}/attempt_0/stacks/1": b"[1, 2",
}
WORKER = [
    "--no-python",
    "sh",
    "-c",
    'touch "$0/started.$RANK"; while [ ! -e "$0/go" ]; do sleep 0.05; done; [ "$RANK" = 1 ] && exit 3; sleep 600',
]


def write_garbage(port: int) -> None:
    script = (
        "import datetime, sys\n"
        "from torch.distributed import TCPStore\n"
        f"store = TCPStore({HOST!r}, {port}, None, False, datetime.timedelta(seconds=10))\n"
        f"for key, value in {GARBAGE!r}.items():\n"
        "    store.set(key, value)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def start_two_nodes(nodes: Nodes, out_dir: Path, port: int) -> list[subprocess.Popen]:
    agents = [
        nodes.start(
            *static(port, node_rank, 2, 1), "--rdzv_id", RUN_ID, "--rdzv_conf", "heartbeat_timeout=3", *WORKER, out_dir
        )
        for node_rank in (0, 1)
    ]
    wait_for(files_exist(out_dir / "started.0", out_dir / "started.1"), "both workers to start")
    write_garbage(port)
    return agents


def test_garbage_in_the_store_leaves_a_lost_node_noticed_within_the_heartbeat_timeout(
    nodes: Nodes, out_dir: Path, port: int
) -> None:
    agents = start_two_nodes(nodes, out_dir, port)
    assert agents[0].stderr is not None
    refused = read_until(agents[0].stderr, "xlarun: refused an agent: ")  # the store's host read the stray's words
    os.kill(agents[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    run = finish(agents[0])
    took = time.monotonic() - killed
    agents[1].communicate()
    run = run._replace(stderr=refused + run.stderr)

    assert took < 3 + slack_s(1), f"{took:.1f} s from the loss to the exit\n{run.stderr}"
    assert run.returncode == 1, run.stderr
    assert lines(run)[-1] == (
        f"xlarun: node 1 ({socket.getfqdn()}) stopped responding: no heartbeat for 3 s "
        "(its launcher is gone, or its host stopped or was cut off)"
    ), run.stderr
    # The stray's words are shown, escaped: nothing reaches the terminal raw.
    assert r"xlarun: refused an agent: \xff\xfe\x1b]0;owned\x07\x1b[2J" in lines(run), run.stderr
    assert "\x1b" not in run.stderr and "\x07" not in run.stderr


def test_garbage_in_the_store_leaves_the_real_root_cause_and_its_exit_code(
    nodes: Nodes, out_dir: Path, port: int
) -> None:
    agents = start_two_nodes(nodes, out_dir, port)
    (out_dir / "go").touch()
    runs = nodes.finish_all(agents)

    assert [run.returncode for run in runs] == [3, 3], both(runs)
    for run in runs:
        root_cause = run.stderr.split("Root Cause (first observed failure):", 1)[-1]
        assert "rank      : 1 (local_rank: 0)" in root_cause, both(runs)
        assert "exitcode  : 3 " in root_cause, both(runs)
        assert "internal error" not in run.stderr, both(runs)


@pytest.fixture(autouse=True)
def _garbage_is_what_it_says() -> None:
    assert all(isinstance(value, bytes) for value in GARBAGE.values())
