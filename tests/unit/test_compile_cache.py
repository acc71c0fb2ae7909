"""``--compile-cache``'s variables, pure functions of the plan: each runtime's own, and one torch_xla writer
per directory. (``tests/launch/test_compile_cache.py`` runs torch_xla on them.)"""

from __future__ import annotations

import pytest

from xlarun import structs
from xlarun.cli.options import read_options
from xlarun.exceptions import UsageError
from xlarun.host.cachedir import count_entries, prepare_cache_directory
from xlarun.ranks import NodeAssignment
from xlarun.runtimes import CompileCache, XlaOptions, apply_user_precedence, xla_env
from xlarun.runtimes.torchtpu import TpuSlice, tier2_name

CACHE_VARIABLES = {
    "XLA_PERSISTENT_CACHE_PATH",
    "XLA_PERSISTENT_CACHE_READ_ONLY",
    "NEURON_COMPILE_CACHE_URL",
    "TORCH_TPU_TIER2_COMPILATION_CACHE",
    "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT",
    "TORCH_NEURONX_NEFF_CACHE_DIR",
}


def node(node_rank: int, nnodes: int = 2, nproc: int = 4) -> NodeAssignment:
    return NodeAssignment.single_node("job", nproc, "10.0.0.1", 29500, node_rank=node_rank, nnodes=nnodes)


def cache_variables(options: XlaOptions, assignment: NodeAssignment, local_rank: int) -> dict[str, str]:
    return {name: value for name, value in xla_env(options, assignment, local_rank).items() if name in CACHE_VARIABLES}


@pytest.mark.parametrize("device", ["cpu", "tpu", "cuda", "xpu"])
def test_torch_xla_has_one_writer_in_the_job_by_default(device: str) -> None:
    options = XlaOptions(device, "pjrt", compile_cache=CompileCache("/cache"))
    read_only = {
        (rank, local): cache_variables(options, node(rank), local)["XLA_PERSISTENT_CACHE_READ_ONLY"]
        for rank in (0, 1)
        for local in range(4)
    }
    assert [place for place, value in read_only.items() if value == "0"] == [(0, 0)]
    assert cache_variables(options, node(1), 3) == {
        "XLA_PERSISTENT_CACHE_PATH": "/cache/torch_xla",
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
    }


def test_each_nodes_own_directory_has_its_local_rank_0_as_writer() -> None:
    options = XlaOptions("tpu", "pjrt", compile_cache=CompileCache("/cache", "node"))
    writers = [
        (rank, local)
        for rank in (0, 1)
        for local in range(4)
        if cache_variables(options, node(rank), local)["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"
    ]
    assert writers == [(0, 0), (1, 0)]


def test_neuron_under_torch_xla_gets_the_compilers_cache_too() -> None:
    options = XlaOptions("neuron", "pjrt", compile_cache=CompileCache("/fsx/c"))
    assert cache_variables(options, node(1), 2) == {
        "XLA_PERSISTENT_CACHE_PATH": "/fsx/c/torch_xla",
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
        "NEURON_COMPILE_CACHE_URL": "/fsx/c/neuron",
    }


def test_torchtpu_gets_its_tier_2_name_and_tier_3_root_on_every_rank() -> None:
    options = XlaOptions("tpu", "torchtpu", tpu_slice=TpuSlice(chip="0x005e"), compile_cache=CompileCache("/c"))
    one_host = structs.replace(
        NodeAssignment.single_node("job", 4, "127.0.0.1", 29500), worker_ports=(40000, 40001, 40002, 40003)
    )
    planned = [cache_variables(options, one_host, local) for local in range(4)]
    assert (
        planned
        == [
            {
                "TORCH_TPU_TIER2_COMPILATION_CACHE": tier2_name("/c"),
                "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "/c/torchtpu",
            }
        ]
        * 4
    )
    assert tier2_name("/c") == tier2_name("/c/") != tier2_name("/d")
    assert tier2_name("/c").startswith("xlarun-") and "/" not in tier2_name("/c")


def test_torchneuron_gets_its_neff_cache() -> None:
    options = XlaOptions("neuron", "torchneuron", compile_cache=CompileCache("/c"))
    assert cache_variables(options, node(0), 0) == {"TORCH_NEURONX_NEFF_CACHE_DIR": "/c/torchneuron"}


def test_xrt_and_no_cache_get_none() -> None:
    assert cache_variables(XlaOptions("cpu", "xrt", compile_cache=CompileCache("/c")), node(0), 0) == {}
    assert cache_variables(XlaOptions("cpu", "pjrt"), node(0), 0) == {}


def test_the_users_own_cache_variable_wins_with_a_line() -> None:
    planned = xla_env(XlaOptions("cpu", "pjrt", compile_cache=CompileCache("/c")), node(0), 0)
    kept, notices = apply_user_precedence(planned, {"XLA_PERSISTENT_CACHE_PATH": "/mine"})
    assert "XLA_PERSISTENT_CACHE_PATH" not in kept and kept["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"
    assert notices == [
        "keeping your own XLA_PERSISTENT_CACHE_PATH from the environment instead of the values xlarun would set"
    ]


def test_the_option_makes_the_directory_absolute_and_refuses_what_is_not_one(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    values = read_options({"compile_cache": "cache"}, {})
    assert (values["compile_cache"], values["compile_cache_writers"]) == (str(tmp_path / "cache"), "job")
    assert (
        read_options({}, {"XLARUN_COMPILE_CACHE": "/c", "XLARUN_COMPILE_CACHE_WRITERS": "node"})[
            "compile_cache_writers"
        ]
        == "node"
    )
    for text, why in [("", "empty"), ("gs://bucket/c", "a URL")]:
        with pytest.raises(
            UsageError, match=rf"^--compile-cache='{text}' is invalid \({why}\): expected a local directory$"
        ):
            read_options({"compile_cache": text}, {})
    with pytest.raises(UsageError, match="expected one of job, node$"):
        read_options({"compile_cache_writers": "all"}, {})


def test_the_directory_is_made_and_its_files_counted_at_any_depth(tmp_path) -> None:
    root = tmp_path / "a" / "b"
    assert count_entries(str(root)) == 0
    prepare_cache_directory(str(root))
    assert root.is_dir() and list(root.iterdir()) == []  # the probe leaves nothing
    (root / "torch_xla").mkdir()
    (root / "torch_xla" / "1234").write_text("x")
    (root / "neuron" / "MODULE_1").mkdir(parents=True)
    (root / "neuron" / "MODULE_1" / "model.neff").write_text("x")
    assert count_entries(str(root)) == 2
