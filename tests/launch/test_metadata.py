"""``--cluster tpu-vm`` against a metadata server that misbehaves: one deadline for the whole exchange,
a cap on what it sends, no redirect followed, every value checked; each refusal one line, exit 2,
nothing started. The server is the stub of ``tests/metadata.py``, on 127.0.0.1."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import run_xlarun
from metadata import HANGING_NAME, REDIRECT_TARGET, Behaviour, hanging_lookup, serve_metadata, slice_attributes

from xlarun.host.metadata import DEADLINE_S

IPS = ["10.130.0.2", "10.130.0.3"]
# The launcher's own start-up and exit, on a loaded machine, beyond the deadline.
START_AND_EXIT_S = 10


def refused(served_host: str, **env: str) -> tuple[str, float]:
    """The one line a dry run of ``--cluster tpu-vm`` refuses with, and how long it took; ``env`` adds to
    its environment."""
    started = time.monotonic()
    run = run_xlarun("--cluster", "tpu-vm", "--dry-run", "t.py", env={"GCE_METADATA_HOST": served_host, **env})
    took = time.monotonic() - started
    assert run.returncode == 2, run
    assert run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    return run.stderr, took


@pytest.mark.parametrize("behaviour", ["drip", "endless"])
def test_a_server_that_never_finishes_is_one_line_within_the_deadline(behaviour: Behaviour) -> None:
    with serve_metadata(slice_attributes(1, IPS), behaviour) as served:
        line, took = refused(served.host)
    assert took < DEADLINE_S + START_AND_EXIT_S, took
    assert line.startswith("xlarun: error: --cluster tpu-vm: ") and f"metadata server at {served.host}" in line, line


def test_a_name_whose_lookup_never_ends_is_one_line_within_the_deadline(tmp_path: Path) -> None:
    with hanging_lookup(tmp_path) as aliases:
        line, took = refused(HANGING_NAME, HOSTALIASES=aliases)
    assert took < DEADLINE_S + START_AND_EXIT_S, took
    assert line.startswith(
        f"xlarun: error: --cluster tpu-vm: the metadata server's name {HANGING_NAME} did not "
        f"resolve within {DEADLINE_S:g} s; "
    ), line


@pytest.mark.parametrize(
    ("host", "said"),
    [
        # .invalid never resolves (RFC 6761); a resolver without a name server says so in other words.
        ("xlarun-nowhere.invalid:8080", "the metadata server's name xlarun-nowhere.invalid does not resolve ("),
        ("xlarun..invalid", "GCE_METADATA_HOST='xlarun..invalid' is not host[:port]"),
    ],
)
def test_a_name_that_does_not_resolve_is_one_line_naming_it(host: str, said: str) -> None:
    line, _ = refused(host)
    assert line.startswith(f"xlarun: error: --cluster tpu-vm: {said}"), line
    assert "Errno" not in line, line


def test_a_redirect_is_not_followed() -> None:
    with serve_metadata(slice_attributes(1, IPS), "redirect") as served:
        line, _ = refused(served.host)
    assert "answered 302 for agent-worker-number" in line, line
    assert REDIRECT_TARGET not in [path for path, _ in served.requests]


@pytest.mark.parametrize(
    ("attribute", "value", "said"),
    [
        ("worker-network-endpoints", "w0:u0:127.0.0.1 --evil,w1:u1:10.130.0.3", "is not a list of <name>:<uid>:<ip>"),
        ("worker-network-endpoints", "w0:u0:10.130.0.2,w1:u1:-oProxyCommand=x", "is not a list of <name>:<uid>:<ip>"),
        ("agent-worker-number", "9" * 5000, "agent-worker-number="),
        ("tpu-env", "ACCELERATOR_TYPE: '\x1b]0;owned\x07v4-16'\n", "tpu-env's ACCELERATOR_TYPE="),
        ("tpu-env", "HOST_BOUNDS: '1,1,2 --evil'\n", "tpu-env's HOST_BOUNDS="),
        ("agent-worker-number", "\udcff1", "agent-worker-number"),
    ],
)
def test_a_hostile_value_is_refused_in_one_line(attribute: str, value: str, said: str) -> None:
    with serve_metadata({**slice_attributes(1, IPS), attribute: value}) as served:
        line, _ = refused(served.host)
    assert line.startswith("xlarun: error: --cluster tpu-vm: ") and said in line, line
    assert "\x1b" not in line and "\x07" not in line and len(line) < 400, line
