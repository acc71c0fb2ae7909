"""``xlarun.record`` writes torchrun's error-file JSON, in-process; ``tests/launch/test_record.py`` has
torch's own reader and torchrun read it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import xlarun


def keys_of(value: object) -> object:
    """The nested key structure of a JSON document."""
    if isinstance(value, dict):
        return {key: keys_of(item) for key, item in value.items()}
    return type(value).__name__


def test_record_writes_torchruns_error_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    @xlarun.record
    def main() -> None:
        raise RuntimeError("boom")

    before = int(time.time())
    with pytest.raises(RuntimeError, match="boom"):
        main()
    after = int(time.time())
    data = json.loads(error_file.read_text())
    assert keys_of(data) == {"message": {"message": "str", "extraInfo": {"py_callstack": "str", "timestamp": "str"}}}
    assert data["message"]["message"] == "RuntimeError: boom"
    callstack = data["message"]["extraInfo"]["py_callstack"]
    assert callstack.startswith("Traceback (most recent call last):")
    assert callstack.endswith("RuntimeError: boom\n")
    assert before <= int(data["message"]["extraInfo"]["timestamp"]) <= after


def test_record_passes_results_and_clean_exits_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    @xlarun.record
    def returns(value: int) -> int:
        return value * 2

    @xlarun.record
    def exits(code: object) -> None:
        raise SystemExit(code)

    assert returns(21) == 42
    assert returns.__name__ == "returns"
    assert exits(0) is None and exits(None) is None
    with pytest.raises(SystemExit) as stopped:
        exits(3)
    assert stopped.value.code == 3
    assert not error_file.exists()


def test_record_without_a_launcher_only_reraises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)

    @xlarun.record
    def main() -> None:
        raise ValueError("plain")

    with pytest.raises(ValueError, match="plain"):
        main()
    assert list(tmp_path.iterdir()) == []


def test_torchs_reader_understands_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    @xlarun.record
    def main() -> None:
        raise KeyError("missing shard")

    with pytest.raises(KeyError):
        main()
    data = json.loads(error_file.read_text())
    failure = ProcessFailure(local_rank=0, pid=os.getpid(), exitcode=1, error_file=str(error_file))
    assert failure.message == data["message"]
    assert failure.timestamp == int(data["message"]["extraInfo"]["timestamp"])
    report = ChildFailedError("train.py", {0: failure}).format_msg()
    assert f"error_file: {error_file}" in report
    assert "  KeyError: 'missing shard'" in report


@pytest.mark.parametrize(
    "message",
    [
        ["a", "list"],
        42,
        None,
        {"message": "boom", "extraInfo": "not a dict"},
        {"message": "boom", "extraInfo": {"timestamp": [1]}},
    ],
    ids=["list", "number", "null", "extra not a dict", "timestamp not a number"],
)
def test_an_error_file_of_any_shape_is_read_without_failing(tmp_path: Path, message: object) -> None:
    """A worker may write anything under ``message``; the report still comes, with what it wrote."""
    from xlarun.contract import read_error_file

    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": message}))
    record = read_error_file(str(path))
    assert record is not None
    assert record.message == (message["message"] if isinstance(message, dict) else json.dumps(message))
    assert record.timestamp == os.path.getmtime(path)
