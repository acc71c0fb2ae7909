"""``--rdzv-conf``: checked only where the chosen backend reads a key, and only as torchrun checks it.

torchrun 2.9's static handler reads ``timeout`` (``int()``); its c10d handler reads the
``*_timeout``, ``keep_alive_*``, ``read_timeout`` and ``is_host`` keys and never ``timeout``.
Everything else, however spelt (even with the quotes a shell never stripped), is ignored.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest
from helpers import REPO, prepare, refusal

from xlarun.rdzv_conf import SETTINGS, default_seconds, markdown_table

QUOTED = "'join_timeout=5,last_call_timeout=1,timeout=5'"
"""What a test harness passes when it builds the command line without a shell: the quotes stay."""


def c10d(port: int, nnodes: str = "1") -> list[str]:
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]


@pytest.mark.parametrize("conf", ["timeout=abc", QUOTED, "keep_alive=x,store_type=file", "'is_host=maybe'"])
def test_keys_c10d_does_not_read_are_not_checked(conf: str) -> None:
    # A c10d plan goes through the same checks as a launch, without meeting any node.
    config = prepare("--rdzv-backend", "c10d", "--rdzv-conf", conf, "--dry-run", "t.py").config
    assert config.rdzv_backend == "c10d"


@pytest.mark.parametrize(
    "backend, conf, message",
    [
        ("c10d", "join_timeout=abc", "join_timeout='abc' is invalid: the c10d rendezvous reads it as a positive"),
        ("c10d", "last_call_timeout=0", "last_call_timeout='0'"),
        ("c10d", "read_timeout=-1", "read_timeout='-1'"),
        ("c10d", "is_host=maybe", "is_host='maybe' is invalid: the c10d rendezvous reads it as true or false"),
        ("static", "timeout=abc", "timeout='abc' is invalid: the static rendezvous reads it as a whole number"),
        ("static", "timeout=5'", 'timeout="5\'"'),
    ],
)
def test_a_value_the_backend_reads_is_checked_as_torchrun_checks_it(backend: str, conf: str, message: str) -> None:
    # A master port given: without one, torchrun 2.12 and newer run a lone static node as c10d.
    assert message in refusal(
        "--rdzv-backend", backend, "--rdzv-conf", conf, "--master-port", "29500", "--dry-run", "t.py"
    )


@pytest.mark.parametrize(
    "backend, nnodes, conf, message",
    [
        (
            "c10d",
            "1",
            "read_timeout=99999999",
            "--rdzv-conf read_timeout='99999999' is invalid (over 7 days): expected a "
            "positive number of seconds up to 604800 (7 days)",
        ),
        ("c10d", "1", "keep_alive_interval=0", "keep_alive_interval='0' is invalid: expected a positive number"),
        ("static", "2", "join_timeout=inf", "join_timeout='inf' is invalid (not finite)"),
        ("static", "2", "heartbeat_timeout=nan", "heartbeat_timeout='nan' is invalid (not finite)"),
        ("static", "2", "timeout=99999999", "timeout='99999999' is invalid (over 7 days)"),
    ],
)
def test_seconds_out_of_bounds_are_refused_where_the_rendezvous_reads_them(
    backend: str, nnodes: str, conf: str, message: str
) -> None:
    assert message in refusal(
        "--rdzv-backend",
        backend,
        "--nnodes",
        nnodes,
        "--rdzv-conf",
        conf,
        "--master-port",
        "29500",
        "--dry-run",
        "t.py",
    )


def test_a_lone_static_node_reads_no_rendezvous_seconds_as_torchrun_ignores_them() -> None:
    conf = "join_timeout=inf,heartbeat_timeout=nan,read_timeout=99999999"
    assert prepare("--rdzv-conf", conf, "--master-port", "29500", "--dry-run", "t.py").config.rdzv_conf


def test_the_rendezvous_reads_seconds_within_the_same_bounds() -> None:
    from xlarun.exceptions import UsageError
    from xlarun.rendezvous.store import Timeouts

    assert Timeouts.read({"join_timeout": "604800"}, 600).join == 604800
    with pytest.raises(UsageError, match=r"join_timeout='604801' is invalid \(over 7 days\)"):
        Timeouts.read({"join_timeout": "604801"}, 600)


@pytest.mark.parametrize("conf", ["a=1,", "a", "=1", "a= "])
def test_every_item_needs_a_key_and_a_value_as_in_torchrun(conf: str) -> None:
    assert "is not key=value" in refusal("--rdzv-conf", conf, "t.py")


@pytest.mark.parametrize("conf", ["is_host=t", "is_host=N", "is_host=Yes"])
def test_is_host_takes_torchs_words(conf: str) -> None:
    assert prepare("--rdzv-backend", "c10d", "--rdzv-conf", conf, "--dry-run", "t.py").config.rdzv_conf


def test_read_timeout_bounds_an_unanswered_store_call_and_is_checked_where_read() -> None:
    from xlarun.exceptions import UsageError
    from xlarun.rendezvous.store import Timeouts

    assert Timeouts.read({}, 600).call == 30
    assert Timeouts.read({"read_timeout": "4"}, 600).call == 4
    with pytest.raises(UsageError, match="read_timeout='0' is invalid: expected a positive number of seconds"):
        Timeouts.read({"read_timeout": "0"}, 600)


def test_every_setting_is_in_the_help_with_its_default() -> None:
    # The real command's help, as click renders and wraps it.
    help_text = subprocess.run(
        [sys.executable, "-m", "xlarun", "--help"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    text = " ".join(help_text.split())
    missing = [
        setting.key
        for setting in SETTINGS
        if not re.search(rf"(?<![\w-]){setting.key} \({re.escape(setting.default)}[,)]", text)
    ]
    assert missing == []
    assert f"{SETTINGS[-1].meaning}. Other keys are ignored." in text


def test_the_rendezvous_reads_its_defaults_from_the_table() -> None:
    from xlarun.rendezvous.store import Timeouts, conf_seconds

    assert Timeouts.read({}) == Timeouts(
        join=default_seconds("join_timeout"),
        heartbeat=default_seconds("heartbeat_timeout"),
        close=default_seconds("close_timeout"),
        call=default_seconds("read_timeout"),
    )
    assert conf_seconds({}, "timeout") == default_seconds("timeout")
    with pytest.raises(KeyError):
        default_seconds("token")


def test_every_key_torchrun_checks_is_in_the_table_under_its_backend() -> None:
    from xlarun.planning.rules import RDZV_CONF_READ

    checked = {(backend, key) for backend, keys in RDZV_CONF_READ.items() for key in keys}
    listed = {(backend, setting.key) for setting in SETTINGS for backend in setting.backends}
    assert sorted(checked - listed) == []


def table_rows(lines: list[str]) -> list[list[str]]:
    """The cells of a markdown table's rows, its header and its rule among them."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def manual_tables() -> dict[str, list[list[str]]]:
    """Each table of ``--rdzv-conf`` keys in the manual (README.md and the pages under docs/), by page and line.

    A table counts as one where its header is the one :func:`xlarun.rdzv_conf.markdown_table` writes,
    wherever the page that holds it stands.
    """
    header = table_rows(markdown_table().splitlines()[:1])[0]
    found = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.lstrip().startswith("|") and table_rows([line])[0] == header:
                table = itertools.takewhile(lambda row: row.lstrip().startswith("|"), lines[number:])
                found[f"{page.relative_to(REPO)}:{number + 1}"] = table_rows(list(table))
    return found


def test_the_manuals_table_of_keys_is_the_one_in_the_code() -> None:
    tables = manual_tables()
    assert len(tables) == 1, (
        f"the manual should hold one table of --rdzv-conf keys, as xlarun.rdzv_conf."
        f"markdown_table() writes it; found {sorted(tables) or 'none'}"
    )
    assert next(iter(tables.values())) == table_rows(markdown_table().splitlines())
