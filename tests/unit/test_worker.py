"""Worker side in-process: the launcher's marker, and the words for a split world.

``tests/launch/test_worker.py`` has real workers join the process group under torch_xla on CPU.
"""

from __future__ import annotations

from xlarun.worker import RUNTIME_VIEW, TORCH_VIEW, describe_split, is_launched


def test_is_launched_reads_the_launchers_marker(monkeypatch):
    monkeypatch.delenv("XLARUN_LAUNCHED", raising=False)
    assert not is_launched()
    monkeypatch.setenv("XLARUN_LAUNCHED", "1")
    assert is_launched()


def test_describe_split_accepts_matching_views():
    views = {TORCH_VIEW: (3, 8), RUNTIME_VIEW: (3, 8)}
    assert describe_split(3, 8, views, "TPU", spmd=False) is None


def test_describe_split_names_the_cpu_client_when_each_process_is_alone():
    message = describe_split(1, 4, {RUNTIME_VIEW: (0, 1)}, "CPU", spmd=False)
    assert message is not None
    assert message.startswith("PJRT's CPU client has no cross-process collectives")
    assert "each of the 4 processes" in message
    assert "--spmd --virtual-devices" in message


def test_describe_split_names_the_disagreeing_view_and_the_launchers_numbers():
    message = describe_split(5, 16, {TORCH_VIEW: (5, 16), RUNTIME_VIEW: (5, 32)}, "TPU", spmd=False)
    assert message is not None
    assert "RANK=5 WORLD_SIZE=16" in message
    assert "the XLA runtime reports rank 5 of 32" in message
    assert "\n" not in message


def test_describe_split_points_spmd_at_one_process_per_node():
    message = describe_split(0, 8, {RUNTIME_VIEW: (0, 2)}, "TPU", spmd=True)
    assert message is not None
    assert "under SPMD each node runs one process" in message
