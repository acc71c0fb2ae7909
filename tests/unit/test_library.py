"""xlarun.launch()'s parts that start nothing: the options as the command line gives them, which functions
travel by reference, and that importing xlarun loads no launcher until launch is touched."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from helpers import REPO

from xlarun import structs
from xlarun.cli.options import read_options
from xlarun.failures import FailureRecord
from xlarun.launching.library import describe_failure, given_options, importable_by_name, is_descriptor


def test_options_are_the_command_lines_text() -> None:
    given = given_options(
        {
            "nproc_per_node": 4,
            "standalone": True,
            "monitor_interval": 0.5,
            "tee": None,
            "local_ranks_filter": [0, 2],
            "rdzv_conf": {"join_timeout": 60, "read_timeout": 5},
        }
    )
    assert given == {
        "nproc_per_node": "4",
        "standalone": "1",
        "monitor_interval": "0.5",
        "local_ranks_filter": "0,2",
        "rdzv_conf": "join_timeout=60,read_timeout=5",
    }
    values = read_options(given, {})
    assert values["nproc_per_node"].count == 4 and values["standalone"] is True
    assert values["rdzv_conf"] == {"join_timeout": "60", "read_timeout": "5"}
    assert given_options({"standalone": False}) == {"standalone": "0"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nproc_pre_node": 2}, "unknown option nproc_pre_node= (xlarun.launch takes the command line's options"),
        ({"standalone": 1}, "--standalone is a switch: give standalone=True or False, not 1"),
    ],
)
def test_an_option_the_table_lacks_or_a_switch_given_a_value_is_refused(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        given_options(options)
    assert str(refused.value).startswith(message)


def module_level() -> int:
    return 0


def test_only_a_function_found_by_its_module_and_name_travels_by_reference() -> None:
    def local() -> int:
        return 0

    assert importable_by_name(module_level)
    assert importable_by_name(os.path.join)
    assert not importable_by_name(local)
    assert not importable_by_name(lambda: 0)


def test_a_stream_object_is_no_descriptor() -> None:
    assert not is_descriptor(io.StringIO(), 1)
    with open(os.devnull, "w") as handle:
        assert is_descriptor(handle, handle.fileno()) and not is_descriptor(handle, handle.fileno() + 1)


def test_importing_xlarun_loads_no_launcher_until_launch_is_touched() -> None:
    code = (
        "import sys, xlarun\n"
        "before = sorted(m for m in sys.modules\n"
        "                if m.startswith(('xlarun.cli', 'xlarun.launching', 'xlarun.supervision')))\n"
        "xlarun.launch\n"
        "print(before, 'xlarun.launching.library' in sys.modules, 'torch' in sys.modules)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    assert loaded == ["[]", "True", "False"]


@pytest.mark.parametrize(
    ("traceback", "message"),
    [
        (None, "rank 1 on h1 exited with code 3"),
        (
            "Traceback (most recent call last):\n  ...\nValueError: bad\n",
            "rank 1 on h1 exited with code 3: ValueError: bad",
        ),
        ("loading\nout of disk", "rank 1 on h1 exited with code 3: out of disk"),
    ],
)
def test_a_failure_is_told_by_what_the_worker_left_and_nothing_where_it_left_nothing(
    traceback: str | None, message: str
) -> None:
    """A worker that ended with ``os._exit(3)`` and wrote nothing has no traceback: its record holds the
    report's placeholder, which the one line leaves out."""
    record = FailureRecord(rank=1, local_rank=1, returncode=3, pid=4711, time=0.0, host="h1")
    if traceback is not None:
        record = structs.replace(record, traceback=traceback)
    assert describe_failure(record) == message
