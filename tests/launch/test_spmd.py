"""SPMD on CPU: one process with four virtual devices trains a model wrapped in FSDPv2."""

from __future__ import annotations

import itertools
import math
import re

import pytest
from direct import json_report, run_workers

pytestmark = pytest.mark.torch_xla

SPMD_CPU = {"CPU_NUM_DEVICES": "4", "XLARUN_SPMD": "1"}


def test_fsdpv2_trains_with_parameters_sharded_over_four_devices():
    [result] = run_workers(["examples/spmd_fsdp.py", "--steps", "4"], nproc=1, env_for_rank=lambda rank: SPMD_CPU)
    assert result.returncode == 0, result.stderr
    report = json_report(result)

    assert report["devices"] == 4
    losses = report["losses"]
    assert len(losses) == 4
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses

    shardings = report["shardings"]
    assert shardings["_orig_module.0.weight"] == "{devices=[4,1]0,1,2,3}"
    for name, spec in shardings.items():
        tiles = re.fullmatch(r"\{devices=\[([\d,]+)\]0,1,2,3\}", spec)
        assert tiles, f"{name} is not tiled over devices 0-3: {spec}"
        assert math.prod(int(count) for count in tiles.group(1).split(",")) == 4, f"{name} is partly replicated: {spec}"
