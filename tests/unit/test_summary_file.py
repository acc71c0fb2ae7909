"""--summary-file writes to whatever the path is, as --metrics-textfile does: a regular file is replaced whole, a
link's file is replaced and the link stays, a FIFO or a device node is written in place, never replaced."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from xlarun.supervision.report import write_summary_file

RECORD = {"result": "succeeded", "exit_code": 0}


def test_a_regular_file_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old\n")
    write_summary_file(str(path), RECORD)
    assert json.loads(path.read_text()) == RECORD
    assert os.listdir(tmp_path) == ["summary.json"]


def test_through_a_link_the_file_it_names_is_replaced_and_the_link_stays(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("old.json", "new.json"):  # a link to a file, and one to a file not there yet
        if name == "old.json":
            (elsewhere / name).write_text("old\n")
        link = tmp_path / name
        link.symlink_to(elsewhere / name)
        write_summary_file(str(link), RECORD)
        assert link.is_symlink() and os.readlink(link) == str(elsewhere / name)
        assert json.loads((elsewhere / name).read_text()) == RECORD
    assert sorted(os.listdir(elsewhere)) == ["new.json", "old.json"]


def test_a_fifo_is_written_in_place_whole_to_its_reader(tmp_path: Path) -> None:
    path = tmp_path / "summary.fifo"
    os.mkfifo(path)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(path.read_bytes()))
    reader.start()
    opened = False
    for _ in range(10_000):  # the reader's open may come after this thread's first try
        try:
            write_summary_file(str(path), RECORD)
            opened = True
            break
        except OSError:
            threading.Event().wait(0.01)
    reader.join(timeout=60)
    assert opened and json.loads(read[0]) == RECORD
    assert stat.S_ISFIFO(os.stat(path).st_mode) and os.listdir(tmp_path) == ["summary.fifo"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node (mknod) needs root")
def test_a_device_node_stays_the_device_it_is(tmp_path: Path) -> None:
    """A node of /dev/null (1, 3), made where root may write as /dev is to root."""
    path = tmp_path / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    write_summary_file(str(path), RECORD)
    assert stat.S_ISCHR(os.stat(path).st_mode) and os.stat(path).st_rdev == os.makedev(1, 3)
    assert os.listdir(tmp_path) == ["null"]
