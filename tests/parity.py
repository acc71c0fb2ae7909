"""What the parity tests share: the same invocation under torchrun and xlarun, and the contract compared.

- ``launch_both(tmp_path, args, env)``: runs ``args`` under each launcher from the same cwd with
  ``tests/workers/dump_env.py``-style workers writing to ``$DUMP_DIR``; returns the dumps of each.
- ``assert_same_contract(torchrun, xlarun)``: every worker got the same argv, command line, cwd
  and environment, but for values random by design and the documented differences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import run_torchrun, run_xlarun

# What xlarun adds for the XLA runtime (the device layer's job), absent under torchrun.
XLA_ADDITIONS = re.compile(r"^(PJRT_|XLA_|XRT_|TPU_|NEURON_|CPU_NUM_DEVICES$|XLARUN_)")
RANDOM_BY_DESIGN = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "DUMP_DIR")


def launch_both(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[dict, dict]:
    """Run the invocation under each launcher from the same cwd; the dumps keyed by file name."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    dumps = {}
    for name, run in (("torchrun", run_torchrun), ("xlarun", run_xlarun)):
        dump_dir = tmp_path / name
        dump_dir.mkdir()
        result = run(*args, env={**env, "DUMP_DIR": str(dump_dir)}, cwd=work)
        assert result.returncode == 0, f"{name} {args} failed:\n{result.stderr}"
        dumps[name] = {path.name: json.loads(path.read_text()) for path in sorted(dump_dir.glob("*.json"))}
    return dumps["torchrun"], dumps["xlarun"]


def assert_same_contract(torchrun: dict, xlarun: dict, also_random: tuple[str, ...] = ()) -> None:
    assert torchrun, "torchrun's workers wrote nothing"
    assert sorted(xlarun) == sorted(torchrun), "different workers (rank_restart) ran"
    for name, expected in torchrun.items():
        got = xlarun[name]
        for key in ("argv", "command_line", "cwd", "executable"):
            assert got[key] == expected[key], f"{name}: {key}"
        expected_env = {k: v for k, v in expected["env"].items() if k not in RANDOM_BY_DESIGN + also_random}
        got_env = {k: v for k, v in got["env"].items() if k not in RANDOM_BY_DESIGN + also_random}
        added = {k for k in got_env.keys() - expected_env.keys() if XLA_ADDITIONS.match(k)}
        assert {k: got_env[k] for k in got_env.keys() - added} == expected_env, name
        assert expected["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert got["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert_error_file_shape(got["env"], expected["env"])


def assert_error_file_shape(xlarun_env: dict, torchrun_env: dict) -> None:
    """``<log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/error.json`` under both.

    The local rank is the worker's place on its node, which ``--virtual-local-rank`` hides from
    ``LOCAL_RANK`` (0 everywhere there); one node's workers are numbered from its first rank on.
    """
    local_rank = int(torchrun_env["RANK"]) - int(torchrun_env["GROUP_RANK"]) * int(torchrun_env["LOCAL_WORLD_SIZE"])
    tail = f"/attempt_{torchrun_env['TORCHELASTIC_RESTART_COUNT']}/{local_rank}/error.json"
    for env in (xlarun_env, torchrun_env):
        path = env["TORCHELASTIC_ERROR_FILE"]
        assert path.endswith(tail), path
        run_dir = Path(path[: -len(tail)]).name
        assert run_dir.startswith(env["TORCHELASTIC_RUN_ID"] + "_"), path
