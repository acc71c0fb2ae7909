"""XRT lists: real workers building them through a real TCPStore (the formats: ``tests/unit/test_xrt_exchange.py``)."""

from __future__ import annotations

import re

from direct import json_report, run_workers
from helpers import free_port

from xlarun.worker import xrt

BUILD_LISTS = """
import json, os
from xlarun.worker import xrt
xrt.configure_xrt_worker()
print(json.dumps({name: os.environ[name] for name in ("XRT_WORKERS", "XRT_DEVICE_MAP")}))
"""

GPU_MAP_OF_THREE = (
    "GPU:0;/job:localservice/replica:0/task:0/device:XLA_GPU:0|"
    "GPU:1;/job:localservice/replica:0/task:1/device:XLA_GPU:0|"
    "GPU:2;/job:localservice/replica:0/task:2/device:XLA_GPU:0"
)


def assert_identical_correct_lists(results, world_size):
    reports = [json_report(result) for result in results]
    assert all(report == reports[0] for report in reports), reports
    entries = reports[0]["XRT_WORKERS"].split("|")
    assert len(entries) == world_size
    ports = []
    for rank, entry in enumerate(entries):
        match = re.fullmatch(rf"localservice:{rank};grpc://127\.0\.0\.1:(\d+)", entry)
        assert match, entry
        ports.append(match.group(1))
    assert len(set(ports)) == world_size, "two workers share one gRPC address"
    assert reports[0]["XRT_DEVICE_MAP"] == xrt.format_xrt_device_map(world_size, "GPU")


def test_three_workers_build_identical_lists_through_rank_zeros_store():
    results = run_workers(
        ["-c", BUILD_LISTS], nproc=3, env_for_rank=lambda rank: {"XRT_MULTI_PROCESSING_DEVICE": f"GPU:{rank}"}
    )
    for result in results:
        assert result.returncode == 0, result.stderr
    assert_identical_correct_lists(results, 3)
    assert json_report(results[0])["XRT_DEVICE_MAP"] == GPU_MAP_OF_THREE


def test_workers_of_a_restarted_attempt_use_the_launchers_store():
    import torch.distributed as dist

    port = free_port()
    # Served here, as the launcher's agent would: a worker that tried to serve
    # the port itself would fail to bind it.
    _agent_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    results = run_workers(
        ["-c", BUILD_LISTS],
        nproc=2,
        master_port=port,
        agent_store=True,
        restart_count=1,
        env_for_rank=lambda rank: {"XRT_MULTI_PROCESSING_DEVICE": f"GPU:{rank}"},
    )
    for result in results:
        assert result.returncode == 0, result.stderr
    assert_identical_correct_lists(results, 2)
