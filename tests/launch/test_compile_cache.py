"""``--compile-cache DIR`` with real torch_xla on the CPU: a second run finds what the first one wrote.

Two ranks run ``xla_cache.py`` twice with the same DIR. Rank 0, the one writer, misses and writes on the
cold run and finds its entry on the warm one (torch_xla 2.9's CPU client then counts
``PersistentCacheDeserializeFailure`` and compiles again: it cannot load an executable; a TPU loads it).
Rank 1 reads only: the graph only it compiles never reaches the directory. (Whether rank 1 finds the
shared entry depends on timing: on the cold run the writer may not have written it yet, and on the warm
run the writer, which cannot load it on CPU, writes it again meanwhile.) The summary and the event log
count the directory's entries before and after each run. A DIR that cannot be created or written is
refused in one line before anything starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import plan, run_xlarun, worker

pytestmark = pytest.mark.torch_xla


def counters(stdout: str) -> dict[int, dict[str, Any]]:
    """Each rank's JSON line of ``xla_cache.py``, by rank (the lines carry no prefix by default)."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {record["rank"]: record for record in records}


def cache_events(path: Path) -> dict[str, Any]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return {
        event["name"]: event["attributes"]["compile_cache"]
        for event in events
        if "compile_cache" in event["attributes"]
    }


def test_the_second_run_finds_what_the_writer_wrote_and_no_reader_writes(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "new"  # created by the launcher
    runs = []
    for run in ("cold", "warm"):
        summary, events = tmp_path / f"{run}.json", tmp_path / f"{run}.jsonl"
        result = run_xlarun(
            "--standalone",
            "--nproc-per-node",
            "2",
            "--device",
            "cpu",
            "--compile-cache",
            cache,
            "--summary-file",
            summary,
            "--event-log",
            events,
            worker("xla_cache.py"),
        )
        assert result.returncode == 0, result.stderr
        runs.append((counters(result.stdout), json.loads(summary.read_text())["compile_cache"], cache_events(events)))
    (cold, cold_summary, cold_events), (warm, warm_summary, warm_events) = runs
    directory = str(cache)
    assert [cold[rank]["read_only"] for rank in (0, 1)] == ["0", "1"]
    # Cold: the writer misses and writes; the reader misses at least the graph only it compiles (the shared
    # one too, unless the writer wrote it first), and only the writer's graph is kept.
    assert cold[0].get("PersistentCacheMiss") == 1 and cold[1].get("PersistentCacheMiss", 0) >= 1, cold
    entries = sorted(os.listdir(cache / "torch_xla"))
    assert len(entries) == 1, entries
    assert cold_summary == {"directory": directory, "entries_before": 0, "entries_after": 1}
    assert cold_events == {"launch.started": {"directory": directory, "entries": 0}, "launch.finished": cold_summary}
    # Warm: the writer finds its entry (found and loaded, or found and not loadable on CPU) and misses nothing.
    found = warm[0].get("PersistentCacheHit", 0) + warm[0].get("PersistentCacheDeserializeFailure", 0)
    assert found == 1 and "PersistentCacheMiss" not in warm[0], warm
    # The reader misses at least its own graph, which it still does not write. Whether it finds the shared one
    # depends on timing on CPU: the writer, unable to load the entry, compiles and writes it again meanwhile.
    assert warm[1].get("PersistentCacheMiss", 0) >= 1 and warm[1]["values"] == cold[1]["values"], warm
    assert sorted(os.listdir(cache / "torch_xla")) == entries
    assert warm_summary == {"directory": directory, "entries_before": 1, "entries_after": 1}
    assert warm_events["launch.started"] == {"directory": directory, "entries": 1}


@pytest.mark.parametrize("obstacle", ["file", "read-only"])
def test_a_directory_that_cannot_be_created_or_written_is_one_line(tmp_path: Path, obstacle: str) -> None:
    if obstacle == "file":
        (tmp_path / "taken").write_text("")
        cache, said = tmp_path / "taken" / "cache", "cannot create it"
    elif os.geteuid() == 0:
        cache, said = Path("/proc"), "cannot write in it"  # root may write in any directory but /proc's kind
    else:
        cache, said = tmp_path / "locked", "cannot write in it: Permission denied"
        cache.mkdir(mode=0o500)
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_xlarun("--standalone", "--device", "cpu", "--compile-cache", cache, script)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"xlarun: error: --compile-cache {cache}: {said}"), line
    assert not marker.exists()


def test_the_dry_run_shows_every_ranks_cache_variables_and_creates_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    document = plan("--nproc-per-node", "3", "--device", "cpu", "--compile-cache", cache, "train.py")
    assert document["files"]["compile_cache"] == str(cache)
    assert [
        (worker["env"]["XLA_PERSISTENT_CACHE_PATH"], worker["env"]["XLA_PERSISTENT_CACHE_READ_ONLY"])
        for worker in document["workers"]
    ] == [(f"{cache}/torch_xla", "0"), (f"{cache}/torch_xla", "1"), (f"{cache}/torch_xla", "1")]
    assert not cache.exists()
