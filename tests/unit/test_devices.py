"""Device detection on fake host trees (tests/fixtures/hosts and trees built in tmp_path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TESTS

from xlarun.exceptions import UsageError
from xlarun.host import devices

HOSTS = TESTS / "fixtures" / "hosts"


def host(name: str) -> str:
    return str(HOSTS / name)


def add_pci_device(root: Path, slot: str, vendor: str, device: str) -> None:
    entry = root / "sys" / "bus" / "pci" / "devices" / slot
    entry.mkdir(parents=True)
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text(device + "\n")


def add_dev_nodes(root: Path, *names: str) -> None:
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / "dev" / name).touch()


@pytest.mark.parametrize(
    "name, device, units",
    [
        ("tpu-v4-vm", "tpu", 4),
        ("trn1-32xlarge", "neuron", 32),
        ("trn2-48xlarge", "neuron", 64),
        ("inf2-xlarge", "neuron", 2),
        ("nvidia-8gpu", "cuda", 8),
        ("nvidia-container", "cuda", 2),
        ("gce-cpu-vm", "cpu", None),
    ],
)
def test_auto_finds_the_hosts_device_and_its_units(name, device, units):
    assert devices.resolve_device("auto", {}, host(name)) == device
    assert devices.local_unit_count(device, host(name)) == units


def test_googles_network_card_is_not_a_tpu():
    # Same PCI vendor as a TPU chip (0x1ae0) but the gVNIC device id.
    assert devices.tpu_chip_count(host("gce-cpu-vm")) == 0
    assert devices.tpu_chip_count(host("tpu-v4-vm")) == 4


def test_nvidia_control_nodes_are_not_gpus():
    assert devices.nvidia_gpu_count(host("nvidia-container")) == 2


def test_empty_host_is_cpu_and_has_no_accelerator_units(tmp_path):
    assert devices.resolve_device("auto", {}, str(tmp_path)) == "cpu"
    for device in ("tpu", "neuron", "cuda"):
        assert devices.local_unit_count(device, str(tmp_path)) == 0
    assert devices.local_unit_count("xpu", str(tmp_path)) is None


def test_probe_order_is_tpu_then_neuron_then_nvidia(tmp_path):
    add_dev_nodes(tmp_path, "nvidia0")
    assert devices.resolve_device("auto", {}, str(tmp_path)) == "cuda"
    add_dev_nodes(tmp_path, "neuron0")
    assert devices.resolve_device("auto", {}, str(tmp_path)) == "neuron"
    add_pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0063")
    assert devices.resolve_device("auto", {}, str(tmp_path)) == "tpu"


@pytest.mark.parametrize(
    "pjrt_device, device",
    [
        ("TPU", "tpu"),
        ("NEURON", "neuron"),
        ("CUDA", "cuda"),
        ("GPU", "cuda"),
        ("CPU", "cpu"),
        ("XPU", "xpu"),
        ("cpu", "cpu"),
        ("TPU_LEGACY", "tpu"),
    ],
)
def test_auto_follows_pjrt_device_over_the_hardware(pjrt_device, device):
    assert devices.resolve_device("auto", {"PJRT_DEVICE": pjrt_device}, host("tpu-v4-vm")) == device


def test_unknown_pjrt_device_is_a_usage_error():
    with pytest.raises(UsageError, match="PJRT_DEVICE=FPGA"):
        devices.resolve_device("auto", {"PJRT_DEVICE": "FPGA"}, host("gce-cpu-vm"))


def test_explicit_device_is_kept_whatever_the_host_has():
    assert devices.resolve_device("neuron", {"PJRT_DEVICE": "TPU"}, host("tpu-v4-vm")) == "neuron"


def test_pci_entries_may_be_symlinks_as_in_real_sysfs(tmp_path):
    real = tmp_path / "real"
    add_pci_device(real, "0000:00:05.0", "0x1ae0", "0x006f")
    linked = tmp_path / "host" / "sys" / "bus" / "pci" / "devices"
    linked.mkdir(parents=True)
    os.symlink(real / "sys" / "bus" / "pci" / "devices" / "0000:00:05.0", linked / "0000:00:05.0")
    assert devices.tpu_chip_count(str(tmp_path / "host")) == 1


@pytest.mark.parametrize("device_id, generation", [("0x005e", 4), ("0x0063", 5), ("0x006f", 6), ("0x0076", 7)])
def test_tpu_generation_from_pci_ids(tmp_path, device_id, generation):
    add_pci_device(tmp_path, "0000:00:04.0", "0x1ae0", device_id)
    assert devices.tpu_generation(str(tmp_path)) == generation


def test_tpu_generation_unknown_without_chips():
    assert devices.tpu_generation(host("gce-cpu-vm")) is None


def test_host_root_defaults_to_slash_and_follows_the_variable():
    assert devices.host_root({}) == "/"
    assert devices.host_root({"XLARUN_HOST_ROOT": host("trn1-32xlarge")}) == host("trn1-32xlarge")


@pytest.mark.parametrize(
    "device, name", [("tpu", "TPU"), ("neuron", "NEURON"), ("cuda", "CUDA"), ("cpu", "CPU"), ("xpu", "XPU")]
)
def test_pjrt_device_names(device, name):
    assert devices.pjrt_device_name(device) == name


def test_launcher_side_modules_do_not_import_torch():
    code = (
        "import sys, xlarun.host.devices, xlarun.planning.packages, xlarun.runtimes; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_xla')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
