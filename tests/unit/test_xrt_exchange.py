"""XRT lists in torch_xla 1.13's formats, built in-process; ``tests/launch/test_xrt_exchange.py`` has real
workers build them through a real TCPStore."""

from __future__ import annotations

import pytest

from xlarun.worker import xrt

GPU_MAP_OF_THREE = (
    "GPU:0;/job:localservice/replica:0/task:0/device:XLA_GPU:0|"
    "GPU:1;/job:localservice/replica:0/task:1/device:XLA_GPU:0|"
    "GPU:2;/job:localservice/replica:0/task:2/device:XLA_GPU:0"
)


def test_device_map_uses_one_xla_device_per_task():
    assert xrt.format_xrt_device_map(3, "GPU") == GPU_MAP_OF_THREE
    assert xrt.format_xrt_device_map(2, "cpu") == (
        "CPU:0;/job:localservice/replica:0/task:0/device:XLA_CPU:0|"
        "CPU:1;/job:localservice/replica:0/task:1/device:XLA_CPU:0"
    )


def test_device_map_refuses_kinds_configured_otherwise():
    with pytest.raises(ValueError, match="TPU"):
        xrt.format_xrt_device_map(2, "TPU")


def test_workers_list_numbers_tasks_in_rank_order():
    assert xrt.format_xrt_workers(["node-a:40001", "node-a:40002", "[fd00::2]:40001"]) == (
        "localservice:0;grpc://node-a:40001|localservice:1;grpc://node-a:40002|localservice:2;grpc://[fd00::2]:40001"
    )


def test_device_kind_is_read_from_the_multiprocessing_device():
    assert xrt.device_kind("GPU:7") == "GPU"
    assert xrt.device_kind("cpu:0") == "CPU"


def test_lists_are_needed_only_by_list_described_xrt_workers_without_them():
    assert xrt.needs_xrt_lists({"XRT_MULTI_PROCESSING_DEVICE": "GPU:1"})
    assert not xrt.needs_xrt_lists({})
    assert not xrt.needs_xrt_lists({"XRT_MULTI_PROCESSING_DEVICE": "TPU:1"})
    assert not xrt.needs_xrt_lists(
        {
            "XRT_MULTI_PROCESSING_DEVICE": "GPU:1",
            "XRT_WORKERS": "localservice:0;grpc://h:1",
            "XRT_DEVICE_MAP": "GPU:0;/job:localservice/replica:0/task:0/device:XLA_GPU:0",
        }
    )


def test_installed_torch_xla_has_no_xrt():
    assert not xrt.torch_xla_has_xrt()
