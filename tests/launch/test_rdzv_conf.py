"""``--rdzv-conf``: checked only where the chosen backend reads a key, and only as torchrun checks it.

torchrun 2.9's static handler reads ``timeout`` (``int()``); its c10d handler reads the
``*_timeout``, ``keep_alive_*``, ``read_timeout`` and ``is_host`` keys and never ``timeout``.
Everything else, however spelt (even with the quotes a shell never stripped), is ignored: here a
real c10d launch runs with such keys (the checks themselves: ``tests/unit/test_rdzv_conf.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import free_port, run_xlarun, worker

QUOTED = "'join_timeout=5,last_call_timeout=1,timeout=5'"
"""What a test harness passes when it builds the command line without a shell: the quotes stay."""


def c10d(port: int, nnodes: str = "1") -> list[str]:
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]


@pytest.mark.parametrize("conf", ["timeout=abc", QUOTED])
def test_c10d_runs_with_keys_it_never_reads(conf: str, tmp_path: Path) -> None:
    # The quoted form is torchrun's own test_launch_elastic: the key read is last_call_timeout=1;
    # "'join_timeout" and timeout="5'" are not keys c10d reads.
    nnodes = "1:2" if conf == QUOTED else "1"
    result = run_xlarun(
        *c10d(free_port(), nnodes),
        "--nproc-per-node",
        "2",
        "--rdzv-conf",
        conf,
        worker("dump_env.py"),
        env={"DUMP_DIR": str(tmp_path)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0_0.json", "1_0.json"]
