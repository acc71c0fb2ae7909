"""Slurm host list expansion: Slurm's documented forms, checked against what `scontrol show hostnames` prints."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from xlarun.exceptions import UsageError
from xlarun.planning.hostlist import MAX_HOSTS_PER_RANGE, expand_hostlist, first_host

# What Slurm 22.05's `scontrol show hostnames` prints for each list.
SLURM_EXPANSIONS = [
    ("trn001", ["trn001"]),
    ("login,trn7", ["login", "trn7"]),
    ("trn[001-004,010]", ["trn001", "trn002", "trn003", "trn004", "trn010"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[8-011]", ["n8", "n9", "n10", "n11"]),
    ("n[1-010]", ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"]),
    ("n[007]", ["n007"]),
    ("n[9-10]", ["n9", "n10"]),
    ("n[1-3,2]", ["n1", "n2", "n3", "n2"]),
    ("[1-3]", ["1", "2", "3"]),
    ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
    ("a[1,3]-b[2,4-5]", ["a1-b2", "a1-b4", "a1-b5", "a3-b2", "a3-b4", "a3-b5"]),
    ("rack[1-2]_n[01-02]", ["rack1_n01", "rack1_n02", "rack2_n01", "rack2_n02"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("n[1-2],m[5]", ["n1", "n2", "m5"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("x,y z\tw", ["x", "y", "z", "w"]),
    ("n1,,n2", ["n1", "n2"]),
    (",n1", ["n1"]),
    ("n[1-2],", ["n1", "n2"]),
    ("gpu-a[01-02]-ib[1-2]", ["gpu-a01-ib1", "gpu-a01-ib2", "gpu-a02-ib1", "gpu-a02-ib2"]),
    ("", []),
    (" , ", []),
]

# Lists Slurm refuses, and lists whose meaning Slurm only reaches by accident of its C parsing.
MALFORMED = [
    ("n[1-3]x", "text after its last range"),
    ("n[1-2]-x,m", "text after its last range"),
    ("unit[0-31]rack", "text after its last range"),
    ("n[3-1]", "runs backwards"),
    ("n[]", "is not a number"),
    ("n[1,,2]", "is not a number"),
    ("n[a-b]", "is not a number"),
    ("n[-2]", "is not a number"),
    ("n[1-2-3]", "is not a number"),
    ("n[1--2]", "is not a number"),
    ("n[0x1-3]", "is not a number"),
    ("n[1-]", "is not a number"),
    ("n[ 1-2]", "is not a number"),
    ("n[+1-2]", "is not a number"),
    ("n[１-2]", "is not a number"),
    ("n[1-2", "never closed"),
    ("n1-2]", "without its '['"),
    ("n[1-2]]", "without its '['"),
    ("n[[1-2]", "ranges do not nest"),
    (f"a[0-{MAX_HOSTS_PER_RANGE}]", "Slurm's limit"),
]
SLURM_REFUSES = [
    "n[1-3]x",
    "n[1-2]-x,m",
    "n[3-1]",
    "n[]",
    "n[1,,2]",
    "n[a-b]",
    "n[-2]",
    "n[1-2-3]",
    "n[0x1-3]",
    "n[1-2]]",
    f"a[0-{MAX_HOSTS_PER_RANGE}]",
]


@pytest.mark.parametrize("text, hosts", SLURM_EXPANSIONS)
def test_expands_like_slurm(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, hosts", [case for case in SLURM_EXPANSIONS if case[1]])
def test_first_host_is_the_first_expanded_host(text, hosts):
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize("text, reason", MALFORMED)
def test_malformed_lists_are_refused_with_the_reason(text, reason):
    with pytest.raises(UsageError, match=re.escape(reason)):
        expand_hostlist(text)
    with pytest.raises(UsageError, match=re.escape(reason)):
        first_host(text)


def test_first_host_checks_the_whole_list():
    with pytest.raises(UsageError, match="runs backwards"):
        first_host("trn[001-004],trn[9-3]")


def test_first_host_of_an_empty_list_is_refused():
    with pytest.raises(UsageError, match="names no host"):
        first_host(" ,")


def test_a_range_of_slurms_largest_size_is_accepted():
    hosts = expand_hostlist(f"a[0-{MAX_HOSTS_PER_RANGE - 1}]")
    assert len(hosts) == MAX_HOSTS_PER_RANGE
    assert hosts[-1] == f"a{MAX_HOSTS_PER_RANGE - 1}"


def test_first_host_does_not_expand_the_list():
    # 65536**3 names: expanding them would exhaust memory long before an answer came.
    assert first_host("a[0-65535]b[0-65535]c[00000-65535],z") == "a0b0c00000"


def scontrol_hostnames(config, text):
    scontrol = shutil.which("scontrol")
    assert scontrol is not None, "the callers skip where Slurm's scontrol is not installed"
    shown = subprocess.run(
        [scontrol, "show", "hostnames", text],
        capture_output=True,
        text=True,
        env={"SLURM_CONF": str(config)},
        check=True,
    )
    return None if "Invalid hostlist" in shown.stdout + shown.stderr else shown.stdout.split()


def test_agrees_with_scontrol(tmp_path):
    if shutil.which("scontrol") is None:
        # scripts/test.sh installs slurm-client where it can; under CI a missing scontrol is a failure.
        (pytest.fail if os.environ.get("CI") else pytest.skip)("Slurm's scontrol is not installed")
    # scontrol needs a configuration to start, not a running cluster, to expand host lists.
    config = tmp_path / "slurm.conf"
    config.write_text(
        "ClusterName=hostlists\nSlurmctldHost=localhost\nNodeName=h1 CPUs=1\nPartitionName=p Nodes=h1 Default=YES\n"
    )
    for text, hosts in SLURM_EXPANSIONS:
        if hosts:
            assert scontrol_hostnames(config, text) == hosts, text
    for text in SLURM_REFUSES:
        assert scontrol_hostnames(config, text) is None, text
