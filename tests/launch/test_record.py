"""``xlarun.record``'s error file read by torch's own reader and by torchrun, in real processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, clean_env, run_torchrun, worker

from xlarun.planning.packages import followed_torchrun


def keys_of(value: object) -> object:
    """The nested key structure of a JSON document."""
    if isinstance(value, dict):
        return {key: keys_of(item) for key, item in value.items()}
    return type(value).__name__


def test_same_file_as_torchs_record(tmp_path: Path) -> None:
    """The worker raising under each decorator, started by hand as a launcher would."""
    written = {}
    for wrapping in ("xlarun", "torch"):
        error_file = tmp_path / f"{wrapping}.json"
        completed = subprocess.run(
            [PYTHON, worker("raises.py"), wrapping],
            capture_output=True,
            text=True,
            env=clean_env({"RANK": "0", "TORCHELASTIC_ERROR_FILE": str(error_file)}),
        )
        assert completed.returncode == 1
        assert "RuntimeError: boom from the worker" in completed.stderr
        written[wrapping] = json.loads(error_file.read_text())
    assert keys_of(written["xlarun"]) == keys_of(written["torch"])
    assert written["xlarun"]["message"]["message"] == written["torch"]["message"]["message"]
    for data in written.values():
        assert data["message"]["extraInfo"]["py_callstack"].endswith("RuntimeError: boom from the worker\n")


@pytest.mark.skipif(
    followed_torchrun() != (2, 9), reason="reads torchrun 2.9's report; later torchruns list the stopped peers too"
)
def test_torchrun_reports_a_traceback_written_by_xlarun_record(port: int) -> None:
    script = worker("raises.py")
    result = run_torchrun("--nproc_per_node", "2", "--master_port", port, script, "xlarun")
    assert result.returncode == 1
    block = result.stderr[result.stderr.index(f"{script} FAILED") :]
    assert "error_file: <N/A>" not in block
    assert "traceback : Traceback (most recent call last):" in block
    assert "  RuntimeError: boom from the worker" in block


def test_record_needs_no_torch() -> None:
    completed = subprocess.run(
        [PYTHON, "-c", "import sys, xlarun; xlarun.record(print); print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert completed.stdout.strip() == "False", completed.stderr
